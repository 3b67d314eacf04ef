//! `check --prove`: the battery really runs. Deliberately weakened
//! policies make exactly the expected attacks escape; a probe that cannot
//! start is an error, never held.

use super::*;

/// `check --prove --format json` of `policy` (a path or a built-in name):
/// the policy's report.
fn prove(policy: &str, backend: &str) -> Value {
    prove_as(policy, backend, &[])
}

/// The same, with more arguments (`--warm`).
fn prove_as(policy: &str, backend: &str, more: &[&str]) -> Value {
    let mut args = vec!["check", "--prove", "--backend", backend, "--format", "json"];
    args.extend(more);
    args.push(policy);
    let report = stdout_json(&substrat_proving(&args));
    report["policies"][0].clone()
}

fn verdicts(report: &Value, verdict: &str) -> Vec<String> {
    report["proofs"][0]["attacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["verdict"] == verdict)
        .map(|a| a["attack"].as_str().unwrap().to_string())
        .collect()
}

fn findings(report: &Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["rule_id"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn weakened(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("version = 1\nextends = \"worker\"\n{body}")).unwrap();
    path.display().to_string()
}

#[test]
fn the_shipped_worker_holds_against_every_attack() {
    for backend in backends_for("the_shipped_worker_holds_against_every_attack") {
        let report = prove("worker", backend);
        let proof = &report["proofs"][0];
        assert_eq!(proof["status"], "ran", "{backend}: {proof}");
        assert_eq!(proof["backend"], backend);
        assert_eq!(
            verdicts(&report, "escaped"),
            Vec::<String>::new(),
            "{backend}: {proof}"
        );
        assert_eq!(
            verdicts(&report, "error"),
            Vec::<String>::new(),
            "{backend}: {proof}"
        );
        assert_eq!(
            verdicts(&report, "not-attempted"),
            Vec::<String>::new(),
            "{backend}: {proof}"
        );
        assert!(verdicts(&report, "held").len() >= 33, "{backend}: {proof}");
        assert_eq!(findings(&report), Vec::<(String, String)>::new());
    }
}

#[test]
fn weakened_policies_make_exactly_the_expected_attacks_escape() {
    let dir = tempfile::tempdir().unwrap();
    let seccomp = dir.path().join("keyctl.json");
    let mut profile: Value =
        serde_json::from_slice(&std::fs::read(repo().join("seccomp/default.json")).unwrap())
            .unwrap();
    profile["syscalls"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"names": ["keyctl"], "action": "SCMP_ACT_ALLOW"}));
    std::fs::write(&seccomp, profile.to_string()).unwrap();
    let host_address = {
        let policy = weakened(dir.path(), "probe-host", "network = \"host\"\n");
        let report = prove(&policy, "native");
        verdicts(&report, "escaped").contains(&"tcp-host-address".to_string())
            || verdicts(&report, "not-applicable").contains(&"tcp-host-address".to_string())
    };
    assert!(host_address);
    // Name, policy body, the attacks that must escape, the findings.
    type Case = (
        &'static str,
        String,
        Vec<&'static str>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "hostnet",
            "network = \"host\"\n".into(),
            vec!["tcp-host-loopback", "tcp-host-address"],
            vec![("PRV016", "high"), ("SBX001", "high")],
        ),
        (
            "nocursor",
            "[filesystem]\nprotected = [\".git/hooks/\", \".git/config\"]\n".into(),
            vec!["mcp-config-write"],
            vec![("PRV013", "high"), ("SBX010", "high")],
        ),
        (
            "keyctl",
            format!("[seccomp]\nprofile = \"{}\"\n", seccomp.display()),
            vec!["keyctl"],
            vec![("PRV022", "high"), ("SBX014", "high")],
        ),
    ];
    for backend in backends_for("weakened_policies_make_exactly_the_expected_attacks_escape") {
        for (name, body, escaped, wanted) in &cases {
            let report = prove(&weakened(dir.path(), name, body), backend);
            let mut got = verdicts(&report, "escaped");
            let mut escaped: Vec<String> = escaped.iter().map(|s| s.to_string()).collect();
            // A host with loopback only has no address to reach.
            if verdicts(&report, "not-applicable").contains(&"tcp-host-address".to_string()) {
                escaped.retain(|a| a != "tcp-host-address");
            }
            got.sort();
            escaped.sort();
            assert_eq!(got, escaped, "{name} on {backend}: {report}");
            let mut found = findings(&report);
            found.dedup();
            let wanted: Vec<(String, String)> = wanted
                .iter()
                .map(|(r, s)| (r.to_string(), s.to_string()))
                .collect();
            assert_eq!(found, wanted, "{name} on {backend}");
        }
    }
}

/// Without a seccomp filter the attacks that need a target (a child
/// process, a terminal) or valid arguments really happen: each goes
/// through. Before, they failed for want of a target (EFAULT, ENOTTY,
/// EINVAL) and were taken for refusals.
#[test]
fn attacks_with_real_targets_go_through_when_nothing_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let policy = weakened(
        dir.path(),
        "unconfined",
        "[seccomp]\nprofile = \"unconfined\"\n",
    );
    for backend in backends_for("attacks_with_real_targets_go_through_when_nothing_refuses") {
        let report = prove(&policy, backend);
        let escaped = verdicts(&report, "escaped");
        for attack in [
            "ptrace",
            "process-vm-writev",
            "tiocsti",
            "tiocsetd",
            "keyctl",
            "perf-event-open",
            "userfaultfd",
        ] {
            assert!(
                escaped.contains(&attack.to_string()),
                "{backend}: {attack}: {report}"
            );
        }
        assert_eq!(
            verdicts(&report, "not-attempted"),
            Vec::<String>::new(),
            "{backend}: {report}"
        );
    }
}

#[test]
fn an_escape_the_static_audit_did_not_expect_is_critical() {
    // A bind of a host directory outside every rule's list: the static
    // audit sees nothing, the proof reads the host file through it.
    let dir = tempfile::tempdir().unwrap();
    let policy = weakened(
        dir.path(),
        "tmpread",
        "[filesystem]\nbinds_add = [{ source = \"/tmp\", target = \"/hosttmp\", mode = \"ro\" }]\n",
    );
    let out = substrat_proving(&["check", "--prove", "--fail-on", "critical", &policy]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let report = prove(&policy, "native");
    // The battery's host file is under /tmp, so it shows at /hosttmp/...
    // (the prover looks where the plan's binds put it); read-only, so
    // nothing is written.
    assert_eq!(verdicts(&report, "escaped"), ["read-outside"], "{report}");
    // The host's /tmp may hold other programs' sockets (SBX049, medium):
    // what runs beside this test decides, not the policy's text.
    let found: Vec<(String, String)> = findings(&report)
        .into_iter()
        .filter(|(id, _)| id != "SBX049")
        .collect();
    assert_eq!(found, [("PRV010".to_string(), "critical".to_string())]);
}

#[test]
fn a_probe_that_cannot_start_is_an_error_never_held() {
    let dir = tempfile::tempdir().unwrap();
    // A seccomp profile without execve: the probe cannot even be started.
    let mut profile: Value =
        serde_json::from_slice(&std::fs::read(repo().join("seccomp/default.json")).unwrap())
            .unwrap();
    for rule in profile["syscalls"].as_array_mut().unwrap() {
        if let Some(names) = rule["names"].as_array_mut() {
            names.retain(|n| n != "execve" && n != "execveat");
        }
    }
    let seccomp = dir.path().join("noexec.json");
    std::fs::write(&seccomp, profile.to_string()).unwrap();
    let policy = weakened(
        dir.path(),
        "noexec",
        &format!("[seccomp]\nprofile = \"{}\"\n", seccomp.display()),
    );
    let report = prove(&policy, "native");
    let proof = &report["proofs"][0];
    assert_eq!(proof["status"], "failed", "{proof}");
    assert!(
        proof["reason"]
            .as_str()
            .unwrap()
            .contains("could not start"),
        "{proof}"
    );
    assert_eq!(verdicts(&report, "held"), Vec::<String>::new());
    assert_eq!(
        findings(&report),
        [("PRV000".to_string(), "critical".to_string())]
    );
    let out = substrat_proving(&["check", "--prove", "--fail-on", "high", &policy]);
    assert_eq!(code(&out), 1);
}

#[test]
fn a_host_that_cannot_build_the_sandbox_is_shown_refused_not_held() {
    let dir = tempfile::tempdir().unwrap();
    // A bind whose source is missing: the launcher refuses (exit 2).
    let policy = weakened(
        dir.path(),
        "missing",
        "[filesystem]\nbinds_add = [{ source = \"/nonexistent-substrat-prove\", mode = \"ro\" }]\n",
    );
    let report = prove(&policy, "native");
    let proof = &report["proofs"][0];
    assert_eq!(proof["status"], "refused-to-launch", "{proof}");
    assert_eq!(verdicts(&report, "held"), Vec::<String>::new());
    assert_eq!(
        findings(&report),
        [("PRV001".to_string(), "medium".to_string())]
    );
}

/// A warm sandbox's second turn (after a first that ran the battery and
/// left its fork bomb's children) meets exactly the walls of a cold
/// launch: every attack's verdict the same, for the shipped worker and for
/// a weakened policy whose escape must show in both.
#[test]
fn a_warm_turn_is_judged_exactly_as_a_cold_launch() {
    let dir = tempfile::tempdir().unwrap();
    let nocursor = weakened(
        dir.path(),
        "nocursor",
        "[filesystem]\nprotected = [\".git/hooks/\", \".git/config\"]\n",
    );
    for (backend, policy) in backends_for("a_warm_turn_is_judged_exactly_as_a_cold_launch")
        .into_iter()
        .flat_map(|b| [(b, "worker"), (b, nocursor.as_str())])
    {
        let cold = prove(policy, backend);
        let warm = prove_as(policy, backend, &["--warm"]);
        let proof = &warm["proofs"][0];
        assert_eq!(proof["status"], "ran", "{policy}: {proof}");
        assert_eq!(
            proof["backend"],
            format!("{backend}, warm turn 2,"),
            "{proof}"
        );
        for verdict in [
            "held",
            "escaped",
            "not-attempted",
            "not-applicable",
            "error",
        ] {
            assert_eq!(
                verdicts(&warm, verdict),
                verdicts(&cold, verdict),
                "{policy}: {verdict}\nwarm: {warm}\ncold: {cold}"
            );
        }
        if policy != "worker" {
            assert_eq!(verdicts(&warm, "escaped"), ["mcp-config-write"]);
        }
    }
}

/// `dir/name` -> `to`, as an absolute link and as one climbing with `..`
/// to `/` first (`../../../to`): the launch follows both.
fn links_to(dir: &Path, name: &str, to: &Path) -> [String; 2] {
    let absolute = dir.join(name);
    std::os::unix::fs::symlink(to, &absolute).unwrap();
    let deep = dir.join(format!("{name}-deep/a/b"));
    std::fs::create_dir_all(&deep).unwrap();
    let up = "../".repeat(deep.canonicalize().unwrap().components().count() - 1);
    let relative = deep.join("up");
    std::os::unix::fs::symlink(format!("{up}{}", to.display()), &relative).unwrap();
    assert!(relative.canonicalize().unwrap() == to.canonicalize().unwrap());
    [absolute, relative].map(|p| p.display().to_string())
}

/// Bind sources are judged where the launch resolves them: a link to
/// /etc is /etc to the static audit (SBX044, however it is spelt), and a
/// link to the prover's temporary directory shows its host file, which
/// the battery then looks for there (read-outside escapes).
#[test]
fn bind_sources_are_judged_and_proven_where_they_resolve() {
    let dir = tempfile::tempdir().unwrap();
    let etc = links_to(dir.path(), "etc", Path::new("/etc"));
    let tmp = links_to(
        dir.path(),
        "tmp",
        &std::env::temp_dir().canonicalize().unwrap(),
    );
    let bind = |source: &str| {
        format!(
            "[filesystem]\nbinds_add = [{{ source = \"{source}\", target = \"/hostdir\", mode = \"ro\" }}]\n"
        )
    };
    for (i, source) in etc.iter().enumerate() {
        let policy = weakened(dir.path(), &format!("etc{i}"), &bind(source));
        let report = stdout_json(&substrat(&["check", "--format", "json", &policy]));
        let found = findings(&report["policies"][0]);
        assert!(
            found.contains(&("SBX044".to_string(), "critical".to_string())),
            "{source}: {found:?}"
        );
    }
    for (i, source) in tmp.iter().enumerate() {
        let policy = weakened(dir.path(), &format!("tmp{i}"), &bind(source));
        let report = prove(&policy, "native");
        assert_eq!(
            verdicts(&report, "escaped"),
            ["read-outside"],
            "{source}: {report}"
        );
    }
}

/// A host bind mount of `/etc` elsewhere is `/etc` to `check`: judged
/// by its place in the filesystem, not by its path's text.
#[test]
fn a_bind_mount_alias_of_etc_is_judged_as_etc() {
    let test = "a_bind_mount_alias_of_etc_is_judged_as_etc";
    let dir = tempfile::tempdir().unwrap();
    let alias = dir.path().join("alias");
    std::fs::create_dir(&alias).unwrap();
    let policy = weakened(
        dir.path(),
        "alias",
        &format!(
            "[filesystem]\nbinds_add = [{{ source = \"{}\", target = \"/hostdir\", mode = \"ro\" }}]\n",
            alias.display()
        ),
    );
    let script = format!(
        "mount --bind /etc '{}' || exit 99; exec '{}' check --format json '{policy}'",
        alias.display(),
        env!("CARGO_BIN_EXE_substrat-sandbox"),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    if code(&out) == 99 || out.stderr.starts_with(b"unshare:") {
        println!(
            "SKIPPED {test}: cannot bind mount here: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let report = stdout_json(&out);
    let found = findings(&report["policies"][0]);
    assert!(
        found.contains(&("SBX044".to_string(), "critical".to_string())),
        "{found:?}"
    );
}

/// `(kind, cold verdict, warm verdict)` of a `--warm` proof's `lasts`.
fn lasts_of(report: &Value) -> Vec<(String, String, String)> {
    let lasts = report["proofs"][0]["lasts"].as_array().unwrap();
    lasts
        .iter()
        .map(|l| {
            let verdict = |pair: &str| l[pair]["verdict"].as_str().unwrap().to_string();
            let kind = l["kind"].as_str().unwrap().to_string();
            (kind, verdict("cold"), verdict("warm"))
        })
        .collect()
}

/// `--warm` says what of one turn lasts into the next, beside a pair of
/// cold launches, for each kind of docs/check.md's table: for the shipped
/// worker exactly its files in /tmp and home (/dev/shm and POSIX message
/// queues cannot be made under its Landlock rules); with Landlock off, a
/// message queue lasts under bwrap only, as documented. Nothing lasts
/// cold; every process of a turn is gone in the next.
#[test]
fn what_lasts_between_warm_turns_is_what_the_docs_say() {
    let dir = tempfile::tempdir().unwrap();
    let nolandlock = weakened(dir.path(), "nolandlock", "landlock = \"off\"\n");
    let (lasts, gone) = ("lasts (documented)", "gone (documented)");
    let refused = "not made (EACCES)";
    for backend in backends_for("what_lasts_between_warm_turns_is_what_the_docs_say") {
        let report = prove_as("worker", backend, &["--warm"]);
        let want = [
            ("tmp-file", gone, lasts),
            ("home-file", gone, lasts),
            ("shm-file", refused, refused),
            ("sysv-shm", gone, gone),
            ("sysv-msg", gone, gone),
            ("sysv-sem", gone, gone),
            ("posix-mqueue", refused, refused),
            ("process", gone, gone),
            ("abstract-socket", gone, gone),
        ]
        .map(|(k, c, w)| (k.to_string(), c.to_string(), w.to_string()));
        assert_eq!(lasts_of(&report), want, "{backend}: {report}");
        assert_eq!(findings(&report), Vec::<(String, String)>::new());
        let out = substrat_proving(&["check", "--prove", "--warm", "--backend", backend, "worker"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("what lasts to the next (docs/check.md)"),
            "{text}"
        );
        let tmp = text
            .lines()
            .find(|l| l.trim_start().starts_with("tmp-file"));
        assert!(
            tmp.is_some_and(|l| l.contains(gone) && l.ends_with(lasts)),
            "{backend}: {text}"
        );
        // Without Landlock a message queue can be made: the native turn
        // server removes it, bwrap's helper cannot.
        let report = prove_as(&nolandlock, backend, &["--warm"]);
        let mqueue = lasts_of(&report)
            .into_iter()
            .find(|(kind, ..)| kind == "posix-mqueue")
            .unwrap();
        let warm = if backend == "bwrap" { lasts } else { gone };
        assert_eq!(
            (mqueue.1.as_str(), mqueue.2.as_str()),
            (gone, warm),
            "{backend}"
        );
        let failed: Vec<&Value> = report["proofs"][0]["lasts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["cold"]["failed"] == true || l["warm"]["failed"] == true)
            .collect();
        assert!(failed.is_empty(), "{backend}: {failed:?}");
    }
}
