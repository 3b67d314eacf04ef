//! Arbitrary bytes as the git files the launcher reads from a workspace
//! another agent may have written: a gitfile (`.git` as a file) and a
//! repository's config, of which only the format is kept for the agent's
//! repository after a run. Invariants: parsing never panics; a gitfile's
//! path is a non-empty, trimmed piece of the input without NUL; the
//! minimal config holds only the format lines (nothing that makes git run
//! a program or fetch: no core settings beyond bare and filemode, no
//! remotes, no promisor, no includes); a HEAD names a commit id or a ref
//! below `refs/` without `..`, and a ref's commit is 40 hex digits (the
//! agent's own git dir, read for `agent diff`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_sandbox::gitdir::{HeadTarget, loose_ref, minimal_config, packed_ref, parse_gitfile, parse_head};

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

fn commit_id(id: &str) -> bool {
    id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The agent's HEAD and refs, read for `agent diff`'s commit range: a
    // ref read stays below `refs/` of the agent's git dir.
    match parse_head(text) {
        Some(HeadTarget::Commit(id)) => assert!(commit_id(id)),
        Some(HeadTarget::Ref(name)) => {
            assert!(name.starts_with("refs/"));
            assert!(name.split('/').all(|c| !c.is_empty() && c != ".." && c != "."));
            assert!(!name.contains('\0') && !name.contains('\n'));
        }
        None => {}
    }
    if let Some(id) = loose_ref(text) {
        assert!(commit_id(id));
    }
    if let Some(id) = packed_ref(text, "refs/heads/main") {
        assert!(commit_id(id) && text.contains(&format!("{id} refs/heads/main")));
    }
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
