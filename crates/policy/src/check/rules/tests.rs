//! Each rule fires on a policy made to trip it, and the shipped ones pass.

use super::*;
use crate::load::{LoadOptions, load_builtin, load_str};
use std::path::Path;

/// A policy that extends the shipped worker with `body` on top.
fn worker_with(body: &str) -> LoadedPolicy {
    let text = format!("version = 1\nextends = \"worker\"\n{body}\n");
    load_str(Path::new("t.toml"), &text, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn rule_ids(p: &LoadedPolicy) -> Vec<&'static str> {
    check_policy(p).iter().map(|f| f.rule_id).collect()
}

fn binds(list: &str) -> String {
    format!("[filesystem]\nbinds = [{{ source = \"${{WORKSPACE}}\", mode = \"rw\" }}, {list}]")
}

/// Rule, and a policy (on top of worker) that must trigger it.
const TRIGGERS: &[(&str, &str)] = &[
    ("SBX001", "network = \"host\""),
    (
        "SBX002",
        "[filesystem]\nbinds = [{ source = \"/\", target = \"/host\", mode = \"rw\" }]",
    ),
    (
        "SBX003",
        "[filesystem]\nbinds = [{ source = \"${HOME}\", mode = \"rw\" }]",
    ),
    (
        "SBX004",
        "[filesystem]\nbinds = [{ source = \"/etc\", target = \"/mnt/etc\", mode = \"rw\" }]",
    ),
    (
        "SBX005",
        "@{ source = \"/var/run/docker.sock\", mode = \"ro\" }",
    ),
    ("SBX006", "@{ source = \"${HOME}/.ssh\", mode = \"ro\" }"),
    ("SBX007", "@{ source = \"/tmp/.X11-unix\", mode = \"ro\" }"),
    (
        "SBX008",
        "@{ source = \"/run/user/1000/bus\", mode = \"ro\" }",
    ),
    (
        "SBX009",
        "@{ source = \"${HOME}/.cursor/chats\", mode = \"rw\" }",
    ),
    ("SBX010", "[filesystem]\nprotected = [\".git\"]"),
    ("SBX011", "[filesystem]\nprotected = [\".cursor\"]"),
    ("SBX012", "[seccomp]\nprofile = \"unconfined\""),
    (
        "SBX013",
        "[seccomp]\nprofile = \"/PROFILES/allow-all.json\"",
    ),
    ("SBX014", "[seccomp]\nprofile = \"/PROFILES/ptrace.json\""),
    ("SBX015", "[seccomp]\nprofile = \"/PROFILES/clone3.json\""),
    ("SBX016", "landlock = \"off\""),
    ("SBX017", "landlock = \"best-effort\""),
    ("SBX018", "[namespaces]\nnested_userns = true"),
    ("SBX019", "[namespaces]\npid = false"),
    ("SBX020", "[cgroup]\npids_max = 1\n[cgroup.x]"),
    ("SBX021", "[cgroup]\nmemory_max = 1\n[cgroup.x]"),
    ("SBX022", "[cgroup]\ncpu_max = 1\n[cgroup.x]"),
    ("SBX023", "[env]\nallow = [\"GITHUB_TOKEN\"]"),
    ("SBX024", "[env]\nallow = [\"*\"]"),
    ("SBX025", "[mcp]\ncalls_per_minute = 1\n[mcp.x]"),
    ("SBX026", "[mcp]\ntool_cap = 41"),
    ("SBX027", "[mcp]\nmax_output_bytes = 1\n[mcp.x]"),
    ("SBX028", "[mcp]\ntool_steps_per_turn = 1\n[mcp.x]"),
    ("SBX029", "[mcp]\ninbox_depth = 1\n[mcp.x]"),
    ("SBX030", "[mcp]\nspawn_depth = 1\n[mcp.x]"),
    ("SBX031", "[tools]\nallow = [\"*\"]"),
    ("SBX032", "@{ source = \"/sys\", mode = \"ro\" }"),
    ("SBX033", "@{ source = \"/run\", mode = \"ro\" }"),
    ("SBX034", "@{ source = \"/home\", mode = \"ro\" }"),
    (
        "SBX035",
        "[filesystem]\nbinds = [{ source = \"/\", mode = \"ro\" }]",
    ),
    ("SBX036", "[rlimits]\ncore = \"1MiB\""),
    (
        "SBX037",
        "network = \"proxy\"\n[proxy]\nallow = [\"api.example.com\", \"*:443\"]",
    ),
    ("SBX038", "network = \"proxy\"\n[proxy]\nallow = []"),
    (
        "SBX039",
        "network = \"proxy\"\n[proxy]\nallow = [\"a.test\"]\ntest_allow_private = true",
    ),
    (
        "SBX040",
        "network = \"proxy\"\n[proxy]\nallow = [\"api.example.com\", \"metadata.google.internal\"]",
    ),
    ("SBX041", "[filesystem]\nallow_workspace_risk = true"),
    ("SBX042", "@{ source = \"${HOME}/.aws\", mode = \"ro\" }"),
    ("SBX043", "[model]\nhosted_tools = [\"web_search\"]"),
    ("SBX044", "@{ source = \"/etc/shadow\", mode = \"ro\" }"),
    ("SBX050", "[model]\nmodels = [\"claude-*\", \"**\"]"),
    ("SBX045", "@{ source = \"/etc/kubernetes\", mode = \"ro\" }"),
    ("SBX046", "@{ source = \"/etc/sudoers.d\", mode = \"ro\" }"),
    (
        "SBX048",
        "@{ source = \"/run/dbus/system_bus_socket\", mode = \"ro\", socket = true }",
    ),
];

/// Rules that judge what a source is on the host (a socket, a directory
/// holding sockets): their triggers are real sockets, in sockets_tests.
const HOST_TRIGGERED: &[&str] = &["SBX047", "SBX049"];

/// Writes the seccomp profiles the triggers name and returns their directory.
fn profiles() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, json: &str| std::fs::write(dir.path().join(name), json).unwrap();
    write(
        "allow-all.json",
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}"#,
    );
    write(
        "ptrace.json",
        r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","ptrace"],"action":"SCMP_ACT_ALLOW"}]}"#,
    );
    write(
        "clone3.json",
        r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","clone3"],"action":"SCMP_ACT_ALLOW"}]}"#,
    );
    dir
}

/// `@{...}` stands for "the worker's workspace bind plus this bind".
fn trigger_text(body: &str, dir: &Path) -> String {
    let body = body.replace("/PROFILES", &dir.display().to_string());
    if let Some(list) = body.strip_prefix('@') {
        return binds(list);
    }
    body.to_string()
}

#[test]
fn shipped_worker_has_no_findings() {
    let worker = load_builtin("worker", &LoadOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!(rule_ids(&worker), Vec::<&str>::new());
}

#[test]
fn every_rule_triggers_on_its_example() {
    let dir = profiles();
    let tested: Vec<&str> = TRIGGERS.iter().map(|(id, _)| *id).collect();
    for rule in POLICY_RULES {
        assert!(
            tested.contains(&rule.info.id) || HOST_TRIGGERED.contains(&rule.info.id),
            "{} has no trigger test",
            rule.info.id
        );
    }
    for (id, body) in TRIGGERS {
        let text = trigger_text(body, dir.path());
        let policy = if text.contains("[cgroup.x]") || text.contains("[mcp.x]") {
            absent_key_policy(&text)
        } else {
            worker_with(&text)
        };
        let found = check_policy(&policy);
        let hit = found.iter().find(|f| f.rule_id == *id);
        assert!(
            hit.is_some(),
            "{id} did not trigger on:\n{text}\nfound {found:#?}"
        );
        let hit = hit.unwrap();
        assert_eq!(
            hit.severity,
            POLICY_RULES
                .iter()
                .find(|r| r.info.id == *id)
                .unwrap()
                .info
                .severity
        );
        assert!(hit.location.line >= 1);
    }
}

/// For the rules about absent keys: a self-contained policy equal to the
/// worker except that the named section lacks the key. The marker
/// `[section.x]` says which section; the key written before it is the one
/// to leave out.
fn absent_key_policy(marker_text: &str) -> LoadedPolicy {
    let (section_line, rest) = marker_text.split_once('\n').unwrap();
    let key = rest.split_once(" =").unwrap().0;
    let worker = crate::builtin::policy("worker").unwrap();
    let mut out = String::new();
    let mut in_section = false;
    for line in worker.lines() {
        if line.starts_with('[') {
            in_section = line == section_line;
        }
        if in_section && line.starts_with(&format!("{key} ")) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    load_str(Path::new("t.toml"), &out, &LoadOptions::default()).unwrap()
}

#[test]
fn near_misses_do_not_trigger() {
    let clean = |body: &str| {
        let p = worker_with(body);
        let ids = rule_ids(&p);
        assert!(ids.is_empty(), "{body}\n-> {ids:?}");
    };
    // A proxy with named hosts is the intended use.
    clean(
        "network = \"proxy\"\n[proxy]\nallow = [\"api2.cursor.sh\", \"*.cursor.sh:443\"]\ndeny = [\"evil.cursor.sh\"]",
    );
    // Read-only system dirs and a per-agent chats dir are what the worker needs.
    clean(&binds("{ source = \"/etc/ssl/certs\", mode = \"ro\" }"));
    clean(&binds("{ source = \"/opt/tool\", mode = \"ro\" }"));
    clean(&binds(
        "{ source = \"${HOME}/.substrat/agents/${AGENT_ID}/chats\", target = \"${HOME}/.cursor/chats\", mode = \"rw\" }",
    ));
    clean(&binds(
        "{ source = \"/srv/cache\", target = \"/cache\", mode = \"rw\" }",
    ));
    clean(&binds("{ source = \"${HOME}/.cache/pip\", mode = \"ro\" }"));
    clean("[filesystem]\nprotected = [\".cursor/\", \".git\"]");
    clean("[env]\nallow = [\"LANG\", \"MONKEY_BUSINESS_LEVEL\"]\n");
    clean("[mcp]\ntool_cap = 40");
    assert!(
        looks_secret("AWS_SECRET_ACCESS_KEY")
            && looks_secret("GH_CREDENTIALS")
            && looks_secret("SECRET_*")
    );
    assert!(!looks_secret("KEYBOARD_LAYOUT") && !looks_secret("PATH") && !looks_secret("NPM_*"));
}

#[test]
fn reviewer_and_strict_pass_fail_on_high() {
    for name in ["worker", "reviewer", "strict"] {
        let p = load_builtin(name, &LoadOptions::default())
            .unwrap()
            .unwrap();
        let worst = check_policy(&p).iter().map(|f| f.severity).max();
        assert!(
            worst.is_none_or(|s| s < Severity::High),
            "{name}: {:?}",
            check_policy(&p)
        );
    }
}

#[test]
fn host_network_and_writable_home_both_found() {
    let p = worker_with(
        "network = \"host\"\n[filesystem]\nbinds = [{ source = \"${HOME}\", mode = \"rw\" }]",
    );
    let ids = rule_ids(&p);
    assert!(
        ids.contains(&"SBX001") && ids.contains(&"SBX003"),
        "{ids:?}"
    );
    let f = check_policy(&p);
    let home = f.iter().find(|f| f.rule_id == "SBX003").unwrap();
    assert_eq!(home.key_path, "filesystem.binds[0]");
    assert_eq!(
        (home.location.file.as_path(), home.location.line),
        (Path::new("t.toml"), 5)
    );
}

#[test]
fn private_endpoint_names_are_found_and_public_look_alikes_are_not() {
    let allow = [
        "localhost:8080",
        "*.internal",
        "printer.local",
        "nas.home.arpa",
        "git.corp",
        "internal.example.com",
        "local.example.org:443",
        "pypi.org",
        "*.lan.example.com",
    ];
    let list: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    let p = worker_with(&format!(
        "network = \"proxy\"\n[proxy]\nallow = [{}]",
        list.join(", ")
    ));
    let messages: Vec<String> = check_policy(&p)
        .into_iter()
        .filter(|f| f.rule_id == "SBX040")
        .map(|f| f.message)
        .collect();
    let named: Vec<&str> = messages
        .iter()
        .filter_map(|m| m.split('`').nth(1))
        .collect();
    assert_eq!(
        named,
        [
            "localhost:8080",
            "*.internal",
            "printer.local",
            "nas.home.arpa",
            "git.corp"
        ]
    );
}

#[test]
fn credentials_in_any_mode_and_writable_startup_files_are_high() {
    let ids = |list: &str| rule_ids(&worker_with(&binds(list)));
    for list in [
        "{ source = \"${HOME}/.kube\", mode = \"ro\" }",
        "{ source = \"${HOME}/.docker/config.json\", mode = \"ro\" }",
        "{ source = \"${HOME}/.config\", mode = \"ro\" }",
        "{ source = \"/home/ana/.netrc\", mode = \"ro\" }",
        "{ source = \"${HOME}/.bashrc\", mode = \"rw\" }",
    ] {
        assert_eq!(ids(list), ["SBX042"], "{list}");
    }
    // ~/.cargo holds the registry token (credentials.toml); its bin does not.
    assert_eq!(
        ids("{ source = \"${HOME}/.cargo\", mode = \"ro\" }"),
        ["SBX042"]
    );
    // A startup file read-only, or a tool's own tree, is no finding.
    for list in [
        "{ source = \"${HOME}/.bashrc\", mode = \"ro\" }",
        "{ source = \"${HOME}/.cargo/bin\", mode = \"ro\" }",
        "{ source = \"${HOME}/.rustup\", mode = \"ro\" }",
        "{ source = \"/opt/.aws-sdk\", mode = \"ro\" }",
        "{ source = \"${HOME}/.gitconfig\", mode = \"ro\" }",
    ] {
        assert_eq!(ids(list), Vec::<&str>::new(), "{list}");
    }
}

#[test]
fn sbx050_flags_every_pattern_that_matches_every_model() {
    for pattern in ["*", "**", "?*", "*?*", "*?", "[!~]*", "*[!~]*"] {
        assert!(super::agent::matches_every_model(pattern), "{pattern}");
    }
    for pattern in ["claude-*", "??*", "*-*", "[a-z]*", "gpt-5", "*a*"] {
        assert!(!super::agent::matches_every_model(pattern), "{pattern}");
    }
}
