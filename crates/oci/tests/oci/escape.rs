//! The `check --prove` battery (`substrat-probe battery`) inside a
//! substrat-oci container and inside `substrat-run --policy worker`, with
//! the same host fixtures: every attack must end the same way in both,
//! except the few whose setup differs by design (listed with the reason).

use std::collections::BTreeMap;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::{Bundle, OCI, pid_of, runnable, text, wait_launcher};

/// Where the probe is bound inside, in both.
pub(super) const PROBE_INSIDE: &str = "/run/substrat-probe";

/// Attacks whose fixtures differ between the two by design.
pub(super) const DIFFERENT_BY_DESIGN: [(&str, &str); 6] = [
    (
        "environment",
        "the policy's variables against the configuration's (checked apart)",
    ),
    (
        "protected-write",
        "the worker policy protects .git; a container has no protected paths",
    ),
    ("protected-create", "as protected-write"),
    ("protected-rename-over", "as protected-write"),
    ("protected-symlink-swap", "as protected-write"),
    (
        "mcp-config-write",
        "the worker policy protects .cursor/mcp.json; a container does not",
    ),
];

/// The host side of the battery: a secret file and a directory outside
/// every bind, a Unix and an abstract socket, a TCP server on loopback, a
/// marked process.
pub(super) struct Fixtures {
    dir: tempfile::TempDir,
    _unix: UnixListener,
    _abstract: UnixListener,
    _tcp: std::net::TcpListener,
    marked: std::process::Child,
    args: Vec<String>,
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        let _ = self.marked.kill();
        let _ = self.marked.wait();
    }
}

impl Fixtures {
    pub(super) fn new(secret: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".git/hooks")).expect("ws");
        std::fs::create_dir_all(ws.join(".cursor")).expect("ws");
        std::fs::write(ws.join(".git/config"), "[core]\n").expect("ws");
        std::fs::write(ws.join(".cursor/mcp.json"), "{}\n").expect("ws");
        let outside_dir = dir.path().join("outside");
        std::fs::create_dir(&outside_dir).expect("outside");
        std::fs::write(outside_dir.join("secret.txt"), secret).expect("secret");
        let socket = outside_dir.join("host.sock");
        let unix = UnixListener::bind(&socket).expect("unix socket");
        // Tests of one process run at once: each its own names.
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("substrat-oci-escape-{}-{n}", std::process::id());
        let abstract_socket = UnixListener::bind_addr(
            &SocketAddr::from_abstract_name(name.as_bytes()).expect("name"),
        )
        .expect("abstract socket");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
        let marker = format!("substrat-oci-escape-marker-{}-{n}", std::process::id());
        let mut marked = Command::new("sleep");
        std::os::unix::process::CommandExt::arg0(&mut marked, &marker);
        let marked = marked
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep");
        super::wait_until("the marked process runs", || {
            super::processes_with(&marker) == [marked.id() as i32]
        });
        let reversed = |s: &str| s.chars().rev().collect::<String>();
        let args = vec![
            format!("ws={}", ws.display()),
            format!("outside={}", outside_dir.join("secret.txt").display()),
            format!("outside_dir={}", outside_dir.display()),
            format!("socket={}", socket.display()),
            format!("abstract={name}"),
            format!("port={}", tcp.local_addr().expect("port").port()),
            "host_ip=".into(),
            format!("marker={}", reversed(&marker)),
            format!("marker_pid={}", marked.id()),
            format!("secret={}", reversed(secret)),
        ];
        Fixtures {
            dir,
            _unix: unix,
            _abstract: abstract_socket,
            _tcp: tcp,
            marked,
            args,
        }
    }

    pub(super) fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    pub(super) fn battery(&self) -> Vec<String> {
        let mut argv = vec![PROBE_INSIDE.to_string(), "battery".to_string()];
        argv.extend(self.args.iter().cloned());
        argv
    }
}

/// `{"attack":..,"outcome":..}` lines as a map; panics without `done`.
pub(super) fn outcomes(stdout: &str, what: &str) -> BTreeMap<String, String> {
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.iter().any(|l| l["done"] == true),
        "{what}: the battery did not finish:\n{stdout}"
    );
    lines
        .iter()
        .filter_map(|l| {
            Some((
                l["attack"].as_str()?.to_string(),
                l["outcome"].as_str()?.to_string(),
            ))
        })
        .collect()
}

pub(super) fn sibling(name: &str) -> PathBuf {
    Path::new(OCI).with_file_name(name)
}

/// Panics unless the static probe beside substrat-oci runs this source's
/// battery: a stale copy (scripts/static-probe not rerun) would judge
/// containers with yesterday's attacks.
pub(super) fn assert_probe_current(probe: &Path) {
    let out = Command::new(probe)
        .arg(substrat_battery::VERSION_COMMAND)
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        answer.trim(),
        substrat_battery::version_line(),
        "{} is not built from this source: run scripts/static-probe",
        probe.display()
    );
}

/// The battery under `substrat-run --policy worker` (native backend).
pub(super) fn under_substrat_run(
    fixtures: &Fixtures,
    run: &Path,
    probe: &Path,
    secret: &str,
) -> BTreeMap<String, String> {
    let cold = Command::new(run)
        .args([
            "--policy",
            "worker",
            "--backend",
            "native",
            "--tty",
            "never",
        ])
        .arg("--workspace")
        .arg(fixtures.ws())
        .args(["--agent-bind", "ro"])
        .arg(probe)
        .arg(PROBE_INSIDE)
        .env("SUBSTRAT_OCI_ESCAPE_SECRET", secret)
        .arg("--")
        .args(fixtures.battery())
        .stdin(Stdio::null())
        .output()
        .expect("substrat-run");
    outcomes(&text(&cold.stdout), "substrat-run")
}

/// Attacks that ended otherwise in the container, but those different by
/// design.
pub(super) fn differences(
    under_run: &BTreeMap<String, String>,
    in_container: &BTreeMap<String, String>,
) -> Vec<String> {
    under_run
        .iter()
        .filter(|(attack, outcome)| {
            in_container.get(*attack) != Some(outcome)
                && !DIFFERENT_BY_DESIGN.iter().any(|(id, _)| id == attack)
        })
        .map(|(attack, outcome)| {
            format!(
                "{attack}: substrat-run {outcome}, container {}",
                in_container[attack]
            )
        })
        .collect()
}

#[test]
fn the_escape_battery_ends_the_same_in_a_container_as_under_substrat_run() {
    let test = "the_escape_battery_ends_the_same_in_a_container_as_under_substrat_run";
    if !runnable(test) {
        return;
    }
    let (run, probe) = (sibling("substrat-run"), sibling("substrat-probe-static"));
    if !run.exists() || !probe.exists() {
        println!(
            "SKIPPED {test}: needs substrat-run and substrat-probe-static beside substrat-oci (cargo build --workspace; scripts/static-probe)"
        );
        return;
    }
    assert_probe_current(&probe);
    let secret = format!("substrat-oci-escape-secret-{}", std::process::id());
    let fixtures = Fixtures::new(&secret);
    let ws = fixtures.ws();

    let under_run = under_substrat_run(&fixtures, &run, &probe, &secret);

    let battery = fixtures.battery();
    let bundle = Bundle::new("", |config| {
        config["process"]["args"] = json!(battery);
        config["process"]["cwd"] = json!(ws);
        let mounts = config["mounts"].as_array_mut().expect("mounts");
        mounts.push(
            json!({"destination": ws, "type": "bind", "source": ws, "options": ["rbind", "rw"]}),
        );
        mounts.push(json!({"destination": PROBE_INSIDE, "type": "bind", "source": probe, "options": ["bind", "ro"]}));
        config["linux"]["resources"] = json!({"pids": {"limit": 512}});
    });
    let created = bundle.create("escape", &[("SUBSTRAT_OCI_ESCAPE_SECRET", &secret)]);
    assert!(created.status.success(), "{}", bundle.output());
    let pid = pid_of(&bundle.state("escape"));
    assert!(bundle.oci(&["start", "escape"]).status.success());
    wait_launcher(pid);
    let in_container = outcomes(&bundle.output(), "substrat-oci");
    assert!(bundle.oci(&["delete", "escape"]).status.success());

    assert_eq!(
        under_run.keys().collect::<Vec<_>>(),
        in_container.keys().collect::<Vec<_>>(),
        "the same attacks ran"
    );
    assert!(under_run.len() >= 30, "{under_run:?}");
    let differ = differences(&under_run, &in_container);
    assert!(differ.is_empty(), "outcomes differ:\n{}", differ.join("\n"));
    assert_eq!(
        in_container["environment"], "value:PATH",
        "only the configuration's variables"
    );
    // Nothing reached the host: the secret never came back, no file was
    // written outside.
    assert!(!bundle.output().contains(&secret));
    assert!(
        !fixtures
            .dir
            .path()
            .join("outside/written-from-inside")
            .exists()
    );
}
