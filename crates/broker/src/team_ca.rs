//! The team's certificate authority, held in the state database so that
//! every daemon of the team trusts the same relays and issues for them:
//! a relay reaches whichever daemon runs its agent now with the
//! certificate it has. The key is sealed under the team key
//! (crate::team_key), which only the team's daemons are given.
//!
//! - The first daemon with a team key makes the authority (an insert only
//!   one can make); the others load it. A daemon that had an authority of
//!   its own (`STATE_DIR/tls/ca.key`) offers it as the team's first, or,
//!   when the team has one already, adds it as trusted: the certificates
//!   it issued keep working until `team ca retire`.
//! - An authority is trusted only when its sealed key opens with the team
//!   key: a row written by anyone without the key (another team's daemon
//!   on a database of the same name, a hand-edited dump) is not trusted.
//! - `rotate` makes a new current authority; the old one stays trusted
//!   (the overlap) until `retire`, which also revokes its certificates.

use std::path::Path;

use crate::store::{AuthorityState, NewAuthority, Store, StoreError, StoredAuthority};
use crate::team_key::{TeamKey, TeamKeyError};
use crate::tls::{Authority, Ca, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum TeamCaError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] TeamKeyError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the team's current authority (generation {0}): {1}")]
    Current(i64, String),
    #[error("the team has no current authority (made by another daemon meanwhile?): try again")]
    NoCurrent,
    #[error(transparent)]
    Rotate(#[from] crate::store::RotateError),
    #[error(transparent)]
    Retire(#[from] crate::store::RetireError),
    #[error("{0}: {1}")]
    Local(String, std::io::Error),
    #[error("not a fingerprint (64 lowercase hex digits): {0:?}")]
    NotAFingerprint(String),
}

/// What the sealed key is bound to: the authority's certificate and its
/// state, so a row's state edited by a database writer does not open.
fn context(fingerprint: &str, state: AuthorityState) -> String {
    let state = match state {
        AuthorityState::Current => "current",
        AuthorityState::Trusted => "trusted",
        AuthorityState::Retired => "retired",
    };
    format!("substrat-sandbox team authority {fingerprint} {state}")
}

/// What a retired row holds in place of its key: the retirement itself,
/// sealed under the team key for the row's fingerprint and the retired
/// state. A row a database writer marked retired holds none (its sealed
/// key is the trusted or current state's): no daemon notes it.
const RETIREMENT: &[u8] = b"retired";

fn retirement(key: &TeamKey, fingerprint: &str) -> Result<String, TeamKeyError> {
    key.seal(RETIREMENT, &context(fingerprint, AuthorityState::Retired))
}

/// Whether a row's retirement was sealed by a holder of `key`.
fn retired_by_team(key: &TeamKey, row: &StoredAuthority) -> bool {
    row.state == AuthorityState::Retired
        && crate::tls::is_fingerprint(&row.fingerprint)
        && key
            .unseal(
                &row.sealed_key,
                &context(&row.fingerprint, AuthorityState::Retired),
            )
            .is_ok_and(|plain| plain == RETIREMENT)
}

fn sealed(key: &TeamKey, ca: &Ca, state: AuthorityState) -> Result<String, TeamKeyError> {
    key.seal(ca.key_pem().as_bytes(), &context(ca.fingerprint(), state))
}

/// The authority a row holds, if its fingerprint is exactly one, its key
/// opens with `key` for the row's state and matches its certificate.
fn opened(key: &TeamKey, row: &StoredAuthority) -> Result<Ca, TeamCaError> {
    if !crate::tls::is_fingerprint(&row.fingerprint) {
        return Err(TlsError::Invalid("the row's fingerprint is not one".into()).into());
    }
    let plain = key.unseal(&row.sealed_key, &context(&row.fingerprint, row.state))?;
    let key_pem = String::from_utf8(plain)
        .map_err(|_| TlsError::Invalid("the sealed key is not PEM".into()))?;
    let ca = Ca::new(&key_pem, row.cert.clone())?;
    if ca.fingerprint() != row.fingerprint {
        return Err(
            TlsError::Invalid("the row's fingerprint is not its certificate's".into()).into(),
        );
    }
    Ok(ca)
}

/// Offers `ca` to the team: as its first authority when it has none, else
/// as trusted (unless known).
fn offer(store: &Store, key: &TeamKey, ca: &Ca, first: bool) -> Result<(), TeamCaError> {
    let state = if first {
        AuthorityState::Current
    } else {
        AuthorityState::Trusted
    };
    let sealed_key = sealed(key, ca, state)?;
    let new = NewAuthority {
        fingerprint: ca.fingerprint(),
        cert: ca.cert_pem(),
        sealed_key: &sealed_key,
    };
    if first {
        store.create_team_authority(new)?;
    } else {
        store.add_trusted_authority(new)?;
    }
    Ok(())
}

/// The team's authorities as this daemon trusts them, made (or its own
/// adopted) on first use. A file authority of this daemon's is offered
/// once: its key file is removed when the team holds it (sealed), so a
/// database emptied later cannot make it the team's again.
pub fn load_or_create(
    store: &Store,
    key: &TeamKey,
    state_dir: &Path,
) -> Result<Authority, TeamCaError> {
    let own = crate::tls::file_authority(state_dir)?;
    let mut rows = store.team_authorities()?;
    let has_current =
        |rows: &[StoredAuthority]| rows.iter().any(|r| r.state == AuthorityState::Current);
    if !has_current(&rows) {
        let first = match &own {
            Some(_) => None,
            None => Some(Ca::generate()?),
        };
        let ca = own
            .as_ref()
            .or(first.as_ref())
            .ok_or(TeamCaError::NoCurrent)?;
        offer(store, key, ca, true)?;
        rows = store.team_authorities()?;
    }
    if let Some(own) = &own
        && !rows.iter().any(|r| r.fingerprint == own.fingerprint())
    {
        // The team's current authority opens with this key before
        // anything of this daemon's is offered: another team's daemon
        // adds nothing.
        from_rows(&rows, key, state_dir, None)?;
        offer(store, key, own, false)?;
        rows = store.team_authorities()?;
    }
    if let Some(own) = &own
        && rows.iter().any(|r| r.fingerprint == own.fingerprint())
    {
        local::forget_key(state_dir, own.fingerprint())?;
    }
    note_retired(state_dir, key, &rows)?;
    let own_fingerprint = local::offered(state_dir)?;
    from_rows(&rows, key, state_dir, own_fingerprint.as_deref())
}

/// Notes in this daemon's state directory every authority the team
/// retired (for good: a database rolled back does not bring it back). A
/// row marked retired without the team's seal of it is not noted, and is
/// named in the log: a database writer cannot retire the team's current
/// authority on every daemon that restarts.
fn note_retired(
    state_dir: &Path,
    key: &TeamKey,
    rows: &[StoredAuthority],
) -> Result<(), TeamCaError> {
    let mut sealed = Vec::new();
    for row in rows.iter().filter(|r| r.state == AuthorityState::Retired) {
        if retired_by_team(key, row) {
            sealed.push(row.fingerprint.clone());
        } else {
            tracing::warn!(
                generation = row.generation,
                fingerprint = %row.fingerprint,
                "an authority marked retired in the database was not retired with the team key: \
                 not noted as retired (a forged retirement, or one from before sealed retirements)"
            );
        }
    }
    local::add_retired(state_dir, &sealed)
}

/// The authorities of `rows` that open with `key`: every trusted one,
/// the current one last. The listener's certificate is signed by this
/// daemon's own earlier authority while it is trusted (its relays from
/// before know only that one), else by the oldest trusted one (relays
/// issued before the last rotation know only the older ones).
fn from_rows(
    rows: &[StoredAuthority],
    key: &TeamKey,
    state_dir: &Path,
    own: Option<&str>,
) -> Result<Authority, TeamCaError> {
    let current = rows
        .iter()
        .find(|r| r.state == AuthorityState::Current)
        .ok_or(TeamCaError::NoCurrent)?;
    let retired = local::retired(state_dir)?;
    if retired.contains(&current.fingerprint) {
        return Err(TeamCaError::Current(
            current.generation,
            "retired by this team before (the database was rolled back?)".into(),
        ));
    }
    let mut cas = Vec::new();
    for row in rows
        .iter()
        .filter(|r| r.state == AuthorityState::Trusted && !retired.contains(&r.fingerprint))
    {
        match opened(key, row) {
            Ok(ca) => cas.push(ca),
            // Not the team's: written by someone without its key.
            Err(e) => tracing::warn!(generation = row.generation, error = %e,
                "a trusted authority in the database does not open with the team key: not trusted"),
        }
    }
    let issuing = opened(key, current)
        .map_err(|e| TeamCaError::Current(current.generation, e.to_string()))?;
    cas.push(issuing);
    let serving = own
        .and_then(|own| cas.iter().position(|c| c.fingerprint() == own))
        .unwrap_or(0);
    Ok(Authority::team(state_dir, cas, serving)?)
}

/// A new current authority; the one before stays trusted until `retire`.
/// Returns its generation.
pub fn rotate(store: &Store, key: &TeamKey) -> Result<i64, TeamCaError> {
    let rows = store.team_authorities()?;
    let current = rows
        .iter()
        .find(|r| r.state == AuthorityState::Current)
        .ok_or(TeamCaError::NoCurrent)?;
    // Only a holder of the team key rotates: the current one must open.
    let old = opened(key, current)
        .map_err(|e| TeamCaError::Current(current.generation, e.to_string()))?;
    let demoted_key = sealed(key, &old, AuthorityState::Trusted)?;
    let ca = Ca::generate()?;
    let sealed_key = sealed(key, &ca, AuthorityState::Current)?;
    let new = NewAuthority {
        fingerprint: ca.fingerprint(),
        cert: ca.cert_pem(),
        sealed_key: &sealed_key,
    };
    Ok(store.rotate_team_authority(current.generation, &demoted_key, new)?)
}

/// Retires every authority but the current one (which must open with
/// `key`: a daemon given another team's key retires nothing), revokes
/// their certificates, and notes them in this daemon's state dir. A
/// trusted row that does not open with `key` (a database writer's: its
/// fingerprint may be the current one's with a space) gets no sealed
/// retirement: it is named in the log and left as it is (no daemon
/// trusts it). Returns (authorities retired, certificates revoked).
pub fn retire(
    store: &Store,
    key: &TeamKey,
    state_dir: &Path,
) -> Result<(usize, usize), TeamCaError> {
    let rows = store.team_authorities()?;
    let current = rows
        .iter()
        .find(|r| r.state == AuthorityState::Current)
        .ok_or(TeamCaError::NoCurrent)?;
    opened(key, current).map_err(|e| TeamCaError::Current(current.generation, e.to_string()))?;
    let mut retirements = std::collections::BTreeMap::new();
    let mut skipped = std::collections::BTreeSet::new();
    // Never the current authority's own fingerprint, whatever a row says.
    let trusted = rows
        .iter()
        .filter(|r| r.state == AuthorityState::Trusted && r.fingerprint != current.fingerprint);
    for row in trusted {
        match opened(key, row) {
            Ok(_) => {
                retirements.insert(row.fingerprint.clone(), retirement(key, &row.fingerprint)?);
            }
            Err(e) => {
                tracing::warn!(generation = row.generation, fingerprint = ?row.fingerprint,
                    error = %e, "a trusted authority in the database does not open with the \
                    team key: not retired (a row written without the team key)");
                skipped.insert(row.fingerprint.clone());
            }
        }
    }
    let (retired, revoked) = store.retire_team_authorities(current, &retirements, &skipped)?;
    local::add_retired(state_dir, &retired)?;
    Ok((retired.len(), revoked))
}

#[path = "team_ca_local.rs"]
mod local;

#[cfg(test)]
#[path = "team_ca_tests.rs"]
mod tests;
