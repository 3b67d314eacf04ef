//! The team's certificate authorities (crate::team_ca): each row holds an
//! authority's certificate in the clear and its key sealed under the team
//! key, which the database never sees. One row is `current` (it issues);
//! `trusted` ones are still accepted (after a rotation, or an authority a
//! daemon had before the team's); `retired` ones are refused for good.

use super::db::{Engine, args};
use super::{Store, StoreError, now_ms};

/// What an authority is to the team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthorityState {
    Current,
    Trusted,
    Retired,
}

impl AuthorityState {
    fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "current" => Ok(Self::Current),
            "trusted" => Ok(Self::Trusted),
            "retired" => Ok(Self::Retired),
            other => Err(StoreError::Column {
                index: 4,
                why: format!("unknown authority state `{other}`"),
            }),
        }
    }
}

/// One authority as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAuthority {
    pub generation: i64,
    /// The SHA-256 of its certificate (DER), hex.
    pub fingerprint: String,
    pub cert: String,
    pub sealed_key: String,
    pub state: AuthorityState,
}

/// An authority to add: its certificate and its sealed key.
#[derive(Debug, Clone, Copy)]
pub struct NewAuthority<'a> {
    pub fingerprint: &'a str,
    pub cert: &'a str,
    pub sealed_key: &'a str,
}

/// Why a retirement was not made.
#[derive(Debug, thiserror::Error)]
pub enum RetireError {
    #[error("the team's authorities changed meanwhile (a rotation, or one added): look again")]
    Changed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a rotation was not made.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("the team's authority changed meanwhile (another rotation): look again")]
    Changed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Every authority of the team, oldest first.
    pub fn team_authorities(&self) -> Result<Vec<StoredAuthority>, StoreError> {
        self.db
            .rows(
                "SELECT generation, fingerprint, cert, sealed_key, state FROM team_authorities ORDER BY generation",
                args![],
            )?
            .iter()
            .map(|row| {
                Ok(StoredAuthority {
                    generation: row.get(0)?,
                    fingerprint: row.get(1)?,
                    cert: row.get(2)?,
                    sealed_key: row.get(3)?,
                    state: AuthorityState::parse(&row.get::<String>(4)?)?,
                })
            })
            .collect()
    }

    /// Adds `new` as the team's first authority unless the team has one:
    /// an insert only one daemon can make (generation 1, and the one
    /// `current` row, are unique). True when this call made it.
    pub fn create_team_authority(&self, new: NewAuthority<'_>) -> Result<bool, StoreError> {
        let made = self.db.execute(
            "INSERT INTO team_authorities (generation, fingerprint, cert, sealed_key, state, created_at)
             VALUES (1, ?1, ?2, ?3, 'current', ?4) ON CONFLICT DO NOTHING",
            args![new.fingerprint, new.cert, new.sealed_key, now_ms()],
        )?;
        Ok(made == 1)
    }

    /// Adds `new` as trusted but not issuing (a daemon's authority from
    /// before the team's), unless the team knows it already (a retired one
    /// stays retired). True when this call added it.
    pub fn add_trusted_authority(&self, new: NewAuthority<'_>) -> Result<bool, StoreError> {
        self.db.transaction(|tx| {
            let known = tx.row(
                "SELECT 1 FROM team_authorities WHERE fingerprint = ?1",
                args![new.fingerprint],
            )?;
            if known.is_some() {
                return Ok(false);
            }
            let made = tx.execute(
                "INSERT INTO team_authorities (generation, fingerprint, cert, sealed_key, state, created_at)
                 SELECT COALESCE(MAX(generation), 0) + 1, ?1, ?2, ?3, 'trusted', ?4 FROM team_authorities WHERE true
                 ON CONFLICT DO NOTHING",
                args![new.fingerprint, new.cert, new.sealed_key, now_ms()],
            )?;
            Ok(made == 1)
        })
    }

    /// Makes `new` the current authority in place of generation `from`,
    /// which stays trusted. Only if `from` is still current: of two
    /// rotations at once, one is made and the other is `Changed`.
    /// `demoted_key` is `from`'s key sealed anew for its new state.
    pub fn rotate_team_authority(
        &self,
        from: i64,
        demoted_key: &str,
        new: NewAuthority<'_>,
    ) -> Result<i64, RotateError> {
        let rotated = self.db.transaction(|tx| {
            let demoted = tx.execute(
                "UPDATE team_authorities SET state = 'trusted', sealed_key = ?2
                 WHERE generation = ?1 AND state = 'current'",
                args![from, demoted_key],
            )?;
            if demoted == 0 {
                return Ok(None);
            }
            let next: i64 = tx
                .one(
                    "SELECT COALESCE(MAX(generation), 0) + 1 FROM team_authorities",
                    args![],
                )?
                .get(0)?;
            tx.execute(
                "INSERT INTO team_authorities (generation, fingerprint, cert, sealed_key, state, created_at)
                 VALUES (?1, ?2, ?3, ?4, 'current', ?5)",
                args![next, new.fingerprint, new.cert, new.sealed_key, now_ms()],
            )?;
            Ok(Some(next))
        })?;
        rotated.ok_or(RotateError::Changed)
    }

    /// Retires every authority but the current one, and revokes the agent
    /// certificates they issued (an open connection with one is closed at
    /// its next line). Only while `current` (the fingerprint and sealed key
    /// the caller opened with the team key) is still the current row: it
    /// is locked for the transaction. A retired row's sealed key is
    /// overwritten with its retirement (`retirements`, by fingerprint:
    /// sealed by the caller under the team key), so no edit of its state
    /// makes it open again and only the team's key holders retire; a
    /// trusted row in `skipped` (the caller found it does not open with
    /// the team key) is left as it is; a trusted row in neither (added
    /// meanwhile) changes nothing: look again. Returns the fingerprints retired now, and the certificates
    /// revoked.
    pub fn retire_team_authorities(
        &self,
        current: &StoredAuthority,
        retirements: &std::collections::BTreeMap<String, String>,
        skipped: &std::collections::BTreeSet<String>,
    ) -> Result<(Vec<String>, usize), RetireError> {
        let retired = self.db.transaction(|tx| {
            let lock = match tx.engine() {
                Engine::Postgres => " FOR UPDATE",
                Engine::Sqlite => "",
            };
            let sql = format!(
                "SELECT 1 FROM team_authorities WHERE state = 'current'
                 AND generation = ?1 AND fingerprint = ?2 AND sealed_key = ?3{lock}"
            );
            let still = tx.row(
                &sql,
                args![current.generation, current.fingerprint.as_str(), current.sealed_key.as_str()],
            )?;
            if still.is_none() {
                return Ok(None);
            }
            let fingerprints = tx
                .rows(
                    "SELECT fingerprint FROM team_authorities WHERE state = 'trusted' ORDER BY generation",
                    args![],
                )?
                .iter()
                .map(|row| row.get::<String>(0))
                .collect::<Result<Vec<_>, _>>()?;
            let Some(sealed) = fingerprints
                .iter()
                .filter(|f| !skipped.contains(*f))
                .map(|f| retirements.get(f).map(|s| (f, s)))
                .collect::<Option<Vec<_>>>()
            else {
                return Ok(None);
            };
            let fingerprints: Vec<String> = sealed.iter().map(|(f, _)| (*f).clone()).collect();
            let at = now_ms();
            for (fingerprint, retirement) in sealed {
                tx.execute(
                    "UPDATE team_authorities SET state = 'retired', sealed_key = ?2, retired_at = ?3
                     WHERE state = 'trusted' AND fingerprint = ?1",
                    args![fingerprint.as_str(), retirement.as_str(), at],
                )?;
            }
            let mut revoked = tx.execute(
                "DELETE FROM agent_certs WHERE authority IN
                 (SELECT fingerprint FROM team_authorities WHERE state = 'retired')",
                args![],
            )?;
            // Recorded before the team's authority (no authority noted):
            // a current authority made by a rotation (generation > 1)
            // issued none of them, so their issuer is retired now or was
            // never the team's.
            if current.generation > 1 {
                revoked += tx.execute("DELETE FROM agent_certs WHERE authority IS NULL", args![])?;
            }
            Ok(Some((fingerprints, revoked)))
        })?;
        retired.ok_or(RetireError::Changed)
    }

    /// Records the address this daemon's TLS listener is reached at.
    pub fn set_tls_address(&self, address: Option<&str>) -> Result<(), StoreError> {
        self.db.execute(
            "UPDATE daemons SET tls_address = ?2 WHERE id = ?1",
            args![self.seat.daemon_id, address],
        )?;
        Ok(())
    }
}
