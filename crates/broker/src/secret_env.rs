//! The daemon's secrets, by the environment variable that holds each: the
//! one registry every launch the daemon makes (agents' turns, cold, warm
//! or as containers; upstream servers) removes from the environment it
//! hands on, so no policy's `env.allow` (`*`, a pattern, the name itself)
//! can bring one into a sandbox. A leaf: it knows no other module.

/// Variables the daemon (or an agent CLI on its behalf) may read a
/// credential from, by name, with what each holds.
pub const FIXED: [(&str, &str); 7] = [
    (ANTHROPIC_API_KEY, "the Anthropic API's key"),
    (OPENAI_API_KEY, "the OpenAI API's key"),
    (GEMINI_API_KEY, "the Gemini API's key"),
    (
        "GOOGLE_API_KEY",
        "the Gemini API's key, as Google's tools name it",
    ),
    ("CODEX_API_KEY", "the OpenAI API's key, as Codex names it"),
    ("ANTHROPIC_AUTH_TOKEN", "an Anthropic bearer token"),
    (
        "SUBSTRAT_STATE",
        "the state database's address, a password in it",
    ),
];

/// Prefixes of whole families: libpq's connection settings (`PGHOST`,
/// `PGUSER`, `PGPASSWORD`, `PGPASSFILE`, `PGSSLKEY`, `PGSERVICEFILE`, ...:
/// the state database's address, password and TLS key files).
pub const PREFIXES: [(&str, &str); 1] = [("PG", "libpq's connection settings")];

pub const ANTHROPIC_API_KEY: &str = "ANTHROPIC_API_KEY";
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
pub const GEMINI_API_KEY: &str = "GEMINI_API_KEY";

/// The registry plus the variables the operator named for this daemon's
/// own credentials (`--roles-http-token-env`, an upstream server's
/// `bearer_token_env` and `header_env`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretEnv {
    named: std::collections::BTreeSet<String>,
}

impl SecretEnv {
    /// The registry and `named`.
    pub fn with_named<I, S>(named: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            named: named.into_iter().map(Into::into).collect(),
        }
    }

    /// Whether `name` holds one of the daemon's secrets.
    pub fn contains(&self, name: &str) -> bool {
        FIXED.iter().any(|(fixed, _)| *fixed == name)
            || PREFIXES.iter().any(|(prefix, _)| name.starts_with(prefix))
            || self.named.contains(name)
    }

    /// The names of this process's environment to remove from a launch's
    /// (the prefixes match by the names present).
    pub fn present(&self) -> Vec<std::ffi::OsString> {
        let mut names: Vec<std::ffi::OsString> = std::env::vars_os()
            .map(|(name, _)| name)
            .filter(|name| name.to_str().is_none_or(|n| self.contains(n)))
            .collect();
        // Named ones whatever this process has now: removal is harmless.
        names.extend(FIXED.iter().map(|(name, _)| (*name).into()));
        names.extend(self.named.iter().map(Into::into));
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_prefixed_and_named_variables_are_secret() {
        let env = SecretEnv::with_named(["ROLES_TOKEN"]);
        for name in [
            "ANTHROPIC_API_KEY",
            "GOOGLE_API_KEY",
            "SUBSTRAT_STATE",
            "PGPASSWORD",
            "PGSSLKEY",
            "ROLES_TOKEN",
        ] {
            assert!(env.contains(name), "{name}");
        }
        for name in ["PATH", "HOME", "SUBSTRAT_STATE_DIR", "LANG", "ROLES_TOKEN2"] {
            assert!(!env.contains(name), "{name}");
        }
    }
}
