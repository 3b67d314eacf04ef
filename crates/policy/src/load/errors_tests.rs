//! Every type error of a policy in one run, each at its place.

use super::*;

#[test]
fn every_type_error_is_reported_at_its_place() {
    let text = "version = 1\nextends = \"worker\"\nnetwork = \"bogus\"\ncolour = \"blue\"\n\n\
                [filesystem]\nbinds = [\n  { source = \"/usr\", mode = \"ro\" },\n  { source = \"/opt\" },\n  \
                { source = \"/srv\", mode = \"rx\" },\n]\n\n[rlimits]\nnofile = \"many\"\n";
    let errors = load_str(Path::new("bad.toml"), text, &LoadOptions::default()).unwrap_err();
    let found: Vec<(String, usize)> = errors
        .0
        .iter()
        .map(|e| (e.key_path.clone(), e.location.line))
        .collect();
    // In the order of the file.
    let want = [
        ("network", 3),
        ("colour", 4),
        ("filesystem.binds[1]", 9),
        ("filesystem.binds[2].mode", 10),
        ("rlimits.nofile", 14),
    ];
    let want: Vec<(String, usize)> = want.iter().map(|(k, l)| (k.to_string(), *l)).collect();
    assert_eq!(found, want);
}

#[test]
fn one_error_is_reported_once() {
    let text = "version = 1\n[rlimits]\nnofile = -1\n";
    let errors = load_str(Path::new("one.toml"), text, &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].key_path, "rlimits.nofile");
}

#[test]
fn a_missing_version_is_reported_beside_the_other_errors() {
    let text = "network = \"bogus\"\n";
    let errors = load_str(Path::new("nover.toml"), text, &LoadOptions::default()).unwrap_err();
    let mut keys: Vec<&str> = errors.0.iter().map(|e| e.key_path.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["", "network"], "{errors}");
    assert!(
        errors.0.iter().any(|e| e.message.contains("`version`")),
        "{errors}"
    );
}

/// A system prompt goes into every turn's command line, which exec cannot
/// give a NUL byte: such a policy is refused when loaded, not at each turn.
#[test]
fn a_system_prompt_with_a_nul_byte_is_refused() {
    let text = "version = 1\nextends = \"worker\"\n[persona]\nsystem_prompt = \"a\\u0000b\"\n";
    let errors = load_str(Path::new("nul.toml"), text, &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].key_path, "persona.system_prompt");
    assert_eq!(
        errors.0[0].message,
        "`persona.system_prompt` contains a NUL byte"
    );
}
