//! Arbitrary bytes as the git files the launcher reads from a workspace
//! another agent may have written: a gitfile (`.git` as a file) and a
//! repository's config, of which only the format is kept for the agent's
//! repository after a run. Invariants: parsing never panics; a gitfile's
//! path is a non-empty, trimmed piece of the input without NUL; the
//! minimal config holds only the format lines (nothing that makes git run
//! a program or fetch: no core settings beyond bare and filemode, no
//! remotes, no promisor, no includes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_sandbox::gitdir::{minimal_config, parse_gitfile};

fn allowed(line: &str) -> bool {
    let value_ok = |prefix: &str| {
        line.strip_prefix(prefix)
            .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
    };
    matches!(
        line,
        "[core]"
            | "\tbare = false"
            | "\tfilemode = true"
            | "\trepositoryformatversion = 0"
            | "\trepositoryformatversion = 1"
            | "[extensions]"
    ) || value_ok("\tobjectformat = ")
        || value_ok("\trefstorage = ")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Some(path) = parse_gitfile(text) {
        assert!(!path.is_empty() && !path.contains('\0'));
        assert_eq!(path, path.trim());
        assert!(text.contains(path));
    }
    let config = minimal_config(text);
    assert!(config.starts_with("[core]\n") && config.ends_with('\n'));
    for line in config.lines() {
        assert!(allowed(line), "unexpected line {line:?} from {text:?}");
    }
});
