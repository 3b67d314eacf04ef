//! Messages and inboxes.

use super::db::args;
use super::rows::*;
use super::sql::*;
use super::{Store, StoreError};

impl Store {
    /// Messages waiting for an agent: in its inbox or as queued turns.
    pub fn queued_count(&self, to_id: &str) -> Result<u32, StoreError> {
        count(&self.db, to_id)
    }

    /// Queues messages in one transaction, each only if its recipient has
    /// room (`inbox_depth`, counting its inbox and its queued turns), and
    /// a turn for each message delivered as one. Returns, per message, its
    /// id or `None` when the recipient was full. A message whose dedupe key
    /// was seen before returns the first one's id and queues nothing, also
    /// when another daemon stores the key at the same moment (the unique
    /// index decides). The room is counted under the recipient's lock
    /// (`lock_inboxes`): daemons sending at once never overfill an inbox.
    /// Committed before it returns.
    pub fn send(
        &mut self,
        messages: &[NewMessage<'_>],
        inbox_depth: Option<u32>,
    ) -> Result<Vec<Option<String>>, StoreError> {
        self.db.transaction(|tx| {
            if inbox_depth.is_some() {
                lock_inboxes(tx, messages.iter().map(|m| m.to_id))?;
            }
            let mut ids = Vec::new();
            for m in messages {
                if let Some(key) = &m.dedupe_key
                    && let Some(seen) = message_with_key(tx, key)?
                {
                    ids.push(Some(seen));
                    continue;
                }
                if let Some(depth) = inbox_depth
                    && count(tx, m.to_id)? >= depth
                {
                    ids.push(None);
                    continue;
                }
                ids.push(Some(send_message_once(tx, m)?));
            }
            Ok(ids)
        })
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
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE to_id = ?1 AND status = 'queued' ORDER BY seq LIMIT ?2"
        );
        let messages = self
            .db
            .rows(&sql, args![to_id, limit])?
            .iter()
            .map(message_row)
            .collect::<Result<Vec<_>, StoreError>>()?;
        if messages.is_empty() {
            return Ok((Vec::new(), 0));
        }
        // Exactly the messages read are marked delivered: a range would
        // also take one that another daemon's transaction gave an earlier
        // seq but committed after the read (PostgreSQL's read committed).
        let delivered = self.db.transaction(|tx| {
            let mut delivered = Vec::with_capacity(messages.len());
            for message in messages {
                let changed = tx.execute(
                    "UPDATE messages SET status = 'delivered' WHERE id = ?1 AND status = 'queued'",
                    args![message.id],
                )?;
                if changed == 1 {
                    delivered.push(message);
                }
            }
            Ok(delivered)
        })?;
        // All that is still queued (one committed late with an earlier
        // seq too).
        let left: i64 = self
            .db
            .one(
                "SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued'",
                args![to_id],
            )?
            .get(0)?;
        Ok((delivered, u64::try_from(left).unwrap_or(0)))
    }

    /// The last `limit` messages an agent sent or received, newest first.
    pub fn recent_messages(&self, id: &str, limit: u32) -> Result<Vec<Message>, StoreError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE to_id = ?1 OR from_id = ?1 ORDER BY seq DESC LIMIT ?2"
        );
        self.db
            .rows(&sql, args![id, limit])?
            .iter()
            .map(message_row)
            .collect()
    }

    /// Every message ever stored, oldest first (tests and audits).
    pub fn all_messages(&self) -> Result<Vec<Message>, StoreError> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY seq");
        self.db.rows(&sql, &[])?.iter().map(message_row).collect()
    }

    /// The thread (the id its sender knows) of the message with this key.
    pub fn thread_of(&self, dedupe_key: &str) -> Result<Option<String>, StoreError> {
        let row = self.db.row(
            "SELECT COALESCE(thread, id) FROM messages WHERE dedupe_key = ?1",
            args![dedupe_key],
        )?;
        row.map(|row| row.get(0)).transpose()
    }

    /// Every message's dedupe key, oldest first (tests).
    #[cfg(test)]
    pub fn dedupe_keys(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.db.rows(
            "SELECT dedupe_key FROM messages WHERE dedupe_key IS NOT NULL ORDER BY seq",
            &[],
        )?;
        rows.iter().map(|r| r.get(0)).collect()
    }
}
