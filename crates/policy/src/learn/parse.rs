//! Bytes the observed command controls, read by the observer from its
//! memory: a path (NUL-terminated, at most `PATH_MAX`), a socket address
//! (`struct sockaddr`, as `connect` was given it). Both come from a process
//! that may lie: a bad value is an error, never a panic, and a path is only
//! a name, resolved lexically here (the kernel's walk is not repeated).

use std::ffi::OsStr;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Longest path the kernel takes (`PATH_MAX`, the NUL included).
pub const PATH_MAX: usize = 4096;

/// Longest socket address read (`struct sockaddr_storage`).
pub const SOCKADDR_MAX: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no NUL within {PATH_MAX} bytes")]
    Unterminated,
    #[error("an empty path")]
    Empty,
    #[error("a socket address of {0} bytes is too short for its family")]
    ShortAddress(usize),
}

/// The path at the start of `bytes` (up to its NUL), as the kernel would
/// take it: empty and unterminated names are errors (the kernel refuses
/// them too; `AT_EMPTY_PATH` calls name no path).
pub fn c_path(bytes: &[u8]) -> Result<PathBuf, ParseError> {
    let window = &bytes[..bytes.len().min(PATH_MAX)];
    let end = window
        .iter()
        .position(|b| *b == 0)
        .ok_or(ParseError::Unterminated)?;
    if end == 0 {
        return Err(ParseError::Empty);
    }
    Ok(PathBuf::from(OsStr::from_bytes(&window[..end])))
}

/// `path` made absolute against `base` (the caller's working directory or
/// the directory its `dirfd` names) and normalized lexically: `.` dropped,
/// `..` taking one component off (never above `/`).
pub fn absolute(base: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut out = PathBuf::from("/");
    for part in joined.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Where a `connect` went, as a person reads it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Destination {
    /// `tcp-or-udp ADDRESS:PORT` (the socket's type is not in the address).
    Inet(String),
    /// A Unix socket by path, or `@NAME` for an abstract one.
    Unix(String),
    /// Another family, by number.
    Other(u16),
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Inet(a) => write!(f, "{a}"),
            Destination::Unix(p) => write!(f, "unix:{p}"),
            Destination::Other(family) => write!(f, "family {family}"),
        }
    }
}

const AF_UNIX: u16 = 1;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// A `struct sockaddr` of `bytes` (as long as `connect`'s length said,
/// at most `SOCKADDR_MAX`). Unix names are escaped for people.
pub fn sockaddr(bytes: &[u8]) -> Result<Destination, ParseError> {
    let bytes = &bytes[..bytes.len().min(SOCKADDR_MAX)];
    let short = || ParseError::ShortAddress(bytes.len());
    let family = u16::from_ne_bytes([
        *bytes.first().ok_or_else(short)?,
        *bytes.get(1).ok_or_else(short)?,
    ]);
    let port = || -> Result<u16, ParseError> {
        Ok(u16::from_be_bytes([
            *bytes.get(2).ok_or_else(short)?,
            *bytes.get(3).ok_or_else(short)?,
        ]))
    };
    match family {
        AF_INET => {
            let a: [u8; 4] = bytes
                .get(4..8)
                .ok_or_else(short)?
                .try_into()
                .map_err(|_| short())?;
            Ok(Destination::Inet(format!(
                "{}:{}",
                Ipv4Addr::from(a),
                port()?
            )))
        }
        AF_INET6 => {
            let a: [u8; 16] = bytes
                .get(8..24)
                .ok_or_else(short)?
                .try_into()
                .map_err(|_| short())?;
            Ok(Destination::Inet(format!(
                "[{}]:{}",
                Ipv6Addr::from(a),
                port()?
            )))
        }
        AF_UNIX => {
            let name = &bytes[2..];
            let text = match name.first() {
                None => String::new(),
                Some(0) => {
                    let rest = &name[1..];
                    format!("@{}", crate::text::escape_bytes(rest))
                }
                Some(_) => {
                    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                    crate::text::escape_bytes(&name[..end]).into_owned()
                }
            };
            Ok(Destination::Unix(text))
        }
        other => Ok(Destination::Other(other)),
    }
}
