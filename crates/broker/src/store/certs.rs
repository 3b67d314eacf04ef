//! The certificates issued to agents for relays on other hosts (by their
//! SHA-256, with the authority that issued each): a connection over
//! mutual TLS speaks for the agent whose recorded certificate it shows
//! (crate::tls).

use super::db::{Engine, args};
use super::{Store, StoreError, now_ms};

/// A certificate to record.
#[derive(Debug, Clone, Copy)]
pub struct NewCert<'a> {
    pub agent_id: &'a str,
    pub fingerprint: &'a str,
    /// The SHA-256 of the issuing authority's certificate.
    pub authority: &'a str,
    /// The agent's earlier certificates are revoked in the same transaction.
    pub replace: bool,
}

impl Store {
    /// Records a certificate issued to an agent, in one transaction with
    /// the check that the agent exists and runs on this store's daemon (or
    /// on none): its row is locked first (PostgreSQL; SQLite's writers are
    /// serialised), so a removal or an adoption at the same moment either
    /// went first and is seen, or waits. Nothing is recorded otherwise:
    /// `Ok(false)` for an agent that is gone (or an issuing team authority
    /// no longer current), `Elsewhere` for one another
    /// daemon runs now.
    pub fn insert_agent_cert(&mut self, cert: NewCert<'_>) -> Result<bool, StoreError> {
        let me = self.seat.daemon_id.clone();
        self.db.transaction(|tx| {
            let lock = match tx.engine() {
                Engine::Postgres => " FOR UPDATE",
                Engine::Sqlite => "",
            };
            let sql = format!("SELECT daemon_id FROM agents WHERE id = ?1{lock}");
            let Some(row) = tx.row(&sql, args![cert.agent_id])? else {
                return Ok(false);
            };
            if let Some(daemon) = row.get::<Option<String>>(0)?
                && daemon != me
            {
                return Err(StoreError::Elsewhere(daemon));
            }
            // The issuing authority, if the team's, is locked and must
            // still be current: a retirement meanwhile went first or waits.
            let sql = format!(
                "SELECT state FROM team_authorities WHERE fingerprint = ?1{}",
                match tx.engine() {
                    Engine::Postgres => " FOR SHARE",
                    Engine::Sqlite => "",
                }
            );
            if let Some(row) = tx.row(&sql, args![cert.authority])?
                && row.get::<String>(0)? != "current"
            {
                return Ok(false);
            }
            if cert.replace {
                tx.execute(
                    "DELETE FROM agent_certs WHERE agent_id = ?1",
                    args![cert.agent_id],
                )?;
            }
            tx.execute(
                "INSERT INTO agent_certs (fingerprint, agent_id, issued_at, authority) VALUES (?1, ?2, ?3, ?4)",
                args![cert.fingerprint, cert.agent_id, now_ms(), cert.authority],
            )?;
            Ok(true)
        })
    }

    /// The agent a certificate was issued to, while both exist.
    pub fn agent_of_cert(&self, fingerprint: &str) -> Result<Option<String>, StoreError> {
        let row = self.db.row(
            "SELECT c.agent_id FROM agent_certs c JOIN agents a ON a.id = c.agent_id
             WHERE c.fingerprint = ?1",
            args![fingerprint],
        )?;
        row.map(|r| r.get(0)).transpose()
    }

    /// How many certificates `agent_id` holds.
    pub fn agent_cert_count(&self, agent_id: &str) -> Result<u32, StoreError> {
        self.db
            .one(
                "SELECT COUNT(*) FROM agent_certs WHERE agent_id = ?1",
                args![agent_id],
            )?
            .get(0)
    }
}
