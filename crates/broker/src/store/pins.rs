//! Pinned upstream tool definitions and their approvals.

use super::db::{Engine, args};
use super::rows::*;
use super::{Store, StoreError, now_ms};

impl Store {
    /// Checks a tool definition against its pin. First sight pins it
    /// (trust on first use) unless `flagged`; a changed hash quarantines
    /// it; a quarantined tool stays so until `approve_pin`. Daemons
    /// checking one tool at once decide one after another: the first sight
    /// is an insert that only one can make (the others then find its pin),
    /// and a pin found is decided on and written under its row's lock
    /// (PostgreSQL; SQLite's IMMEDIATE transaction holds the write lock),
    /// so no daemon's decision is overwritten by one made on what it read
    /// before.
    pub fn check_pin(
        &self,
        server: &str,
        tool: &str,
        position: usize,
        hash: &str,
        definition: &str,
        flagged: Option<&str>,
    ) -> Result<PinState, StoreError> {
        self.db.transaction(|tx| {
            let (state, reason, approved) = match flagged {
                Some(why) => (PinStatus::Quarantined, Some(why.to_string()), None),
                None => (PinStatus::Approved, None, Some(hash.to_string())),
            };
            let first = tx.execute(
                "INSERT INTO tool_pins (server, tool, approved_hash, seen_hash, seen_definition, state, reason, updated_at, position)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT(server, tool) DO NOTHING",
                args![server, tool, approved, hash, definition, state, reason, now_ms(), position],
            )?;
            if first == 1 {
                return Ok(pin_state(state, reason));
            }
            let lock = match tx.engine() {
                Engine::Postgres => " FOR UPDATE",
                Engine::Sqlite => "",
            };
            let row = tx.one(
                &format!("SELECT approved_hash, state, reason FROM tool_pins WHERE server = ?1 AND tool = ?2{lock}"),
                args![server, tool],
            )?;
            let found: (Option<String>, PinStatus, Option<String>) =
                (row.get(0)?, row.get(1)?, row.get(2)?);
            let (state, reason, approved) = match found {
                (approved, PinStatus::Quarantined, reason) => {
                    (PinStatus::Quarantined, reason, approved)
                }
                (Some(approved), _, _) if approved == hash => {
                    (PinStatus::Approved, None, Some(approved))
                }
                (approved, _, _) => (
                    PinStatus::Quarantined,
                    Some("its definition changed since it was approved".to_string()),
                    approved,
                ),
            };
            tx.execute(
                "UPDATE tool_pins SET approved_hash = ?3, seen_hash = ?4, seen_definition = ?5, state = ?6, reason = ?7, updated_at = ?8, position = ?9
                 WHERE server = ?1 AND tool = ?2",
                args![server, tool, approved, hash, definition, state, reason, now_ms(), position],
            )?;
            Ok(pin_state(state, reason))
        })
    }

    /// Pins what was last seen of a tool; false when it was never seen.
    /// Pins the definition last seen, if its hash starts with `hash` (what
    /// the operator reviewed in `tools list`: a definition that changed
    /// since is not approved unseen).
    pub fn approve_pin(
        &self,
        server: &str,
        tool: &str,
        hash: &str,
    ) -> Result<Approval, StoreError> {
        let Some(row) = self.db.row(
            "SELECT seen_hash FROM tool_pins WHERE server = ?1 AND tool = ?2",
            args![server, tool],
        )?
        else {
            return Ok(Approval::Unknown);
        };
        let seen: String = row.get(0)?;
        if hash.len() < 12 || !seen.starts_with(hash) {
            return Ok(Approval::Mismatch(seen));
        }
        // Only the definition read: one a daemon saw since is not approved
        // unseen.
        let approved = self.db.execute(
            "UPDATE tool_pins SET approved_hash = seen_hash, state = 'approved', reason = NULL, updated_at = ?3 WHERE server = ?1 AND tool = ?2 AND seen_hash = ?4",
            args![server, tool, now_ms(), seen],
        )?;
        if approved == 0 {
            return self.approve_pin(server, tool, hash);
        }
        Ok(Approval::Approved)
    }

    /// Every pin, by server, in the order the server last listed its tools.
    pub fn pins(&self) -> Result<Vec<PinRow>, StoreError> {
        let rows = self.db.rows(
            "SELECT server, tool, state, reason, approved_hash, seen_hash FROM tool_pins ORDER BY server, position, tool",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                Ok(PinRow {
                    server: r.get(0)?,
                    tool: r.get(1)?,
                    state: r.get(2)?,
                    reason: r.get(3)?,
                    approved_hash: r.get(4)?,
                    seen_hash: r.get(5)?,
                })
            })
            .collect()
    }

    /// Records `tools enable|disable SERVER`: it outlasts the daemon.
    pub fn set_server_enabled(&self, server: &str, enabled: bool) -> Result<(), StoreError> {
        self.db.execute(
            "INSERT INTO server_switches (server, enabled, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(server) DO UPDATE SET enabled = ?2, updated_at = ?3",
            args![server, enabled, now_ms()],
        )?;
        Ok(())
    }

    /// Every server switched by `tools enable|disable`, and how.
    pub fn server_switches(&self) -> Result<Vec<(String, bool)>, StoreError> {
        let rows = self.db.rows(
            "SELECT server, enabled FROM server_switches ORDER BY server",
            &[],
        )?;
        rows.iter().map(|r| Ok((r.get(0)?, r.get(1)?))).collect()
    }
}

fn pin_state(state: PinStatus, reason: Option<String>) -> PinState {
    if state == PinStatus::Quarantined {
        PinState::Quarantined(reason.unwrap_or_else(|| "quarantined".into()))
    } else {
        PinState::Approved
    }
}
