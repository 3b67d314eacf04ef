//! Arguments for the launchers this program starts: each option and its
//! value as one argument, `--name=value`, so a value that starts with `-`
//! (a relative path, `-c.sock`) is never read as an option.

use std::ffi::{OsStr, OsString};

/// `--name=value`.
pub(crate) fn flag(name: &str, value: impl AsRef<OsStr>) -> OsString {
    let mut arg = OsString::from(name);
    arg.push("=");
    arg.push(value);
    arg
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_value_that_looks_like_an_option_stays_a_value() {
        assert_eq!(super::flag("--cwd", "-c.sock"), "--cwd=-c.sock");
        assert_eq!(super::flag("--env", "A=-b"), "--env=A=-b");
    }
}
