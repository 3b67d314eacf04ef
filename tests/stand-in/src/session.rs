//! The session store, laid out as cursor-agent's:
//! `$HOME/.cursor/chats/<workspace-hash>/<session-uuid>/store.db`, SQLite in
//! WAL mode with a `meta` table (key `0`: hex-encoded JSON) and a
//! content-addressed `blobs` table whose rows form a chain.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The key of the meta row holding the session record.
const META_KEY: &str = "0";
/// A chain longer than this is treated as corrupt.
const MAX_CHAIN: usize = 1_000_000;

/// The directory name of a workspace: sha256 of its path, first 32 hex chars.
pub fn workspace_hash(workspace: &str) -> String {
    let mut h = hex(&Sha256::digest(workspace.as_bytes()));
    h.truncate(32);
    h
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// One blob of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub role: String,
    pub text: String,
    pub parent: Option<String>,
}

/// An open session.
#[derive(Debug)]
pub struct Session {
    pub id: String,
    conn: Connection,
}

fn store_path(home: &Path, ws_hash: &str, id: &str) -> PathBuf {
    home.join(".cursor")
        .join("chats")
        .join(ws_hash)
        .join(id)
        .join("store.db")
}

impl Session {
    /// Creates a new session with a fresh v4 uuid.
    pub fn create(home: &Path, ws_hash: &str) -> Result<Session> {
        let id = uuid::Uuid::new_v4().to_string();
        let path = store_path(home, ws_hash, &id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let conn =
            Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
        setup(&conn)?;
        let meta = json!({
            "agentId": id, "name": "stand-in", "mode": "default",
            "latestRootBlobId": null, "createdAt": now_ms(),
        });
        write_meta(&conn, &meta)?;
        Ok(Session { id, conn })
    }

    /// Opens an existing session of this workspace; `None` when there is none.
    pub fn open(home: &Path, ws_hash: &str, id: &str) -> Result<Option<Session>> {
        if uuid::Uuid::parse_str(id).is_err() {
            return Ok(None);
        }
        let path = store_path(home, ws_hash, id);
        if !path.is_file() {
            return Ok(None);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags)
            .with_context(|| format!("opening {}", path.display()))?;
        setup(&conn)?;
        if read_meta(&conn)?.is_none() {
            return Ok(None);
        }
        let id = id.to_string();
        Ok(Some(Session { id, conn }))
    }

    /// The newest blob id, if any turn was stored.
    pub fn latest_root(&self) -> Result<Option<String>> {
        let meta = read_meta(&self.conn)?.ok_or_else(|| anyhow!("session meta is missing"))?;
        Ok(meta["latestRootBlobId"].as_str().map(str::to_string))
    }

    /// Loads one blob by id.
    pub fn blob(&self, id: &str) -> Result<Blob> {
        let data: Vec<u8> = self
            .conn
            .query_row("SELECT data FROM blobs WHERE id = ?1", [id], |r| r.get(0))
            .with_context(|| format!("blob {id}"))?;
        serde_json::from_slice(&data).with_context(|| format!("blob {id} is not a chain blob"))
    }

    /// The text of the newest plan blob, walking the chain back from the root.
    pub fn latest_plan(&self) -> Result<Option<String>> {
        let mut next = self.latest_root()?;
        for _ in 0..MAX_CHAIN {
            let Some(id) = next else { return Ok(None) };
            let blob = self.blob(&id)?;
            if blob.role == "plan" {
                return Ok(Some(blob.text));
            }
            next = blob.parent;
        }
        Err(anyhow!("blob chain longer than {MAX_CHAIN}"))
    }

    /// Appends the turn's blobs (user, optional plan, assistant) and moves
    /// latestRootBlobId to the last one, all in one transaction.
    pub fn append_turn(&mut self, user: &str, plan: Option<&str>, assistant: &str) -> Result<()> {
        let mut parent = self.latest_root()?;
        let tx = self.conn.transaction()?;
        let turn = [
            ("user", Some(user)),
            ("plan", plan),
            ("assistant", Some(assistant)),
        ];
        for (role, text) in turn {
            if let Some(text) = text {
                parent = Some(insert_blob(&tx, role, text, parent)?);
            }
        }
        let mut meta = read_meta(&tx)?.ok_or_else(|| anyhow!("session meta is missing"))?;
        meta["latestRootBlobId"] = json!(parent);
        write_meta(&tx, &meta)?;
        tx.commit()?;
        Ok(())
    }
}

fn setup(conn: &Connection) -> Result<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(anyhow!("journal_mode is {mode}, not wal"));
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
         CREATE TABLE IF NOT EXISTS blobs (id TEXT PRIMARY KEY, data BLOB);",
    )?;
    Ok(())
}

fn read_meta(conn: &Connection) -> Result<Option<Value>> {
    let value: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [META_KEY], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(value) = value else { return Ok(None) };
    let bytes = unhex(&value).ok_or_else(|| anyhow!("meta is not hex"))?;
    Ok(Some(serde_json::from_slice(&bytes)?))
}

fn write_meta(conn: &Connection, meta: &Value) -> Result<()> {
    let value = hex(serde_json::to_string(meta)?.as_bytes());
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![META_KEY, value],
    )?;
    Ok(())
}

fn insert_blob(
    conn: &Connection,
    role: &str,
    text: &str,
    parent: Option<String>,
) -> Result<String> {
    let blob = Blob {
        role: role.to_string(),
        text: text.to_string(),
        parent,
    };
    let data = serde_json::to_vec(&blob)?;
    let id = hex(&Sha256::digest(&data));
    conn.execute(
        "INSERT OR IGNORE INTO blobs (id, data) VALUES (?1, ?2)",
        params![id, data],
    )?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_hash_is_32_hex_of_sha256() {
        // Checked with `printf %s /tmp/ws | sha256sum`.
        assert_eq!(
            workspace_hash("/tmp/ws"),
            "b011ea26cc731e1a7d0d402fec6cc06e"
        );
        assert_eq!(workspace_hash("").len(), 32);
        assert_eq!(workspace_hash(""), "e3b0c44298fc1c149afbf4c8996fb924");
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(b"{\"a\":1}"), "7b2261223a317d");
        assert_eq!(unhex("7b2261223a317d").unwrap(), b"{\"a\":1}");
        assert_eq!(unhex("7"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn turns_chain_and_the_latest_plan_is_found() {
        let home = tempfile::tempdir().unwrap();
        let mut s = Session::create(home.path(), "h").unwrap();
        assert_eq!(s.latest_root().unwrap(), None);
        assert_eq!(s.latest_plan().unwrap(), None);
        s.append_turn("u1", Some("{\"turns\":[]}"), "a1").unwrap();
        s.append_turn("u2", None, "a2").unwrap();
        let root = s.latest_root().unwrap().unwrap();
        let a2 = s.blob(&root).unwrap();
        assert_eq!((a2.role.as_str(), a2.text.as_str()), ("assistant", "a2"));
        let u2 = s.blob(a2.parent.as_deref().unwrap()).unwrap();
        assert_eq!((u2.role.as_str(), u2.text.as_str()), ("user", "u2"));
        assert_eq!(s.latest_plan().unwrap().as_deref(), Some("{\"turns\":[]}"));

        let id = s.id.clone();
        drop(s);
        let again = Session::open(home.path(), "h", &id).unwrap().unwrap();
        assert_eq!(again.latest_root().unwrap(), Some(root));
        assert!(Session::open(home.path(), "other", &id).unwrap().is_none());
        assert!(Session::open(home.path(), "h", "../h").unwrap().is_none());
    }
}
