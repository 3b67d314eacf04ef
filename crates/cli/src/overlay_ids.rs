//! An unprivileged overlay launch says which files of the workspace its
//! command cannot change (`substrat_sandbox::unmapped`: their group or
//! owner is not mapped in the sandbox, so overlayfs cannot copy them up and
//! a write fails with EOVERFLOW), before the command starts and again when
//! a command that failed left no changes.

use std::fmt::Write as _;
use std::path::Path;

use substrat_policy::text;
use substrat_sandbox::hostid::HostIds;
use substrat_sandbox::unmapped::{LauncherIds, SCAN_LIMIT, Unmapped, UnmappedEntry, scan};

/// The entries the overlay cannot change, when the launch is unprivileged
/// (a launch by root runs as subordinate ids with idmapped binds: not
/// judged here); the line saying so printed when there are any.
pub fn tell(workspace: &Path, host_ids: &HostIds, program: &str) -> Unmapped {
    if host_ids.subordinate().is_some() {
        return Unmapped::default();
    }
    let found = scan(workspace, &LauncherIds::of_this_process(), SCAN_LIMIT);
    if found.found > 0 {
        eprintln!("{program}: {}", reason_line(&found));
    }
    found
}

/// "N file(s) of the workspace belong to a group or owner ... (e.g. PATH:
/// group G); the command cannot change them through the overlay ...".
pub fn reason_line(found: &Unmapped) -> String {
    let count = if found.complete {
        format!("{} file(s)", found.found)
    } else {
        format!(
            "at least {} file(s) (of the first {} entries looked at)",
            found.found, found.scanned
        )
    };
    let examples: Vec<String> = found.examples.iter().map(example).collect();
    format!(
        "{count} of the workspace belong to a group or owner this unprivileged sandbox cannot map \
         (e.g. {}); the command cannot change them through the overlay (EOVERFLOW, \"Value too \
         large for defined data type\"): only your own uid and gid are mapped. Give them your \
         group (chgrp), or use `--workspace-mode direct`",
        examples.join(", ")
    )
}

/// "PATH: group G (NAME)", "PATH: owner U (NAME), group G".
fn example(entry: &UnmappedEntry) -> String {
    let mut out = text::escape_path(&entry.path).to_string();
    let mut sep = ':';
    if let Some(uid) = entry.uid {
        let name = nix::unistd::User::from_uid(uid.into()).ok().flatten();
        let _ = write!(out, "{sep} owner {uid}");
        if let Some(user) = name {
            let _ = write!(out, " ({})", text::escape_text(&user.name));
        }
        sep = ',';
    }
    if let Some(gid) = entry.gid {
        let name = nix::unistd::Group::from_gid(gid.into()).ok().flatten();
        let _ = write!(out, "{sep} group {gid}");
        if let Some(group) = name {
            let _ = write!(out, " ({})", text::escape_text(&group.name));
        }
    }
    out
}

/// What follows "no changes" when the turn wrote nothing: nothing for a
/// command that succeeded; the exit status of one that failed, and the
/// files it could not have changed when there are any.
pub fn no_changes_reason(exit_code: i32, found: &Unmapped) -> String {
    if exit_code == 0 {
        return String::new();
    }
    let mut reason = format!(" (the command exited with status {exit_code}");
    if found.found > 0 {
        let _ = write!(
            reason,
            "; {}{} file(s) of the workspace cannot be changed through this overlay, their group \
             or owner not mapped (EOVERFLOW), e.g. {}",
            if found.complete { "" } else { "at least " },
            found.found,
            found.examples.first().map(example).unwrap_or_default()
        );
    }
    reason.push(')');
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn found(complete: bool) -> Unmapped {
        Unmapped {
            found: 2,
            scanned: 10,
            complete,
            examples: vec![
                UnmappedEntry {
                    path: PathBuf::from("src/a\nb"),
                    uid: None,
                    gid: Some(4_000_000_000),
                },
                UnmappedEntry {
                    path: PathBuf::from("x"),
                    uid: Some(4_000_000_001),
                    gid: Some(4_000_000_000),
                },
            ],
        }
    }

    #[test]
    fn the_reason_line_counts_names_examples_and_escapes_paths() {
        let line = reason_line(&found(true));
        assert!(line.starts_with("2 file(s) of the workspace"), "{line}");
        assert!(line.contains("EOVERFLOW"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("group 4000000000"), "{line}");
        assert!(
            line.contains("x: owner 4000000001, group 4000000000"),
            "{line}"
        );
        let partial = reason_line(&found(false));
        assert!(partial.starts_with("at least 2 file(s) (of the first 10 entries"));
    }

    #[test]
    fn no_changes_is_explained_only_for_a_command_that_failed() {
        assert_eq!(no_changes_reason(0, &found(true)), "");
        assert_eq!(
            no_changes_reason(1, &Unmapped::default()),
            " (the command exited with status 1)"
        );
        let why = no_changes_reason(2, &found(true));
        assert!(why.contains("status 2; 2 file(s)"), "{why}");
        assert!(why.contains("EOVERFLOW"), "{why}");
    }
}
