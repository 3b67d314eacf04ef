//! A substrat policy on top of a container: the operator's (`policy` in
//! the runtime's configuration) and the container's (`io.substrat.policy`).
//! Each attack is run once without the policy, where it succeeds, and once
//! with it, where it fails with the exact error.

use std::path::Path;

use serde_json::{Value, json};

use crate::{Bundle, pid_of, runnable, text, wait_launcher};

/// What each line of the script tries; the container's own configuration
/// allows every one of them (a writable root, a writable volume at /work).
const ATTACKS: &str = "\
echo x > /etc/planted && echo 'etc: written'; \
mkdir -p /work/.git && echo x > /work/.git/config && echo 'git config: written'; \
echo x > /work/result && echo 'work: written'; \
echo filters $(grep Seccomp_filters /proc/self/status | cut -f2); \
echo nofile $(ulimit -n); true";

/// A bundle whose root filesystem is writable and whose volume `/work`
/// (the working directory, and the HOME its author set) is the host
/// directory `workspace`, with a second volume at `/work/.git` when
/// `workspace` has a `.git` directory.
fn attack_bundle(workspace: &Path, policy: Option<&str>) -> Bundle {
    use std::os::unix::fs::PermissionsExt;
    let volume = workspace.display().to_string();
    let git = workspace.join(".git");
    // A volume the container writes: shown as it is (not idmapped), the
    // container a stranger there, so world-writable as kubelet's emptyDir.
    for dir in [workspace, git.as_path()]
        .into_iter()
        .filter(|d| d.is_dir())
    {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let bundle = Bundle::new(ATTACKS, |config| {
        config["root"]["readonly"] = json!(false);
        config["process"]["cwd"] = json!("/work");
        // The author's HOME never decides what is protected.
        config["process"]["env"] = json!(["PATH=/usr/bin:/bin", "HOME=/work"]);
        if git.is_dir() {
            let inner = git.display().to_string();
            config["mounts"]
                .as_array_mut()
                .expect("mounts")
                .push(json!({"destination": "/work/.git", "type": "bind", "source": inner, "options": ["rbind", "rw"]}));
        }
        config["process"]["rlimits"] =
            json!([{"type": "RLIMIT_NOFILE", "hard": 10000, "soft": 10000}]);
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({"destination": "/work", "type": "bind", "source": volume, "options": ["rbind", "rw"]}));
        if let Some(name) = policy {
            config["annotations"] = json!({"io.substrat.policy": name});
        }
        // No tmpfs at /tmp: the image's own /tmp, a link to its root below.
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .retain(|m| m["destination"] != "/tmp");
    });
    // An image whose /tmp leads to its root: a policy's rule on /tmp must
    // not become one on the root.
    let tmp = bundle.rootfs().join("tmp");
    std::fs::remove_dir(&tmp).expect("rootfs /tmp");
    std::os::unix::fs::symlink("/", &tmp).expect("link");
    bundle
}

/// create, start, wait, delete: the exit code and what the container wrote.
fn run_once(bundle: &Bundle, id: &str, config: Option<&Path>) -> (i32, String) {
    let env: Vec<(&str, &str)> = config
        .map(|c| ("SUBSTRAT_OCI_CONFIG", c.to_str().expect("utf-8")))
        .into_iter()
        .collect();
    let created = bundle.create(id, &env);
    assert!(created.status.success(), "create {id}: {}", bundle.output());
    let pid = pid_of(&bundle.state(id));
    assert!(bundle.oci(&["start", id]).status.success());
    let code = wait_launcher(pid);
    assert!(bundle.oci(&["delete", id]).status.success());
    (code, bundle.output())
}

fn value_after<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|line| line.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{out}"))
}

#[test]
fn a_policy_annotation_stacks_its_walls_on_the_containers() {
    if !runnable("a_policy_annotation_stacks_its_walls_on_the_containers") {
        return;
    }
    // Without a policy: every attack succeeds (the test attempts them).
    let plain_ws = tempfile::tempdir().expect("workspace");
    let plain = attack_bundle(plain_ws.path(), None);
    let (code, out) = run_once(&plain, "plain", None);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("etc: written") && out.contains("git config: written"),
        "{out}"
    );
    assert!(plain.rootfs().join("etc/planted").exists());
    assert_eq!(value_after(&out, "nofile "), "10000");
    let plain_filters: u32 = value_after(&out, "filters ").parse().expect("count");

    // With worker on top: the root is not the workspace (Landlock, EACCES,
    // though /tmp, which worker makes writable, leads there), .git/config
    // is read-only (EROFS, in a volume of its own below the workspace's,
    // HOME the workspace), the workspace is written, one more filter is
    // loaded, the lower nofile holds.
    let ws = tempfile::tempdir().expect("workspace");
    std::fs::create_dir(ws.path().join(".git")).expect(".git");
    let bundle = attack_bundle(ws.path(), Some("worker"));
    let (code, out) = run_once(&bundle, "layered", None);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("/etc/planted: Permission denied") && !out.contains("etc: written"),
        "{out}"
    );
    assert!(!bundle.rootfs().join("etc/planted").exists());
    assert!(
        out.contains("/work/.git/config: Read-only file system")
            && !out.contains("git config: written"),
        "{out}"
    );
    // The empty placeholder that held the path is gone with the container:
    // nothing of the agent's is left for git on the host to read.
    assert!(!ws.path().join(".git/config").exists(), "{out}");
    assert!(out.contains("work: written"), "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("result")).expect("result"),
        "x\n"
    );
    let filters: u32 = value_after(&out, "filters ").parse().expect("count");
    assert!(
        filters > plain_filters,
        "{filters} filters, {plain_filters} without the policy"
    );
    assert_eq!(value_after(&out, "nofile "), "4096");
    // The record says what the policy changed.
    let log = std::fs::read_to_string(bundle.path().join("log.json")).expect("log");
    assert!(
        log.contains("policy worker: its Landlock rules and seccomp filter stacked"),
        "{log}"
    );
}

/// The operator's configuration: a policy of its own directory for every
/// container, the annotation's on top of it, and the run report.
#[test]
fn the_operators_policy_applies_to_every_container_and_its_report_is_written() {
    if !runnable("the_operators_policy_applies_to_every_container_and_its_report_is_written") {
        return;
    }
    let operator = tempfile::tempdir().expect("operator");
    let policies = operator.path().join("policies");
    std::fs::create_dir(&policies).expect("policies");
    std::fs::write(
        policies.join("site.toml"),
        "version = 1\nextends = \"worker\"\n[rlimits]\nnofile = 256\n",
    )
    .expect("policy");
    let reports = operator.path().join("reports");
    let config = operator.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "policy = \"site\"\npolicy_dir = \"{}\"\nreport_dir = \"{}\"\n",
            policies.display(),
            reports.display()
        ),
    )
    .expect("config");
    let ws = tempfile::tempdir().expect("workspace");
    let bundle = attack_bundle(ws.path(), Some("strict"));
    let (code, out) = run_once(&bundle, "site", Some(&config));
    assert_eq!(code, 0, "{out}");
    assert!(!bundle.rootfs().join("etc/planted").exists(), "{out}");
    assert_eq!(value_after(&out, "nofile "), "256");
    let report: Value =
        serde_json::from_slice(&std::fs::read(reports.join("site.json")).expect("the run report"))
            .expect("json");
    assert_eq!(report["container_id"], "site");
    assert_eq!(report["policies"], json!(["site", "strict"]));
    assert_eq!(report["policy"], "config.json+site+strict");
    assert_eq!(report["exit_code"], 0);
    assert!(
        report["notes"].as_array().is_some_and(|notes| notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.starts_with("policy strict:")))),
        "{report}"
    );
}

#[test]
fn a_policy_that_cannot_hold_or_is_not_a_name_is_refused_at_create() {
    if !runnable("a_policy_that_cannot_hold_or_is_not_a_name_is_refused_at_create") {
        return;
    }
    let operator = tempfile::tempdir().expect("operator");
    std::fs::write(
        operator.path().join("egress.toml"),
        "version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\nallow = [\"example.com\"]\n",
    )
    .expect("policy");
    let config = operator.path().join("config.toml");
    std::fs::write(
        &config,
        format!("policy_dir = \"{}\"\n", operator.path().display()),
    )
    .expect("config");
    let ws = tempfile::tempdir().expect("workspace");
    for (name, said) in [
        ("../../etc/passwd", "a policy name"),
        ("nonesuch", "not in the policy directory"),
        ("egress", "is not supported under a container"),
    ] {
        let bundle = attack_bundle(ws.path(), Some(name));
        let env = [("SUBSTRAT_OCI_CONFIG", config.to_str().expect("utf-8"))];
        let created = bundle.create("refused", &env);
        assert!(!created.status.success(), "{name} was accepted");
        let log = std::fs::read_to_string(bundle.path().join("log.json")).expect("log");
        assert!(log.contains(said), "{name}: {log}");
        let listed = std::fs::read_dir(bundle.runtime_root.path()).map_or(0, |d| d.count());
        assert_eq!(listed, 0, "{name}: a record was left");
        assert!(!bundle.oci(&["state", "refused"]).status.success());
        let _ = text(&created.stderr);
    }
}

/// An exec is confined as the container's process: under the policies the
/// container was created with, or refused.
#[test]
fn an_exec_under_other_policies_than_create_is_refused() {
    if !runnable("an_exec_under_other_policies_than_create_is_refused") {
        return;
    }
    let operator = tempfile::tempdir().expect("operator");
    let config = operator.path().join("config.toml");
    std::fs::write(&config, "policy = \"strict\"\n").expect("config");
    let ws = tempfile::tempdir().expect("workspace");
    let bundle = Bundle::new("sleep 30", |c| {
        c["process"]["cwd"] = json!("/work");
        c["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({"destination": "/work", "type": "bind", "source": ws.path().display().to_string(), "options": ["rbind", "rw"]}));
    });
    let config_env = ("SUBSTRAT_OCI_CONFIG", config.to_str().expect("utf-8"));
    assert!(
        bundle.create("ex", &[config_env]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("ex"));
    assert!(bundle.oci(&["start", "ex"]).status.success());
    let exec = |env: Option<(&str, &str)>| {
        let mut command = std::process::Command::new(crate::OCI);
        command
            .arg("--root")
            .arg(bundle.runtime_root.path())
            .args(["exec", "ex", "/bin/true"])
            .env_remove("SUBSTRAT_OCI_CONFIG");
        if let Some((name, value)) = env {
            command.env(name, value);
        }
        command.output().expect("exec")
    };
    let same = exec(Some(config_env));
    assert!(same.status.success(), "{}", text(&same.stderr));
    let other = exec(None);
    assert!(
        !other.status.success(),
        "an exec without the operator's policy ran"
    );
    assert!(
        text(&other.stderr).contains("refused"),
        "{}",
        text(&other.stderr)
    );
    assert!(bundle.oci(&["kill", "ex", "KILL"]).status.success());
    assert_eq!(wait_launcher(pid), 137);
    assert!(bundle.oci(&["delete", "ex"]).status.success());
}
