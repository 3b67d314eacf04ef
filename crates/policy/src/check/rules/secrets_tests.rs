//! The host's secret places: each found where it is bound, through a
//! parent that holds it, and through a source that resolves to it.

use super::secrets::{HOST_SECRET_PLACES, exposes};
use super::*;
use crate::load::{LoadOptions, load_str};
use std::path::Path;

fn with_bind(source: &str) -> LoadedPolicy {
    let text = format!(
        "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = [{{ source = \"{source}\", target = \"/mnt/x\", mode = \"ro\" }}]\n"
    );
    load_str(Path::new("t.toml"), &text, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn rule_ids(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().map(|f| f.rule_id).collect()
}

/// A bound place, as text, is found by its rule at the rule's severity.
#[test]
fn every_secret_place_is_found_at_its_severity() {
    for place in HOST_SECRET_PLACES {
        // A glob stands for every file it matches: bind one of them.
        let source = place.path.replace('*', "ed25519");
        let found = check_policy(&with_bind(&source));
        let hit = found.iter().find(|f| f.rule_id == place.rule);
        let rule = POLICY_RULES.iter().find(|r| r.info.id == place.rule);
        assert!(
            hit.is_some_and(|h| Some(h.severity) == rule.map(|r| r.info.severity)
                && h.message.contains(place.path)),
            "{source}: {found:#?}"
        );
    }
}

/// The places other rules own are found by them (the table says so).
#[test]
fn secrets_of_homes_and_runtimes_are_found_by_their_own_rules() {
    for (source, rule) in [
        ("/root/.aws", "SBX042"),
        ("/root/.docker/config.json", "SBX042"),
        ("/root/.kube", "SBX042"),
        ("/etc/containerd", "SBX005"),
        ("/root/.ssh", "SBX006"),
    ] {
        let found = rule_ids(&check_policy(&with_bind(source)));
        assert!(found.contains(&rule), "{source}: {found:?}");
    }
}

#[test]
fn a_parent_of_secret_places_exposes_them_all() {
    let found = rule_ids(&check_policy(&with_bind("/etc")));
    for rule in ["SBX044", "SBX045", "SBX046"] {
        assert!(found.contains(&rule), "/etc: {found:?}");
    }
    let root = "version = 1\nextends = \"worker\"\n[filesystem]\nbinds = [{ source = \"/\", mode = \"ro\" }]\n";
    let root = load_str(Path::new("t.toml"), root, &LoadOptions::default()).unwrap();
    let found = rule_ids(&check_policy(&root));
    for rule in ["SBX035", "SBX044", "SBX045", "SBX046"] {
        assert!(found.contains(&rule), "/: {found:?}");
    }
    // Near misses: a sibling, a public key, a certificate directory.
    for source in [
        "/etc/ssl/certs",
        "/etc/ssh/ssh_host_rsa_key.pub",
        "/etc/shadowsocks",
    ] {
        let found = rule_ids(&check_policy(&with_bind(source)));
        for rule in ["SBX044", "SBX045", "SBX046"] {
            assert!(!found.contains(&rule), "{source}: {found:?}");
        }
    }
}

/// A source that resolves to a secret place is judged as that place
/// (`check` passes what the launch resolves): as text it is harmless.
#[test]
fn a_source_is_judged_as_it_resolves() {
    let policy = with_bind("/srv/innocent");
    let bind = policy.policy.filesystem.binds.len() - 1;
    assert!(!rule_ids(&check_policy(&policy)).contains(&"SBX044"));
    let mut resolved = vec![None; bind + 1];
    resolved[bind] = Some(std::path::PathBuf::from("/etc"));
    let found = check_policy_resolved(&policy, &resolved);
    let hit = found.iter().find(|f| f.rule_id == "SBX044");
    assert!(
        hit.is_some_and(|h| h.message.contains("resolves to `/etc`")
            && h.key_path == format!("filesystem.binds[{bind}]")),
        "{found:#?}"
    );
    // Writable, the resolved /etc is a writable system directory too.
    assert!(
        rule_ids(&found).contains(&"SBX004") || !policy.policy.filesystem.binds[bind].writable()
    );
    // Judged once per rule and bind, however many views trigger it.
    let sbx044 = found.iter().filter(|f| f.rule_id == "SBX044").count();
    assert_eq!(sbx044, 1);
}

#[test]
fn places_match_by_whole_components_and_globs() {
    let e = |s: &str, p: &str| exposes(Path::new(s), Path::new(p));
    assert!(e("/", "/etc/shadow"));
    assert!(e("/etc", "/etc/shadow"));
    assert!(e("/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_*_key"));
    assert!(e("/etc/ssh", "/etc/ssh/ssh_host_*_key"));
    assert!(!e("/etc/ssh/ssh_config", "/etc/ssh/ssh_host_*_key"));
    assert!(!e("/etc/shadowx", "/etc/shadow"));
    assert!(e("/etc/kubernetes/pki/ca.key", "/etc/kubernetes"));
}
