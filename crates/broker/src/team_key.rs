//! The team key: 32 random bytes in a file of the operator's (`--team-key
//! FILE`, hex, mode 0600, owned by the daemon's account), given to every
//! daemon of the team and to nothing else. It seals the team authority's
//! private key in the database (ChaCha20-Poly1305, ring): a dump of the
//! database alone holds the certificate, never a key that signs.
//!
//! A sealed value is `v1:` and the hex of a random 96-bit nonce followed
//! by the ciphertext and its tag. The associated data names what was
//! sealed (the authority's generation and its certificate's SHA-256), so
//! a sealed key moved to another row does not open there.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

const KEY_LEN: usize = 32;
const PREFIX: &str = "v1:";

#[derive(Debug, thiserror::Error)]
pub enum TeamKeyError {
    #[error("team key {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error(
        "team key {0}: mode {1:o} lets others read it; it must be the operator's alone (chmod 600)"
    )]
    Readable(PathBuf, u32),
    #[error("team key {0}: owned by uid {1}, not by this account ({2})")]
    NotOwner(PathBuf, u32, u32),
    #[error("team key {0}: not a regular file")]
    NotFile(PathBuf),
    #[error("team key {0}: expected 64 hex digits (32 bytes; `team key new FILE` makes one)")]
    Format(PathBuf),
    #[error(
        "the team authority's key does not open with this team key: another team's key, or the row was altered"
    )]
    Unseal,
    #[error("sealed value: {0}")]
    Sealed(&'static str),
    #[error("no randomness: {0}")]
    Random(String),
}

/// The key, in memory only.
pub struct TeamKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for TeamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TeamKey(..)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl TeamKey {
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes).ok()?;
        Some(Self {
            key: LessSafeKey::new(unbound),
        })
    }

    /// The key in `path`: refused unless it is a regular file of this
    /// account's that no one else can read or write.
    pub fn load(path: &Path) -> Result<Self, TeamKeyError> {
        let io = |e| TeamKeyError::Io(path.to_path_buf(), e);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(TeamKeyError::NotFile(path.to_path_buf()));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(TeamKeyError::NotOwner(path.to_path_buf(), meta.uid(), me));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(TeamKeyError::Readable(
                path.to_path_buf(),
                meta.mode() & 0o7777,
            ));
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(&file, 256), &mut text)
            .map_err(io)?;
        unhex(text.trim())
            .filter(|b| b.len() == KEY_LEN)
            .and_then(|b| Self::from_bytes(&b))
            .ok_or_else(|| TeamKeyError::Format(path.to_path_buf()))
    }

    /// Makes a new key in `path` (0600; never over an existing file).
    pub fn create(path: &Path) -> Result<(), TeamKeyError> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| TeamKeyError::Random(e.to_string()))?;
        let io = |e| TeamKeyError::Io(path.to_path_buf(), e);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        file.write_all(format!("{}\n", hex(&bytes)).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io)
    }

    /// `plain` sealed, bound to `context`.
    pub fn seal(&self, plain: &[u8], context: &str) -> Result<String, TeamKeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| TeamKeyError::Random(e.to_string()))?;
        let mut data = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .map_err(|_| TeamKeyError::Sealed("sealing failed"))?;
        Ok(format!("{PREFIX}{}{}", hex(&nonce), hex(&data)))
    }

    /// What `seal` sealed with this key and `context`; anything else
    /// (another key, another context, a changed byte) is refused.
    pub fn unseal(&self, sealed: &str, context: &str) -> Result<Vec<u8>, TeamKeyError> {
        let body = sealed
            .strip_prefix(PREFIX)
            .ok_or(TeamKeyError::Sealed("unknown format"))?;
        let bytes = unhex(body).ok_or(TeamKeyError::Sealed("not hex"))?;
        if bytes.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(TeamKeyError::Sealed("too short"));
        }
        let (nonce, data) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| TeamKeyError::Sealed("bad nonce"))?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| TeamKeyError::Unseal)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key_in(dir: &Path, name: &str) -> (PathBuf, TeamKey) {
        let path = dir.join(name);
        TeamKey::create(&path).unwrap();
        let key = TeamKey::load(&path).unwrap();
        (path, key)
    }

    #[test]
    fn sealed_opens_with_its_key_and_context_only() {
        let dir = tempfile::tempdir().unwrap();
        let (_, key) = key_in(dir.path(), "a.key");
        let (_, other) = key_in(dir.path(), "b.key");
        let sealed = key.seal(b"the CA key", "gen 1").unwrap();
        assert!(!sealed.contains(&hex(b"the CA key")));
        assert_eq!(key.unseal(&sealed, "gen 1").unwrap(), b"the CA key");
        // Another team's key: refused, saying so.
        let wrong = other.unseal(&sealed, "gen 1").unwrap_err();
        assert!(matches!(wrong, TeamKeyError::Unseal), "{wrong}");
        assert!(wrong.to_string().contains("another team's key"), "{wrong}");
        // Moved to another row: refused.
        assert!(matches!(
            key.unseal(&sealed, "gen 2"),
            Err(TeamKeyError::Unseal)
        ));
        // Every byte changed once: each refused.
        let body = sealed.strip_prefix(PREFIX).unwrap();
        for i in 0..body.len() {
            let mut tampered: Vec<u8> = body.bytes().collect();
            tampered[i] = if tampered[i] == b'0' { b'1' } else { b'0' };
            let tampered = format!("{PREFIX}{}", String::from_utf8(tampered).unwrap());
            assert!(key.unseal(&tampered, "gen 1").is_err(), "byte {i}");
        }
        // Cut short, or not ours.
        assert!(matches!(
            key.unseal(&sealed[..20], "gen 1"),
            Err(TeamKeyError::Sealed(_))
        ));
        assert!(matches!(
            key.unseal("v2:00", "gen 1"),
            Err(TeamKeyError::Sealed(_))
        ));
        // Two seals of one value differ (a fresh nonce each).
        assert_ne!(sealed, key.seal(b"the CA key", "gen 1").unwrap());
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = key_in(dir.path(), "team.key");
        for mode in [0o640, 0o604, 0o660, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let refused = TeamKey::load(&path).unwrap_err();
            assert!(
                matches!(refused, TeamKeyError::Readable(_, m) if m == mode),
                "{mode:o}: {refused}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        TeamKey::load(&path).unwrap();
        // Never over an existing file.
        assert!(matches!(TeamKey::create(&path), Err(TeamKeyError::Io(..))));
        // A link to it is not followed; garbage is not a key.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(TeamKey::load(&link).is_err());
        let short = dir.path().join("short");
        std::fs::write(&short, "abcd\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            TeamKey::load(&short),
            Err(TeamKeyError::Format(_))
        ));
    }
}
