//! podman (Debian 12's 4.3) with substrat-oci as its runtime, its default
//! configuration (sysfs, mqueue, masked and read-only paths, its
//! overlayfs root), on an image imported from a local archive of a static
//! busybox (no registry is reachable here).

use std::process::Command;
use std::sync::OnceLock;

use super::{OCI, cgroups_of, processes_with, runnable, text, wait_until};

const IMAGE: &str = "localhost/substrat-oci-test:busybox";

/// The image, imported once per test process; None (with the reason
/// printed) when podman or a static busybox is missing.
pub(super) fn image(test: &str) -> Option<&'static str> {
    if !runnable(test) {
        return None;
    }
    static IMPORTED: OnceLock<Result<(), String>> = OnceLock::new();
    match IMPORTED.get_or_init(import) {
        Ok(()) => Some(IMAGE),
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            None
        }
    }
}

fn import() -> Result<(), String> {
    let found = |program: &str| Command::new(program).arg("--version").output().is_ok();
    if !found("podman") {
        return Err("podman is not installed (scripts/setup installs it)".into());
    }
    let busybox = std::path::Path::new("/usr/bin/busybox");
    let static_busybox = matches!(
        substrat_sandbox::interp::program_interpreter(busybox),
        Ok(None)
    );
    if !static_busybox {
        return Err(
            "no static /usr/bin/busybox (busybox-static; scripts/setup installs it)".into(),
        );
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rootfs = dir.path().join("rootfs");
    for sub in ["bin", "etc", "tmp"] {
        std::fs::create_dir_all(rootfs.join(sub)).map_err(|e| e.to_string())?;
    }
    std::fs::copy(busybox, rootfs.join("bin/busybox")).map_err(|e| e.to_string())?;
    for applet in [
        "sh", "echo", "cat", "grep", "sleep", "ls", "touch", "id", "true", "tty", "stty",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
            .map_err(|e| e.to_string())?;
    }
    let archive = dir.path().join("rootfs.tar");
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .map_err(|e| e.to_string())?;
    let imported = Command::new("podman")
        .arg("import")
        .arg(&archive)
        .arg(IMAGE)
        .output()
        .map_err(|e| e.to_string())?;
    match (tar.success(), imported.status.success()) {
        (true, true) => Ok(()),
        _ => Err(format!(
            "cannot import the test image: {}",
            text(&imported.stderr)
        )),
    }
}

/// podman with substrat-oci as its runtime. The ulimits: podman's defaults
/// are above what a host without CAP_SYS_RESOURCE may set (NOTES).
pub(super) fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .arg("--runtime")
        .arg(OCI)
        .args(args)
        .output()
        .expect("podman")
}

pub(super) const RUN: [&str; 7] = [
    "run",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

#[test]
fn podman_runs_a_container_inside_the_walls() {
    let Some(image) = image("podman_runs_a_container_inside_the_walls") else {
        return;
    };
    let script = "echo hello; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
                  cat /proc/self/uid_map; (echo '0 0' > /proc/sys/net/ipv4/ping_group_range) 2>&1; ls /sys/fs/cgroup | grep -c . ; exit 3";
    let mut args = RUN.to_vec();
    args.extend(["--rm", image, "/bin/sh", "-c", script]);
    let out = podman(&args);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.starts_with("hello\n"), "{stdout}");
    // runc would give podman's capabilities and a uid map of 0 0.
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
    // /proc/sys read-only, /sys/fs/cgroup empty (podman's configuration).
    assert!(stdout.contains("Read-only file system"), "{stdout}");
    assert!(stdout.trim_end().ends_with("\n0"), "{stdout}");
}

/// Removes the container however the test ends.
pub(super) struct Removed(pub(super) String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", &self.0]);
    }
}

#[test]
fn podman_stop_and_rm_leave_no_process_cgroup_or_record() {
    let Some(image) = image("podman_stop_and_rm_leave_no_process_cgroup_or_record") else {
        return;
    };
    let marker = "substrat-oci-podman-marker";
    let script = format!("sleep 1000; : {marker}");
    let mut args = RUN.to_vec();
    args.extend(["-d", image, "/bin/sh", "-c", &script]);
    let out = podman(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let _removed = Removed(id.clone());
    wait_until("the container runs", || !processes_with(marker).is_empty());
    let inspect = podman(&[
        "inspect",
        "--format",
        "{{.State.Status}} {{.State.Pid}}",
        &id,
    ]);
    assert!(
        text(&inspect.stdout).starts_with("running "),
        "{}",
        text(&inspect.stdout)
    );
    assert!(
        !cgroups_of(&id).is_empty(),
        "podman's pids limit made no cgroup"
    );

    let stopped = podman(&["stop", "-t", "1", &id]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    assert!(podman(&["rm", &id]).status.success());
    assert_eq!(
        processes_with(marker),
        Vec::<i32>::new(),
        "a process survived"
    );
    assert_eq!(
        cgroups_of(&id),
        Vec::<std::path::PathBuf>::new(),
        "a cgroup survived"
    );
    let record = std::path::Path::new(substrat_oci::state::DEFAULT_ROOT).join(&id);
    assert!(!record.exists(), "the runtime's record survived");
}

/// podman's own network (a namespace it made, with CNI): joined by path,
/// the container sees podman's interface; /sys, which would need a network
/// namespace of the sandbox's own, is an empty read-only directory.
#[test]
fn podman_networking_is_podmans_namespace_joined() {
    let Some(image) = image("podman_networking_is_podmans_namespace_joined") else {
        return;
    };
    let script = "grep -c eth0 /proc/net/dev; ls -A /sys | grep -c . ; touch /sys/x 2>&1; true";
    let out = podman(&[
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        image,
        "/bin/sh",
        "-c",
        script,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"1"),
        "no eth0 from podman's network: {stdout}"
    );
    assert_eq!(lines.get(1), Some(&"0"), "/sys is not empty: {stdout}");
    assert!(stdout.contains("Read-only file system"), "{stdout}");
}

#[test]
fn podman_exec_runs_inside_the_walls() {
    let Some(image) = image("podman_exec_runs_inside_the_walls") else {
        return;
    };
    let mut args = RUN.to_vec();
    args.extend(["-d", image, "sleep", "1000"]);
    let out = podman(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let _removed = Removed(id.clone());
    // podman cp reaches the container through the pid the runtime
    // reported: the file lands in the container, never on the host.
    let source = tempfile::NamedTempFile::new().expect("source");
    std::fs::write(source.path(), "copied in\n").expect("source");
    // Readable by all: the container's root is not the host's (an engine's
    // overlay root is not idmapped, its files are nobody's inside).
    std::fs::set_permissions(
        source.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let landed = format!("/tmp/substrat-oci-cp-{}", std::process::id());
    let target = format!("{id}:{landed}");
    let cp = podman(&["cp", source.path().to_str().expect("path"), &target]);
    assert!(cp.status.success(), "{}", text(&cp.stderr));
    assert!(
        !std::path::Path::new(&landed).exists(),
        "podman cp wrote on the host"
    );
    let script =
        format!("cat {landed}; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; exit 7");
    let exec = podman(&["exec", &id, "/bin/sh", "-c", &script]);
    let stdout = text(&exec.stdout);
    assert_eq!(
        exec.status.code(),
        Some(7),
        "{stdout}{}",
        text(&exec.stderr)
    );
    assert!(stdout.starts_with("copied in\n"), "{stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(
        stdout.contains("NoNewPrivs:\t1") && stdout.contains("Seccomp:\t2"),
        "{stdout}"
    );
}

/// `podman run -t`: the terminal substrat-oci makes and sends over the
/// console socket is the container's stdin and controlling terminal.
#[test]
fn podman_gives_a_container_a_terminal() {
    let Some(image) = image("podman_gives_a_container_a_terminal") else {
        return;
    };
    let script = "tty; [ -t 0 ] && echo stdin-is-a-terminal; stty size; \
                  (printf x > /dev/tty) && echo; echo controlling-done";
    let mut args = RUN.to_vec();
    args.extend(["--rm", "-t", image, "/bin/sh", "-c", script]);
    let out = podman(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("/dev/pts/"), "{stdout}");
    assert!(stdout.contains("stdin-is-a-terminal"), "{stdout}");
    // /dev/tty opens only for a process with a controlling terminal.
    assert!(stdout.contains("x\r\ncontrolling-done"), "{stdout:?}");
}
