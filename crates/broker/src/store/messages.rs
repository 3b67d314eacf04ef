//! Messages and inboxes.

use rusqlite::{OptionalExtension, params};

use super::rows::*;
use super::sql::*;
use super::{Store, StoreError};

impl Store {
    /// Messages waiting for an agent: in its inbox or as queued turns.
    pub fn queued_count(&self, to_id: &str) -> Result<u32, StoreError> {
        count(&self.conn, to_id)
    }

    /// Queues messages in one transaction, each only if its recipient has
    /// room (`inbox_depth`, counting its inbox and its queued turns), and
    /// a turn for each message delivered as one. Returns, per message, its
    /// id or `None` when the recipient was full. A message whose dedupe key
    /// was seen before returns the first one's id and queues nothing.
    /// Committed before it returns.
    pub fn send(
        &mut self,
        messages: &[NewMessage<'_>],
        inbox_depth: Option<u32>,
    ) -> Result<Vec<Option<String>>, StoreError> {
        let tx = self.conn.transaction()?;
        let mut ids = Vec::new();
        for m in messages {
            if let Some(key) = &m.dedupe_key {
                let seen: Option<String> = tx
                    .cached_row(
                        "SELECT id FROM messages WHERE dedupe_key = ?1",
                        [key],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(id) = seen {
                    ids.push(Some(id));
                    continue;
                }
            }
            if let Some(depth) = inbox_depth
                && count(&tx, m.to_id)? >= depth
            {
                ids.push(None);
                continue;
            }
            ids.push(Some(insert_message(&tx, m)?));
        }
        tx.commit()?;
        Ok(ids)
    }

    /// Takes the queued messages of `to_id`, oldest first, at most `limit`
    /// of them, and marks those delivered in the same transaction; the
    /// rest stay queued (how many: the second value).
    pub fn take_inbox(
        &mut self,
        to_id: &str,
        limit: usize,
    ) -> Result<(Vec<Message>, u64), StoreError> {
        // Read first: an empty inbox (the common case) costs no write. The
        // caller holds the store's lock, so nothing arrives in between; the
        // update is bounded by the last message read all the same.
        let messages = {
            let sql = format!(
                "SELECT {MESSAGE_COLUMNS}, seq FROM messages WHERE to_id = ?1 AND status = 'queued' ORDER BY seq LIMIT ?2"
            );
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![to_id, limit], |row| {
                Ok((message_row(row)?, row.get::<_, i64>(10)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let Some(last_seq) = messages.last().map(|(_, seq)| *seq) else {
            return Ok((Vec::new(), 0));
        };
        self.conn.cached_execute(
            "UPDATE messages SET status = 'delivered' WHERE to_id = ?1 AND status = 'queued' AND seq <= ?2",
            params![to_id, last_seq],
        )?;
        let left: i64 = self.conn.cached_row(
            "SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued' AND seq > ?2",
            params![to_id, last_seq],
            |r| r.get(0),
        )?;
        Ok((
            messages.into_iter().map(|(m, _)| m).collect(),
            u64::try_from(left).unwrap_or(0),
        ))
    }

    /// The last `limit` messages an agent sent or received, newest first.
    pub fn recent_messages(&self, id: &str, limit: u32) -> Result<Vec<Message>, StoreError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE to_id = ?1 OR from_id = ?1 ORDER BY seq DESC LIMIT ?2"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![id, limit], message_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every message ever stored, oldest first (tests and audits).
    pub fn all_messages(&self) -> Result<Vec<Message>, StoreError> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY seq");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], message_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The thread (the id its sender knows) of the message with this key.
    pub fn thread_of(&self, dedupe_key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .cached_row(
                "SELECT COALESCE(thread, id) FROM messages WHERE dedupe_key = ?1",
                [dedupe_key],
                |r| r.get(0),
            )
            .optional()?)
    }
}
