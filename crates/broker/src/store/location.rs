//! Where the state database is: `--state sqlite:PATH` (the default, the
//! state directory's `state.db`) or `--state postgres://...`.

use std::path::{Path, PathBuf};

use super::StoreError;

#[derive(Clone, PartialEq, Eq)]
pub enum StateDatabase {
    Sqlite(PathBuf),
    /// A libpq connection URL (`postgres://` or `postgresql://`).
    Postgres(String),
}

impl StateDatabase {
    /// The default: `state.db` in the daemon's state directory.
    pub fn in_state_dir(state_dir: &Path) -> Self {
        Self::Sqlite(state_dir.join("state.db"))
    }

    /// `sqlite:PATH`, `postgres://...` or `postgresql://...`; anything else
    /// is refused (a bare path could be either a typo or a file).
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::Address("sqlite: names no file".into()));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            // Read now (with its CA file) so a bad address fails at
            // start, not at connect.
            super::pg_address::pg_address(text).map_err(|e| match e {
                StoreError::Address(why) => {
                    StoreError::Address(format!("{}: {why}", redacted(text)))
                }
                other => other,
            })?;
            return Ok(Self::Postgres(text.to_owned()));
        }
        Err(StoreError::Address(format!(
            "`{}` is neither sqlite:PATH nor a postgres:// or postgresql:// URL",
            redacted(text)
        )))
    }
}

/// The address without its password, for logs and errors.
impl std::fmt::Display for StateDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Postgres(url) => f.write_str(&redacted(url)),
        }
    }
}

impl std::fmt::Debug for StateDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateDatabase({self})")
    }
}

/// `scheme://user:secret@host/...` as `scheme://user:***@host/...`, and a
/// `password=` query parameter likewise.
fn redacted(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "(an address that is not a URL)".into();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .map(|(k, v)| {
            let v = if k.eq_ignore_ascii_case("password") {
                "***".into()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    if !pairs.is_empty() {
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_never_show_a_password() {
        assert_eq!(
            StateDatabase::parse("sqlite:/var/lib/s/state.db").ok(),
            Some(StateDatabase::Sqlite("/var/lib/s/state.db".into()))
        );
        let pg = StateDatabase::parse(
            "postgres://team:hunter2@db.example:5433/substrat?password=x2&sslmode=disable",
        )
        .unwrap();
        let shown = format!("{pg} {pg:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("x2"),
            "{shown}"
        );
        assert!(
            shown.contains("postgres://team:***@db.example:5433/substrat"),
            "{shown}"
        );
        for bad in [
            "",
            "sqlite:",
            "/var/lib/state.db",
            "mysql://x",
            "postgres://h:notaport/db",
        ] {
            let error = StateDatabase::parse(bad).err().map(|e| e.to_string());
            assert!(error.is_some(), "{bad} was accepted");
        }
        let error = StateDatabase::parse("postgresql://u:hunter2@h:notaport/db")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!error.contains("hunter2"), "{error}");
    }
}
