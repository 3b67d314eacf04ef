//! The operator's configuration of the runtime (`--config`, by default
//! /etc/substrat-oci/config.toml): which substrat policy every container
//! gets on top of its own configuration, where named policies are found,
//! and where run reports go. A container's author cannot change it; what
//! a container may add (`io.substrat.policy`) only adds restrictions.

use std::path::PathBuf;

use serde::Deserialize;

/// Where the configuration is read when `--config` is not given. Missing
/// is fine there (no policy, no reports); a `--config` that is missing is
/// an error.
pub const DEFAULT_CONFIG: &str = "/etc/substrat-oci/config.toml";

/// The annotation naming a policy to apply on top of the configuration.
pub const POLICY_ANNOTATION: &str = "io.substrat.policy";
/// The annotation naming the workspace inside (`${WORKSPACE}` of the
/// policy); the process's working directory when absent.
pub const WORKSPACE_ANNOTATION: &str = "io.substrat.workspace";

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// A policy every container gets on top of its configuration (a name:
    /// `NAME.toml` in `policy_dir`, else a built-in policy).
    pub policy: Option<String>,
    /// Where policy names (this file's and `io.substrat.policy`'s) are
    /// looked up before the built-ins.
    pub policy_dir: Option<PathBuf>,
    /// A run report per container, `DIR/ID.json`, written when it ends.
    pub report_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("not UTF-8")]
    NotText,
    #[error("{0}")]
    Toml(String),
    #[error("{key}: {reason}")]
    Value { key: &'static str, reason: String },
}

impl RuntimeConfig {
    /// Parses and checks the configuration's text.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError::NotText)?;
        let config: Self = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        if let Some(name) = &config.policy {
            check_policy_name(name).map_err(|reason| ConfigError::Value {
                key: "policy",
                reason,
            })?;
        }
        for (key, dir) in [
            ("policy_dir", &config.policy_dir),
            ("report_dir", &config.report_dir),
        ] {
            if dir.as_ref().is_some_and(|d| !d.is_absolute()) {
                return Err(ConfigError::Value {
                    key,
                    reason: "must be an absolute path".into(),
                });
            }
        }
        Ok(config)
    }
}

/// A policy is named, never given as a path: letters, digits, `-`, `_`.
/// A container's annotation must not reach a file the operator did not
/// put in `policy_dir`.
pub fn check_policy_name(name: &str) -> Result<(), String> {
    if substrat_policy::valid_role_name(name) && name.len() <= 64 {
        Ok(())
    } else {
        Err(format!(
            "policy `{}`: a policy name (letters, digits, `-`, `_`, at most 64), not a path",
            name.escape_debug()
        ))
    }
}
