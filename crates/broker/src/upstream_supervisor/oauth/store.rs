//! Where the daemon keeps a server's tokens: STATE/oauth/SERVER.json, a
//! 0600 file in a 0700 directory (readable by the daemon's user only),
//! replaced atomically (written beside, synced, renamed) so a refresh that
//! dies half way leaves the old tokens. rmcp's `CredentialStore` over it:
//! its AuthorizationManager loads, refreshes and saves through this.
//!
//! The file holds rmcp's `StoredCredentials` as JSON; nothing here prints
//! its contents (errors name the file only).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rmcp::transport::auth::{AuthError, CredentialStore, StoredCredentials};

/// A server's token file.
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
}

/// STATE/oauth: the directory of every server's token file.
pub fn token_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("oauth")
}

impl FileStore {
    /// The token file of `server` (a checked server name: no `/`) in `dir`.
    pub fn new(dir: &Path, server: &str) -> Self {
        Self {
            path: dir.join(format!("{server}.json")),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> AuthError {
        AuthError::CredentialStoreError(format!("{what} {}: {e}", self.path.display()))
    }

    /// The stored credentials, or none (no file yet).
    pub fn read(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.fail("cannot read", e)),
        };
        // serde's error could quote the file: say only where it failed.
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            self.fail(
                "cannot parse",
                format_args!("line {} column {}", e.line(), e.column()),
            )
        })
    }

    /// Replaces the file atomically; the directory is made 0700 and the
    /// file 0600 whatever the umask.
    pub fn write(&self, credentials: &StoredCredentials) -> Result<(), AuthError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| self.fail("cannot make the directory of", e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| self.fail("cannot restrict the directory of", e))?;
        let bytes = serde_json::to_vec(credentials).map_err(|e| self.fail("cannot encode", e))?;
        let temporary = self
            .path
            .with_extension(format!("json.{}.new", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        let result = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &self.path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&temporary);
            return Err(self.fail("cannot write", e));
        }
        Ok(())
    }

    /// Deletes the file (none is fine).
    pub fn delete(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.fail("cannot delete", e)),
        }
    }
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read())
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.write(&credentials))
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.delete())
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_private_and_replaced_whole() {
        let state = tempfile::tempdir().unwrap();
        let store = FileStore::new(&token_dir(state.path()), "docs");
        assert!(store.read().unwrap().is_none());
        let credentials = StoredCredentials::new("client".into(), None, vec!["a".into()], Some(1));
        store.write(&credentials).unwrap();
        store.write(&credentials).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.path()), 0o600);
        assert_eq!(mode(&token_dir(state.path())), 0o700);
        assert_eq!(
            std::fs::read_dir(token_dir(state.path())).unwrap().count(),
            1
        );
        assert_eq!(store.read().unwrap().unwrap().client_id, "client");
        std::fs::write(store.path(), b"{\"client_id\": \"sekrit").unwrap();
        let err = store.read().unwrap_err().to_string();
        assert!(!err.contains("sekrit"), "{err}");
        store.delete().unwrap();
        store.delete().unwrap();
        assert!(store.read().unwrap().is_none());
    }
}
