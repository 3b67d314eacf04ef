//! Errors for policy input. Every error names the file, line and column, the
//! key path it concerns and what is wrong, so a user can fix it without
//! reading our source.

use std::fmt;

use serde::Serialize;

use crate::location::Location;

/// What kind of mistake an input has. The kebab-case names are stable and
/// documented in docs/policy.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// Not valid TOML (or JSON for seccomp profiles).
    Syntax,
    /// A key the format does not know (typos land here, never in a default).
    UnknownKey,
    /// A missing required key.
    MissingKey,
    /// A value of the wrong type or an unknown enum value.
    WrongType,
    /// A number outside its documented range.
    OutOfRange,
    /// A path that must be absolute is relative, contains `..`, or uses an unknown variable.
    InvalidPath,
    /// A writable bind placed on or inside a protected path.
    ProtectedPathCovered,
    /// The named seccomp profile file does not exist.
    MissingSeccompProfile,
    /// The seccomp profile is not a valid OCI/Docker profile.
    InvalidSeccompProfile,
    /// `extends` names a missing policy, or forms a cycle, or nests too deep.
    Extends,
    /// `version` is not one this build understands.
    UnsupportedVersion,
    /// Any other semantic rule (documented with the key).
    Invalid,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Io => "io",
            Self::Syntax => "syntax",
            Self::UnknownKey => "unknown-key",
            Self::MissingKey => "missing-key",
            Self::WrongType => "wrong-type",
            Self::OutOfRange => "out-of-range",
            Self::InvalidPath => "invalid-path",
            Self::ProtectedPathCovered => "protected-path-covered",
            Self::MissingSeccompProfile => "missing-seccomp-profile",
            Self::InvalidSeccompProfile => "invalid-seccomp-profile",
            Self::Extends => "extends",
            Self::UnsupportedVersion => "unsupported-version",
            Self::Invalid => "invalid",
        }
    }
}

/// One problem in a policy (or a file it refers to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct PolicyError {
    pub kind: ErrorKind,
    pub location: Location,
    /// Dotted key path such as `filesystem.binds[2].source`; empty for the whole file.
    pub key_path: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(
        kind: ErrorKind,
        location: Location,
        key_path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            location,
            key_path: key_path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: error[{}]", self.location, self.kind.as_str())?;
        if !self.key_path.is_empty() {
            write!(f, " at `{}`", self.key_path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// All problems found in one policy; loading reports every one it can find.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl From<PolicyError> for PolicyErrors {
    fn from(err: PolicyError) -> Self {
        Self(vec![err])
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{err}")?;
        }
        Ok(())
    }
}
