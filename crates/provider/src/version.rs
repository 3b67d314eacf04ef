//! The oldest version of each CLI a provider is written for: its flags and
//! configuration keys are those of that version (the one the tests pin),
//! and an older CLI would reject them or, worse, ignore a switch that
//! keeps it quiet. A CLI that is older, or whose version could not be read,
//! fails each turn at once with a reason instead of running.

use crate::Provider;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionProblem {
    #[error(
        "the version of {cli} could not be read (`{cli} --version` failed when the daemon started); this daemon runs {cli} {oldest} or later"
    )]
    Unknown { cli: String, oldest: &'static str },
    #[error(
        "{cli} {found} is older than {oldest}, the oldest version this daemon runs (its flags and configuration are those of {oldest}); update it"
    )]
    TooOld {
        cli: String,
        found: String,
        oldest: &'static str,
    },
}

/// The first `N.N.N` in a `--version` line (`codex-cli 0.169.0`,
/// `2.1.330 (Claude Code)`, `0.61.0`).
pub fn version_numbers(text: &str) -> Option<[u64; 3]> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find_map(|word| {
            let mut parts = word.split('.');
            let numbers = [parts.next()?, parts.next()?, parts.next()?];
            let mut out = [0u64; 3];
            for (slot, part) in out.iter_mut().zip(numbers) {
                *slot = part.parse().ok()?;
            }
            Some(out)
        })
}

/// Whether `provider` can run turns, as far as its version says.
pub fn check_version(provider: &dyn Provider) -> Result<(), VersionProblem> {
    let Some(oldest) = provider.oldest_version() else {
        return Ok(());
    };
    let cli = provider.name().to_string();
    let found = provider
        .version()
        .and_then(|v| Some((v, version_numbers(v)?)));
    let Some((text, numbers)) = found else {
        return Err(VersionProblem::Unknown { cli, oldest });
    };
    match version_numbers(oldest) {
        Some(minimum) if numbers < minimum => Err(VersionProblem::TooOld {
            cli,
            found: text.to_string(),
            oldest,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClaudeCode;
    use std::path::Path;

    #[test]
    fn versions_are_read_from_each_clis_line() {
        assert_eq!(version_numbers("codex-cli 0.169.0"), Some([0, 169, 0]));
        assert_eq!(version_numbers("2.1.330 (Claude Code)"), Some([2, 1, 330]));
        assert_eq!(version_numbers("0.61.0"), Some([0, 61, 0]));
        assert_eq!(version_numbers("v10.2.3-beta"), Some([10, 2, 3]));
        assert_eq!(version_numbers("1.2 then 3.4.5"), Some([3, 4, 5]));
        assert_eq!(version_numbers("no version"), None);
        assert_eq!(version_numbers("99999999999999999999.1.1"), None);
    }

    #[test]
    fn an_older_or_unknown_version_is_refused_with_the_reason() {
        let claude = |version: Option<&str>| {
            ClaudeCode::new(Path::new("/opt/claude"), version.map(String::from))
        };
        assert_eq!(
            check_version(&claude(Some("2.1.330 (Claude Code)"))),
            Ok(())
        );
        assert_eq!(check_version(&claude(Some("2.2.0 (Claude Code)"))), Ok(()));
        assert_eq!(
            check_version(&claude(Some("2.0.999 (Claude Code)")))
                .unwrap_err()
                .to_string(),
            "claude 2.0.999 (Claude Code) is older than 2.1.330, the oldest version this daemon runs (its flags and configuration are those of 2.1.330); update it"
        );
        assert!(matches!(
            check_version(&claude(None)),
            Err(VersionProblem::Unknown { .. })
        ));
        assert!(matches!(
            check_version(&claude(Some("dev build"))),
            Err(VersionProblem::Unknown { .. })
        ));
    }
}
