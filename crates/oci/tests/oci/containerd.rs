//! containerd (Debian 12's 1.6) with substrat-oci as the runc binary of its
//! runc shim (`ctr run --runc-binary`, the runtime option BinaryName): a
//! containerd of the test's own (its root, state and socket in a temporary
//! directory), the test image saved by podman as an OCI archive.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::{OCI, cgroups_of, processes_with, text, wait_until};

const NAMESPACE: &str = "substrat-test";

/// A containerd started for one test, stopped when dropped.
struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

impl Containerd {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", NAMESPACE])
            .args(args)
            .output()
            .expect("ctr")
    }
}

/// containerd running with the test image imported; None (said why) when
/// containerd, ctr or the image cannot be had here.
fn containerd(test: &str) -> Option<Containerd> {
    let image = super::podman::image(test)?;
    if Command::new("containerd")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("SKIPPED {test}: containerd is not installed (scripts/setup installs it)");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let root = dir.path().join("root");
    let state = dir.path().join("state");
    std::fs::write(
        &config,
        format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\n[grpc]\n  address = {:?}\n",
            dir.path().join("containerd.sock")
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.path().join("containerd.log")).expect("log");
    let daemon = Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("containerd");
    let ctrd = Containerd { dir, daemon };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ctrd.ctr(&["version"]).status.success() {
        assert!(Instant::now() < deadline, "containerd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let archive = ctrd.dir.path().join("image.tar");
    let saved = Command::new("podman")
        .args(["save", "--format", "oci-archive", "-o"])
        .arg(&archive)
        .arg(image)
        .output()
        .expect("podman save");
    assert!(saved.status.success(), "{}", text(&saved.stderr));
    let archive = archive.to_string_lossy().into_owned();
    let imported = ctrd.ctr(&[
        "image",
        "import",
        "--base-name",
        "localhost/substrat-oci-test",
        &archive,
    ]);
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    Some(ctrd)
}

fn image_name(ctrd: &Containerd) -> String {
    let listed = ctrd.ctr(&["image", "ls", "-q"]);
    text(&listed.stdout)
        .lines()
        .next()
        .expect("an image")
        .to_string()
}

/// `ctr run` with substrat-oci as the shim's runc binary.
fn run_args<'a>(image: &'a str, id: &'a str, detach: bool, command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--runtime",
        "io.containerd.runc.v2",
        "--runc-binary",
        OCI,
    ];
    if detach {
        // A limit, so that the container has cgroups to leave behind.
        args.extend(["-d", "--memory-limit", "268435456"]);
    } else {
        args.push("--rm");
    }
    args.extend([image, id]);
    args.extend(command);
    args
}

#[test]
fn ctr_runs_a_container_inside_the_walls() {
    let Some(ctrd) = containerd("ctr_runs_a_container_inside_the_walls") else {
        return;
    };
    let image = image_name(&ctrd);
    let script = "echo hello; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
                  cat /proc/self/uid_map; exit 4";
    let out = ctrd.ctr(&run_args(
        &image,
        "walls",
        false,
        &["/bin/sh", "-c", script],
    ));
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.starts_with("hello\n"), "{stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(
        stdout.contains("NoNewPrivs:\t1") && stdout.contains("Seccomp:\t2"),
        "{stdout}"
    );
    let map = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .expect("uid_map");
    assert_ne!(
        map.split_whitespace().nth(1),
        Some("0"),
        "container root is host root: {map}"
    );
}

#[test]
fn ctr_kill_and_delete_leave_no_process_cgroup_or_record() {
    let Some(ctrd) = containerd("ctr_kill_and_delete_leave_no_process_cgroup_or_record") else {
        return;
    };
    let image = image_name(&ctrd);
    let marker = "substrat-oci-ctr-marker";
    let script = format!("sleep 1000; : {marker}");
    let out = ctrd.ctr(&run_args(
        &image,
        "killed",
        true,
        &["/bin/sh", "-c", &script],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_until("the container runs", || !processes_with(marker).is_empty());
    let tasks = text(&ctrd.ctr(&["task", "ls"]).stdout);
    assert!(tasks.contains("RUNNING"), "{tasks}");
    assert!(
        !cgroups_of("killed").is_empty(),
        "the memory limit made no cgroup"
    );

    assert!(
        ctrd.ctr(&["task", "kill", "-s", "SIGKILL", "killed"])
            .status
            .success()
    );
    wait_until("the task stops", || {
        text(&ctrd.ctr(&["task", "ls"]).stdout).contains("STOPPED")
    });
    assert!(ctrd.ctr(&["task", "delete", "killed"]).status.success());
    assert!(ctrd.ctr(&["container", "rm", "killed"]).status.success());
    assert_eq!(
        processes_with(marker),
        Vec::<i32>::new(),
        "a process survived"
    );
    assert_eq!(
        cgroups_of("killed"),
        Vec::<PathBuf>::new(),
        "a cgroup survived"
    );
    let record = Path::new("/run/containerd/runc")
        .join(NAMESPACE)
        .join("killed");
    assert!(!record.exists(), "the runtime's record survived");
}
