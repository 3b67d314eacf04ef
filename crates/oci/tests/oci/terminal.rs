//! `podman exec -t`: a terminal for an exec, made in the container's own
//! devpts and sent over the engine's console socket, as for `run -t`.
//! podman is run under `script` so that it has a terminal of its own, whose
//! size it gives the exec's.

use std::process::Command;

use super::escape::{assert_probe_current, sibling};
use super::podman::{RUN, Removed, image, podman};
use super::text;

#[test]
fn podman_exec_gets_a_terminal_of_the_containers_own() {
    let test = "podman_exec_gets_a_terminal_of_the_containers_own";
    let Some(image) = image(test) else {
        return;
    };
    let probe = sibling("substrat-probe-static");
    if !probe.exists() || Command::new("script").arg("--version").output().is_err() {
        println!(
            "SKIPPED {test}: needs substrat-probe-static beside substrat-oci (scripts/static-probe) and script (util-linux)"
        );
        return;
    }
    assert_probe_current(&probe);
    let bind = format!("{}:/run/substrat-probe:ro", probe.display());
    let mut args = RUN.to_vec();
    args.extend(["-d", "-v", &bind, image, "sleep", "1000"]);
    let out = podman(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let _removed = Removed(id.clone());
    // The exec's own terminal: its stdin, its controlling terminal (only
    // then /dev/tty opens), podman's size; TIOCSTI and TIOCSETD on it
    // denied by seccomp, as on the container's own.
    let script = "tty; [ -t 0 ] && echo stdin-is-a-terminal; stty size; \
                  (printf x > /dev/tty) && echo; /run/substrat-probe tiocsti; \
                  /run/substrat-probe tiocsetd; exit 5";
    let line = format!(
        "stty rows 33 cols 111; podman --runtime {} exec -t {id} /bin/sh -c '{script}'",
        super::OCI
    );
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.split("\r\n").collect();
    assert!(
        lines.iter().any(|l| l.starts_with("/dev/pts/")),
        "{stdout:?}"
    );
    assert!(lines.contains(&"stdin-is-a-terminal"), "{stdout:?}");
    assert!(lines.contains(&"33 111"), "{stdout:?}");
    assert!(lines.contains(&"x"), "{stdout:?}");
    let outcomes: Vec<&&str> = lines.iter().filter(|l| l.starts_with("OUTCOME")).collect();
    assert_eq!(
        outcomes,
        [&"OUTCOME errno:EPERM", &"OUTCOME errno:EPERM"],
        "{stdout:?}"
    );
    // The container's own process has no terminal: the exec's is not it.
    let out = podman(&["exec", &id, "/bin/sh", "-c", "[ -t 0 ] || echo no-terminal"]);
    assert_eq!(text(&out.stdout), "no-terminal\n", "{}", text(&out.stderr));
}

/// `exec --console-socket` as containerd's shim calls it (`--process`,
/// `--detach`, `--pid-file`): the master arrives over the socket with the
/// terminal's name, sized to `process.consoleSize`, and the process's
/// stdio is its slave; a terminal and a socket that disagree are refused.
#[test]
fn exec_sends_a_sized_terminal_over_the_console_socket() {
    use std::os::fd::AsFd;
    if !super::runnable("exec_sends_a_sized_terminal_over_the_console_socket") {
        return;
    }
    let marker = format!("substrat-oci-tty-marker-{}", std::process::id());
    let bundle = super::Bundle::new(&format!("sleep 1000; : {marker}"), |_| {});
    let _ended = super::Ended(bundle.runtime_root.path().to_path_buf(), "tx");
    assert!(
        bundle.create("tx", &[]).status.success(),
        "{}",
        bundle.output()
    );
    assert!(bundle.oci(&["start", "tx"]).status.success());
    super::wait_until("the container runs", || {
        super::processes_with(&marker).len() == 1
    });
    let process = |terminal: bool| {
        let path = bundle.path().join(format!("process-{terminal}.json"));
        let mut json = serde_json::json!({
            "terminal": terminal,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", "tty; stty size; exit 4"],
            "env": ["PATH=/usr/bin:/bin"],
            "cwd": "/"
        });
        if terminal {
            json["consoleSize"] = serde_json::json!({"height": 33, "width": 111});
        }
        std::fs::write(&path, json.to_string()).expect("process.json");
        path.to_string_lossy().into_owned()
    };
    let socket = bundle.path().join("console.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("listen");
    let socket = socket.to_string_lossy().into_owned();
    let pid_file = bundle.path().join("exec.pid");
    let pid_arg = pid_file.to_string_lossy().into_owned();

    // Disagreements, refused before anything runs.
    let plain = process(false);
    let refused = bundle.oci(&[
        "exec",
        "--process",
        &plain,
        "--console-socket",
        &socket,
        "tx",
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("process.terminal"),
        "{}",
        text(&refused.stderr)
    );
    let refused = bundle.oci(&["exec", "--tty", "--process", &plain, "tx"]);
    assert!(
        text(&refused.stderr).contains("terminal: false"),
        "{}",
        text(&refused.stderr)
    );

    let sized = process(true);
    let exec = Command::new(super::OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["exec", "--process", &sized, "--console-socket", &socket])
        .args(["--detach", "--pid-file", &pid_arg, "tx"])
        .spawn()
        .expect("exec");
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
    let name = String::from_utf8_lossy(&name[..got.bytes]).into_owned();
    let master = control
        .drain()
        .find_map(|message| match message {
            rustix::net::RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        })
        .expect("the master, SCM_RIGHTS");
    let exec = exec.wait_with_output().expect("exec");
    assert!(exec.status.success(), "{}", text(&exec.stderr));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid");
    assert_eq!(super::wait_launcher(pid), 4);
    // Everything the process wrote is in the master's buffer; EIO once read.
    let mut output = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::fs::File::from(master), &mut output);
    let output = text(&output);
    assert!(name.starts_with("/dev/pts/"), "{name:?}");
    assert_eq!(output, format!("{name}\r\n33 111\r\n"));
}
