//! What the launchers keep and say (issue 44): a container's ptys end at
//! its devpts's `max=`, errors after `ready` reach the engine's log with a
//! terminal, a path that starts with `-` stays a path, a descriptor the
//! engine leaked stays out of the launchers, and an exec whose program
//! cannot run fails (with no terminal sent first for a bad cwd).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use super::{
    Bundle, Ended, OCI, pid_of, processes_with, runnable, text, wait_launcher, wait_until,
};

/// Opens the sandbox's /dev/ptmx until it fails (`opened N ERRNO`), or
/// 1000 times (`opened 1000 none`: a third of the host's pool, no more).
const OPEN_PTYS: &str = "import os, errno\nfds, why = [], 'none'\ntry:\n    \
                         while len(fds) < 1000:\n        \
                         fds.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))\n\
                         except OSError as e:\n    why = errno.errorcode[e.errno]\n\
                         print('opened', len(fds), why)\n";

/// The message and the descriptor a console socket got (none: `None`).
fn receive_master(listener: &UnixListener) -> (String, Option<OwnedFd>) {
    let (stream, _) = listener.accept().expect("the runtime connects");
    let mut name = [0u8; 64];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream.as_fd(),
        &mut [std::io::IoSliceMut::new(&mut name)],
        &mut control,
        rustix::net::RecvFlags::empty(),
    )
    .expect("recvmsg");
    let master = control.drain().find_map(|message| match message {
        rustix::net::RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    (text(&name[..got.bytes]), master)
}

fn terminal(config: &mut serde_json::Value) {
    config["process"]["terminal"] = json!(true);
}

/// Runs the container to its end; what it printed.
fn run_to_end(bundle: &Bundle, id: &'static str, env: &[(&str, &str)]) -> String {
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), id);
    assert!(
        bundle.create(id, env).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state(id));
    assert!(bundle.oci(&["start", id]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    assert!(bundle.oci(&["delete", id]).status.success());
    bundle.output()
}

#[test]
fn a_containers_ptys_end_at_its_devpts_max() {
    let test = "a_containers_ptys_end_at_its_devpts_max";
    if !runnable(test) {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        println!("SKIPPED {test}: needs /usr/bin/python3 (the container's /usr is the host's)");
        return;
    }
    let python = |config: &mut serde_json::Value| {
        config["process"]["args"] = json!(["/usr/bin/python3", "-c", OPEN_PTYS]);
    };
    // The default: 128 of the host's pool, then ENOSPC.
    let bundle = Bundle::new("", python);
    assert_eq!(run_to_end(&bundle, "ptys", &[]), "opened 128 ENOSPC\n");
    // The operator's `max_ptys`.
    let config = bundle.path().join("oci.toml");
    std::fs::write(&config, "max_ptys = 5\n").expect("config");
    let env = [("SUBSTRAT_OCI_CONFIG", config.to_str().expect("utf-8"))];
    assert_eq!(run_to_end(&bundle, "ptys5", &env), "opened 5 ENOSPC\n");
}

#[test]
fn an_error_after_ready_reaches_the_log_with_a_terminal() {
    if !runnable("an_error_after_ready_reaches_the_log_with_a_terminal") {
        return;
    }
    let bundle = Bundle::new("echo hello; exit 3", terminal);
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), "lost");
    // Reports go below a regular file: writing one fails after the run.
    std::fs::write(bundle.path().join("file"), "x").expect("file");
    let config = bundle.path().join("oci.toml");
    let reports = bundle.path().join("file/reports");
    std::fs::write(&config, format!("report_dir = {:?}\n", reports)).expect("config");
    let socket = bundle.path().join("console.sock");
    let listener = UnixListener::bind(&socket).expect("listen");
    let log = bundle.path().join("log.json");
    let created = Command::new(OCI)
        .arg("--config")
        .arg(&config)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["--log-format", "json", "--log"])
        .arg(&log)
        .args(["create", "--bundle"])
        .arg(bundle.path())
        .arg("--console-socket")
        .arg(&socket)
        .arg("lost")
        .stdin(Stdio::null())
        .output()
        .expect("create");
    assert!(created.status.success(), "{}", text(&created.stderr));
    let (_, master) = receive_master(&listener);
    let master = master.expect("the master");
    let pid = pid_of(&bundle.state("lost"));
    assert!(bundle.oci(&["start", "lost"]).status.success());
    assert_eq!(wait_launcher(pid), 3);
    let mut output = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::fs::File::from(master), &mut output);
    assert_eq!(text(&output), "hello\r\n");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let line = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["level"] == "error")
        .unwrap_or_else(|| panic!("no error in the log: {logged}"));
    assert_eq!(
        line["msg"].as_str().expect("msg"),
        format!(
            "lost: cannot make the report directory {}: Not a directory (os error 20)",
            reports.display()
        )
    );
}

#[test]
fn a_console_socket_path_starting_with_a_dash_is_a_path() {
    if !runnable("a_console_socket_path_starting_with_a_dash_is_a_path") {
        return;
    }
    let bundle = Bundle::new("echo hi", terminal);
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), "dash");
    let listener = UnixListener::bind(bundle.path().join("-c.sock")).expect("listen");
    let created = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args([
            "create",
            "--bundle",
            ".",
            "--console-socket=-c.sock",
            "dash",
        ])
        .current_dir(bundle.path())
        .stdin(Stdio::null())
        .output()
        .expect("create");
    assert!(created.status.success(), "{}", text(&created.stderr));
    let (name, master) = receive_master(&listener);
    assert_eq!(name, "/dev/pts/0");
    assert!(master.is_some());
}

/// The host pids' descriptors of `pid` that are `pipe:[INODE]` of `pipe`.
fn holds_pipe(pid: i32, pipe: &OwnedFd) -> bool {
    let ours = std::fs::read_link(format!("/proc/self/fd/{}", raw(pipe))).expect("our pipe");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the launcher's fds")
        .flatten()
        .any(|entry| std::fs::read_link(entry.path()).is_ok_and(|l| l == ours))
}

fn raw(fd: &OwnedFd) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(fd)
}

#[test]
fn a_descriptor_the_engine_leaked_stays_out_of_the_launchers() {
    if !runnable("a_descriptor_the_engine_leaked_stays_out_of_the_launchers") {
        return;
    }
    let marker = format!("substrat-oci-leak-marker-{}", std::process::id());
    let bundle = Bundle::new(&format!("sleep 1000; : {marker}"), |_| {});
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), "leak");
    // Not close-on-exec: create and exec (and anything they start) get it.
    let (read, write) = nix::unistd::pipe().expect("pipe");
    let leaky = |args: &[&str]| {
        Command::new(OCI)
            .arg("--root")
            .arg(bundle.runtime_root.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("substrat-oci")
    };
    let bundle_arg = bundle.path().to_string_lossy().into_owned();
    assert!(leaky(&["create", "--bundle", &bundle_arg, "leak"]).success());
    let launcher = pid_of(&bundle.state("leak"));
    assert!(bundle.oci(&["start", "leak"]).status.success());
    wait_until("the container runs", || processes_with(&marker).len() == 1);
    let pid_file = bundle.path().join("exec.pid");
    let pid_arg = pid_file.to_string_lossy().into_owned();
    let exec = [
        "exec",
        "--detach",
        "--pid-file",
        &pid_arg,
        "leak",
        "sleep",
        "1000",
    ];
    assert!(leaky(&exec).success());
    let exec_launcher: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid");
    // This process holds both ends (the check is by the pipe's inode).
    assert!(holds_pipe(std::process::id() as i32, &write));
    assert!(!holds_pipe(launcher, &write), "create's launcher kept it");
    assert!(
        !holds_pipe(exec_launcher, &write),
        "exec's launcher kept it"
    );
    drop(read);
}

#[test]
fn an_exec_whose_program_cannot_start_fails() {
    if !runnable("an_exec_whose_program_cannot_start_fails") {
        return;
    }
    let marker = format!("substrat-oci-noexec-marker-{}", std::process::id());
    let bundle = Bundle::new(&format!("sleep 1000; : {marker}"), |_| {});
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), "noexec");
    assert!(
        bundle.create("noexec", &[]).status.success(),
        "{}",
        bundle.output()
    );
    assert!(bundle.oci(&["start", "noexec"]).status.success());
    wait_until("the container runs", || processes_with(&marker).len() == 1);
    let pid_file = bundle.path().join("exec.pid");
    let pid_arg = pid_file.to_string_lossy().into_owned();
    let out = bundle.oci(&[
        "exec",
        "--detach",
        "--pid-file",
        &pid_arg,
        "noexec",
        "/nonexistent",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent: command not found (no such file or directory)"),
        "{}",
        text(&out.stderr)
    );
    assert!(!pid_file.exists());
    // A working directory that is not there: refused before a terminal is
    // made, so the console socket gets no master.
    let socket = bundle.path().join("console.sock");
    let listener = UnixListener::bind(&socket).expect("listen");
    let socket_arg = socket.to_string_lossy().into_owned();
    let out = bundle.oci(&[
        "exec",
        "--tty",
        "--console-socket",
        &socket_arg,
        "--detach",
        "--cwd",
        "/nowhere",
        "noexec",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("chdir to the working directory"),
        "{}",
        text(&out.stderr)
    );
    let (name, master) = receive_master(&listener);
    assert_eq!((name.as_str(), master.is_none()), ("", true));
}

/// An id may start with `-` (`state::container_dir`): the launchers and
/// the create watcher get it after `--`.
#[test]
fn an_id_starting_with_a_dash_is_an_id() {
    if !runnable("an_id_starting_with_a_dash_is_an_id") {
        return;
    }
    let bundle = Bundle::new("exit 4", |_| {});
    let oci = |args: &[&str]| {
        Command::new(OCI)
            .arg("--root")
            .arg(bundle.runtime_root.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("substrat-oci")
    };
    let bundle_arg = bundle.path().to_string_lossy().into_owned();
    assert!(oci(&["create", "--bundle", &bundle_arg, "--", "-dash"]).success());
    let state = bundle.oci(&["state", "--", "-dash"]);
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).expect("state");
    assert!(oci(&["start", "--", "-dash"]).success());
    assert_eq!(wait_launcher(pid_of(&state)), 4);
    assert!(oci(&["delete", "--", "-dash"]).success());
}
