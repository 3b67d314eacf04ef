//! The certificates issued to agents for relays on other hosts (by their
//! SHA-256): a connection over mutual TLS speaks for the agent whose
//! recorded certificate it shows (crate::tls).

use super::db::args;
use super::{Store, StoreError, now_ms};

impl Store {
    /// Records a certificate issued to `agent_id`; with `replace`, the
    /// agent's earlier ones are revoked in the same transaction.
    pub fn insert_agent_cert(
        &mut self,
        agent_id: &str,
        fingerprint: &str,
        replace: bool,
    ) -> Result<(), StoreError> {
        self.db.transaction(|tx| {
            if replace {
                tx.execute(
                    "DELETE FROM agent_certs WHERE agent_id = ?1",
                    args![agent_id],
                )?;
            }
            tx.execute(
                "INSERT INTO agent_certs (fingerprint, agent_id, issued_at) VALUES (?1, ?2, ?3)",
                args![fingerprint, agent_id, now_ms()],
            )?;
            Ok(())
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
