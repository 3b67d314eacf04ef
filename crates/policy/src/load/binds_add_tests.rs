//! `binds_add`: binds appended to the list in force after `extends`.

use std::path::Path;

use super::*;
use crate::check::check_policy;

fn targets(policy: &LoadedPolicy) -> Vec<String> {
    policy
        .policy
        .filesystem
        .binds
        .iter()
        .map(|b| b.target().to_string())
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn binds_add_appends_to_what_extends_gave_and_findings_point_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let child = write(
        dir.path(),
        "child.toml",
        "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = [\n  { source = \"${HOME}/.cargo\", mode = \"ro\" },\n  { source = \"${HOME}\", mode = \"rw\" },\n]\n",
    );
    let policy = load_file(&child, &LoadOptions::default()).unwrap();
    let worker = load_builtin("worker", &LoadOptions::default())
        .unwrap()
        .unwrap();
    let mut wanted = targets(&worker);
    wanted.extend(["${HOME}/.cargo".to_string(), "${HOME}".to_string()]);
    assert_eq!(targets(&policy), wanted);
    assert!(policy.policy.filesystem.binds_add.is_empty());
    // SBX003 (home writable) points at the added bind's line in the child.
    let finding = check_policy(&policy)
        .into_iter()
        .find(|f| f.rule_id == "SBX003")
        .unwrap();
    assert_eq!(
        (finding.location.file.as_path(), finding.location.line),
        (child.as_path(), 6)
    );
    assert_eq!(
        finding.key_path,
        format!("filesystem.binds[{}]", wanted.len() - 1)
    );
}

#[test]
fn binds_replaces_and_binds_add_appends_layer_by_layer() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "base.toml",
        "version = 1\n[filesystem]\nbinds = [{ source = \"/usr\", mode = \"ro\" }]\nbinds_add = [{ source = \"/opt/a\", mode = \"ro\" }]\n",
    );
    write(
        dir.path(),
        "mid.toml",
        "version = 1\nextends = \"base\"\n[filesystem]\nbinds_add = [{ source = \"/opt/b\", mode = \"ro\" }]\n",
    );
    let top = write(
        dir.path(),
        "top.toml",
        "version = 1\nextends = \"mid\"\n[filesystem]\nbinds_add = [{ source = \"/opt/c\", mode = \"ro\" }]\n",
    );
    let policy = load_file(&top, &LoadOptions::default()).unwrap();
    assert_eq!(targets(&policy), ["/usr", "/opt/a", "/opt/b", "/opt/c"]);
    // A layer's own `binds` replaces the list; its `binds_add` follows it.
    let reset = write(
        dir.path(),
        "reset.toml",
        "version = 1\nextends = \"mid\"\n[filesystem]\nbinds = [{ source = \"/srv\", mode = \"ro\" }]\nbinds_add = [{ source = \"/opt/d\", mode = \"ro\" }]\n",
    );
    let policy = load_file(&reset, &LoadOptions::default()).unwrap();
    assert_eq!(targets(&policy), ["/srv", "/opt/d"]);
}

#[test]
fn a_binds_add_that_is_no_list_is_an_error_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.toml",
        "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = \"/opt\"\n",
    );
    let errors = load_file(&bad, &LoadOptions::default()).unwrap_err();
    let first = &errors.0[0];
    assert_eq!(first.key_path, "filesystem.binds_add");
    assert_eq!(first.location.line, 4);
}

/// Found by review: an inherited `persona.script` resolved from the child's
/// directory ran a script planted beside the child.
#[test]
fn an_inherited_script_is_the_one_beside_the_policy_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("team")).unwrap();
    write(
        &dir.path().join("team"),
        "base.toml",
        "version = 1\nextends = \"worker\"\n[persona]\nscript = \"ir.lua\"\n",
    );
    let child = write(
        dir.path(),
        "child.toml",
        "version = 1\nextends = \"team/base.toml\"\n[persona]\ntimeout_ms = 500\n",
    );
    let loaded = load_file(&child, &LoadOptions::default()).unwrap();
    assert_eq!(
        loaded.policy.persona.script,
        Some(dir.path().join("team").join("ir.lua"))
    );
    // A script named by the child itself is beside the child.
    let own = write(
        dir.path(),
        "own.toml",
        "version = 1\nextends = \"team/base.toml\"\n[persona]\nscript = \"mine.lua\"\n",
    );
    let loaded = load_file(&own, &LoadOptions::default()).unwrap();
    assert_eq!(
        loaded.policy.persona.script,
        Some(dir.path().join("mine.lua"))
    );
}
