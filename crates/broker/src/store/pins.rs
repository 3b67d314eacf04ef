//! Pinned upstream tool definitions and their approvals.

use rusqlite::{OptionalExtension, params};

use super::rows::*;
use super::sql::Cached;
use super::{Store, StoreError, now_ms};

impl Store {
    /// Checks a tool definition against its pin. First sight pins it
    /// (trust on first use) unless `flagged`; a changed hash quarantines
    /// it; a quarantined tool stays so until `approve_pin`.
    pub fn check_pin(
        &self,
        server: &str,
        tool: &str,
        position: usize,
        hash: &str,
        definition: &str,
        flagged: Option<&str>,
    ) -> Result<PinState, StoreError> {
        let row: Option<(Option<String>, PinStatus, Option<String>)> = self
            .conn
            .cached_row(
                "SELECT approved_hash, state, reason FROM tool_pins WHERE server = ?1 AND tool = ?2",
                params![server, tool],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (state, reason, approved) = match (row, flagged) {
            (None, Some(why)) => (PinStatus::Quarantined, Some(why.to_string()), None),
            (None, None) => (PinStatus::Approved, None, Some(hash.to_string())),
            (Some((approved, PinStatus::Quarantined, reason)), _) => {
                (PinStatus::Quarantined, reason, approved)
            }
            (Some((Some(approved), _, _)), _) if approved == hash => {
                (PinStatus::Approved, None, Some(approved))
            }
            (Some((approved, _, _)), _) => (
                PinStatus::Quarantined,
                Some("its definition changed since it was approved".to_string()),
                approved,
            ),
        };
        self.conn.cached_execute(
            "INSERT INTO tool_pins (server, tool, approved_hash, seen_hash, seen_definition, state, reason, updated_at, position)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT(server, tool) DO UPDATE SET approved_hash = ?3, seen_hash = ?4, seen_definition = ?5, state = ?6, reason = ?7, updated_at = ?8, position = ?9",
            params![server, tool, approved, hash, definition, state, reason, now_ms(), i64::try_from(position).unwrap_or(i64::MAX)],
        )?;
        Ok(if state == PinStatus::Quarantined {
            PinState::Quarantined(reason.unwrap_or_else(|| "quarantined".into()))
        } else {
            PinState::Approved
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
        let seen: Option<String> = self
            .conn
            .cached_row(
                "SELECT seen_hash FROM tool_pins WHERE server = ?1 AND tool = ?2",
                params![server, tool],
                |r| r.get(0),
            )
            .optional()?;
        let Some(seen) = seen else {
            return Ok(Approval::Unknown);
        };
        if hash.len() < 12 || !seen.starts_with(hash) {
            return Ok(Approval::Mismatch(seen));
        }
        self.conn.cached_execute(
            "UPDATE tool_pins SET approved_hash = seen_hash, state = 'approved', reason = NULL, updated_at = ?3 WHERE server = ?1 AND tool = ?2",
            params![server, tool, now_ms()],
        )?;
        Ok(Approval::Approved)
    }

    /// Every pin, by server, in the order the server last listed its tools.
    pub fn pins(&self) -> Result<Vec<PinRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT server, tool, state, reason, approved_hash, seen_hash FROM tool_pins ORDER BY server, position, tool",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(PinRow {
                server: r.get(0)?,
                tool: r.get(1)?,
                state: r.get(2)?,
                reason: r.get(3)?,
                approved_hash: r.get(4)?,
                seen_hash: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records `tools enable|disable SERVER`: it outlasts the daemon.
    pub fn set_server_enabled(&self, server: &str, enabled: bool) -> Result<(), StoreError> {
        self.conn.cached_execute(
            "INSERT INTO server_switches (server, enabled, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(server) DO UPDATE SET enabled = ?2, updated_at = ?3",
            params![server, enabled, now_ms()],
        )?;
        Ok(())
    }

    /// Every server switched by `tools enable|disable`, and how.
    pub fn server_switches(&self) -> Result<Vec<(String, bool)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT server, enabled FROM server_switches ORDER BY server")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
