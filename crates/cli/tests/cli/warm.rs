//! Warm sandboxes (`substrat-run --serve-turns`, both backends): turns
//! served by one sandbox, each confined as a cold launch (the battery's
//! side of that is in prove.rs), nothing of one turn left in the next,
//! requests that would widen the environment refused.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Stdio};

use substrat_sandbox::cgroup::FreezerVersion;
use substrat_sandbox::turns::{self, Hello, TurnReply, TurnRequest};

use super::*;

/// A warm sandbox of the worker policy over a fresh workspace.
struct Warm {
    _dir: tempfile::TempDir,
    launcher: Child,
    control: OwnedFd,
    /// The launcher's first packet: where to freeze the sandbox.
    hello: Hello,
}

impl Warm {
    /// The launcher started and its `Hello` read: the sandbox may still be
    /// being built.
    fn connect(backend: &str, policy: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let socket = dir.path().join("turns.sock");
        let listener = turns::listen(&socket).unwrap();
        let launcher = Command::new(Path::new(bin()).with_file_name("substrat-run"))
            .args(["--policy", policy, "--backend", backend, "--tty", "never"])
            .arg("--workspace")
            .arg(&ws)
            .arg("--serve-turns")
            .arg(&socket)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut launcher = launcher;
        // A launcher that refuses before it connects has ended; one that
        // refuses after closes the connection (the first turn fails).
        rustix::net::sockopt::set_socket_timeout(
            &listener,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_millis(50)),
        )
        .unwrap();
        let control = loop {
            match turns::accept(&listener) {
                Ok(control) => break control,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("accept: {e}"),
            }
            if launcher.try_wait().unwrap().is_some() {
                let mut stderr = String::new();
                let _ = launcher.stderr.take().unwrap().read_to_string(&mut stderr);
                return Err(format!("ended before it connected: {stderr}"));
            }
        };
        let hello = match turns::read_hello(&control) {
            Ok(Some(hello)) => hello,
            other => {
                let mut stderr = String::new();
                let _ = launcher.stderr.take().unwrap().read_to_string(&mut stderr);
                return Err(format!("no hello ({other:?}): {stderr}"));
            }
        };
        Ok(Warm {
            _dir: dir,
            launcher,
            control,
            hello,
        })
    }

    /// A warm sandbox that has served a first turn.
    fn start(backend: &str, policy: &str) -> Result<Self, String> {
        let mut warm = Self::connect(backend, policy)?;
        match warm.try_turn(&["true"], &[]) {
            Ok((_, TurnReply::Ended { code: 0 })) => Ok(warm),
            other => {
                // The launcher ends on its own once it has refused.
                let mut stderr = String::new();
                let _ = warm
                    .launcher
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr);
                Err(format!("{other:?}: {stderr}"))
            }
        }
    }

    fn try_turn(
        &mut self,
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> std::io::Result<(String, TurnReply)> {
        let request = TurnRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let (mut read, write) = std::io::pipe()?;
        let null = std::fs::File::open("/dev/null")?;
        turns::send_request(
            &self.control,
            &request,
            [null.as_fd(), write.as_fd(), write.as_fd()],
        )?;
        drop(write);
        let mut output = String::new();
        read.read_to_string(&mut output)?;
        let reply = turns::read_reply(&self.control)?
            .ok_or_else(|| std::io::Error::other("the sandbox ended"))?;
        Ok((output, reply))
    }

    fn turn(&mut self, argv: &[&str], env: &[(&str, &str)]) -> (String, TurnReply) {
        self.try_turn(argv, env).unwrap()
    }

    /// Hangs up: the sandbox ends, and with it the launcher (its exit code).
    fn end(self) -> i32 {
        drop(self.control);
        code(&self.launcher.wait_with_output().unwrap())
    }
}

#[test]
fn nothing_of_one_turn_runs_into_the_next() {
    // Natively init is pid 1; under bwrap, bwrap's pid 1 and the helper.
    let mut backends = vec![("native", 1)];
    if bwrap_on_path() {
        backends.push(("bwrap", 2));
    } else {
        eprintln!(
            "SKIPPED the bwrap part of nothing_of_one_turn_runs_into_the_next: bubblewrap is not on PATH"
        );
    }
    for (backend, servers) in backends {
        one_turn_then_the_next(backend, servers);
    }
}

fn one_turn_then_the_next(backend: &str, servers: usize) {
    let mut warm = Warm::start(backend, "worker").unwrap();
    // A process left behind, in the background and in a new session.
    let (out, reply) = warm.turn(
        &[
            "sh",
            "-c",
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!",
        ],
        &[],
    );
    assert_eq!(reply, TurnReply::Ended { code: 0 }, "{out}");
    let left: u32 = out.trim().parse().unwrap();
    let (out, reply) = warm.turn(
        &[
            "sh",
            "-c",
            &format!(
                "test -e /proc/{left} && echo alive || echo gone; set -- /proc/[0-9]*; echo $#"
            ),
        ],
        &[],
    );
    assert_eq!(reply, TurnReply::Ended { code: 0 });
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "gone", "{backend}: {out}");
    // The turn server(s) and the shell (the glob is its own; a pipeline
    // would race: its second process may not exist yet): nothing else.
    assert_eq!(lines[1], (servers + 1).to_string(), "{backend}: {out}");
    // The exit code travels back; a signal is 128 + its number.
    assert_eq!(
        warm.turn(&["sh", "-c", "exit 7"], &[]).1,
        TurnReply::Ended { code: 7 }
    );
    assert_eq!(
        warm.turn(&["sh", "-c", "kill -9 $$"], &[]).1,
        TurnReply::Ended { code: 137 }
    );
    assert_eq!(warm.end(), 0);
}

/// Between turns the daemon freezes the sandbox in the group the launcher
/// made and named (its first packet); a turn after a thaw runs; a launcher
/// told to stop while its sandbox is frozen thaws it, ends it and removes
/// the group (a v1 freezer's frozen tasks die only once thawed).
#[test]
fn a_warm_sandbox_freezes_between_turns_and_ends_frozen() {
    let test = "a_warm_sandbox_freezes_between_turns_and_ends_frozen";
    let backends = backends_for(test);
    for backend in backends {
        let mut warm = Warm::start(backend, "worker").unwrap();
        // Root on a host with the v1 freezer (this CI's) always gets one.
        let v1_host = Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists();
        let root = rustix::process::geteuid().is_root();
        let freezer = match &warm.hello {
            Hello::Freezer(freezer) => freezer.clone().checked().unwrap(),
            Hello::NoFreezer { reason } => {
                assert!(!(root && v1_host), "root gets a freezer: {reason}");
                println!("SKIPPED {test} ({backend}): {reason}");
                continue;
            }
        };
        let procs = || std::fs::read_to_string(freezer.group.join("cgroup.procs")).unwrap();
        let launcher = warm.launcher.id().to_string();
        assert!(
            !procs().is_empty(),
            "{backend}: the sandbox is in its freezer group"
        );
        assert!(
            !procs().lines().any(|p| p == launcher),
            "{backend}: the launcher is not"
        );
        let expected = if v1_host {
            FreezerVersion::V1
        } else {
            FreezerVersion::V2
        };
        assert_eq!(freezer.version, expected, "{backend}");
        freezer.freeze().unwrap();
        let frozen_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !freezer.is_frozen().unwrap() {
            assert!(
                std::time::Instant::now() < frozen_by,
                "{backend}: never frozen"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        freezer.thaw().unwrap();
        assert_eq!(
            warm.turn(&["sh", "-c", "echo thawed"], &[]),
            ("thawed\n".into(), TurnReply::Ended { code: 0 })
        );
        // Frozen, then the launcher is told to stop (as a daemon's death
        // tells it: SIGTERM is its parent-death signal).
        freezer.freeze().unwrap();
        while !freezer.is_frozen().unwrap() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let status = stopped(&mut warm.launcher, backend);
        assert_eq!(status.code(), Some(128 + 15), "{backend}");
        assert!(
            !freezer.group.exists(),
            "{backend}: {} left behind",
            freezer.group.display()
        );
    }
}

#[test]
fn a_turn_sets_only_variables_the_sandbox_passes() {
    let mut warm = Warm::start("native", "worker").unwrap();
    let (out, reply) = warm.turn(&["sh", "-c", "echo $TERM"], &[("TERM", "turn-term")]);
    assert_eq!(
        (out.as_str(), reply),
        ("turn-term\n", TurnReply::Ended { code: 0 })
    );
    let (out, reply) = warm.turn(&["sh", "-c", "echo ran"], &[("LD_PRELOAD", "/x.so")]);
    assert_eq!(out, "", "a refused turn runs nothing");
    assert_eq!(
        reply,
        TurnReply::Refused {
            reason: "variable `LD_PRELOAD` is not one the sandbox passes".into()
        }
    );
    // The next turn's environment is the plan's again.
    let (out, _) = warm.turn(&["sh", "-c", "echo ${TERM:-unset}"], &[]);
    assert_ne!(out, "turn-term\n");
    // A request without its three descriptors is refused too.
    let request = TurnRequest {
        argv: vec!["true".into()],
        env: Vec::new(),
    };
    let null = std::fs::File::open("/dev/null").unwrap();
    turns::send_request(
        &warm.control,
        &request,
        [null.as_fd(), null.as_fd(), null.as_fd()],
    )
    .unwrap();
    assert_eq!(
        turns::read_reply(&warm.control).unwrap(),
        Some(TurnReply::Ended { code: 0 })
    );
    rustix::net::send(
        &warm.control,
        b"{\"argv\":[\"true\"]}",
        rustix::net::SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(
        turns::read_reply(&warm.control).unwrap(),
        Some(TurnReply::Refused {
            reason: "a request needs exactly 3 descriptors (stdin, stdout, stderr), not 0".into()
        })
    );
    assert_eq!(warm.end(), 0);
}

#[test]
fn what_cannot_serve_turns_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let nopid = dir.path().join("nopid.toml");
    std::fs::write(
        &nopid,
        "version = 1\nextends = \"worker\"\n[namespaces]\npid = false\n",
    )
    .unwrap();
    let Err(why) = Warm::start("native", nopid.to_str().unwrap()) else {
        panic!("a policy without a pid namespace served turns");
    };
    assert!(why.contains("needs a pid namespace"), "{why}");
    // An overlay workspace: each of its turns is a layer checkpoint.
    let overlay = dir.path().join("overlay.toml");
    std::fs::write(
        &overlay,
        "version = 1\nextends = \"worker\"\n[filesystem]\nworkspace_mode = \"overlay\"\n",
    )
    .unwrap();
    let Err(why) = Warm::start("native", overlay.to_str().unwrap()) else {
        panic!("an overlay workspace served turns");
    };
    assert!(why.contains("does not serve an overlay workspace"), "{why}");
}

/// `daemon --warm-pool ROLE=COUNT`: a bad value, a role that does not
/// exist, or one whose turns cannot run warm, stops the daemon before it
/// serves, saying which.
#[test]
fn a_warm_pool_of_a_role_that_cannot_have_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::copy(
        repo().join("policies/worker.toml"),
        policies.join("worker.toml"),
    )
    .unwrap();
    // A role without a pid namespace: its turns run cold.
    let worker = std::fs::read_to_string(policies.join("worker.toml")).unwrap();
    let flat = worker.replacen("pid = true", "pid = false", 1);
    assert_ne!(flat, worker);
    std::fs::write(policies.join("flat.toml"), flat).unwrap();
    for (index, (value, says)) in [
        ("worker", "`worker`: expected ROLE=COUNT"),
        (
            "worker=0",
            "`worker=0`: COUNT must be a number from 1 to 16",
        ),
        (
            "worker=17",
            "`worker=17`: COUNT must be a number from 1 to 16",
        ),
        ("=2", "`=2`: no role before `=`"),
        ("nobody=1", "--warm-pool nobody: no role of that name"),
        (
            "flat=1",
            "--warm-pool flat: this role's turns cannot run warm",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut daemon = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args([
                "daemon",
                "--provider",
                "stand-in",
                "--warm",
                "--warm-pool",
                value,
            ])
            .arg("--policies")
            .arg(&policies)
            .arg("--state-dir")
            .arg(dir.path().join(format!("state-{index}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(status) = daemon.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = daemon.kill();
                panic!("--warm-pool {value}: the daemon started");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut stderr = String::new();
        daemon
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(!status.success(), "--warm-pool {value}: {stderr}");
        assert!(stderr.contains(says), "--warm-pool {value}: {stderr}");
    }
}

/// A launcher told to stop while its sandbox is still being built ends it
/// (it used to wait for the sandbox's report first, which a sandbox frozen
/// half-built never sends, and outlived the daemon that froze it). The
/// sandbox is frozen right after the launcher's `Hello`, which comes
/// before init has finished; the launcher's wait channel tells whether it
/// was caught still waiting for the report (poll) rather than already
/// serving (sigwait): tried up to 20 times.
#[test]
fn a_launcher_stopped_while_its_sandbox_is_built_ends_it() {
    let test = "a_launcher_stopped_while_its_sandbox_is_built_ends_it";
    for attempt in 1..=20 {
        let mut warm = Warm::connect("native", "worker").unwrap();
        let freezer = match &warm.hello {
            Hello::Freezer(freezer) => freezer.clone().checked().unwrap(),
            Hello::NoFreezer { reason } => {
                println!("SKIPPED {test}: {reason}");
                return;
            }
        };
        freezer.freeze().unwrap();
        let launcher = warm.launcher.id();
        // The launcher settles in its wait: the report's poll, or sigwait.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let wchan = std::fs::read_to_string(format!("/proc/{launcher}/wchan")).unwrap_or_default();
        let building = wchan.contains("poll");
        let status = stopped(
            &mut warm.launcher,
            &format!("attempt {attempt}, waiting in {wchan}"),
        );
        assert_eq!(status.code(), Some(128 + 15), "attempt {attempt}");
        assert!(!freezer.group.exists(), "attempt {attempt}: group left");
        if building {
            return;
        }
    }
    println!("SKIPPED {test}: no launcher of 20 was caught before its sandbox was built");
}

/// The launcher's status once told to stop (SIGTERM), within 10 s.
fn stopped(launcher: &mut Child, what: &str) -> std::process::ExitStatus {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(launcher.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let ended_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < ended_by,
            "{what}: the launcher did not end on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Makes (`make`) or opens without creating (otherwise) the POSIX message
/// queue `/substrat-warm`: prints `mq made`, `mq found`, or `mq` and the
/// error (Landlock refuses mq_open with EACCES: the queue's file is on the
/// namespace's internal mount, beneath no rule).
const MQUEUE: &str = "import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
flags = 0o102 if sys.argv[1] == 'make' else 0
fd = libc.mq_open(b'/substrat-warm', flags, 0o600, None)
print('mq', errno.errorcode[ctypes.get_errno()] if fd < 0 else ('made' if flags else 'found'))";

/// System V objects made in one turn are not found by the next (the
/// sandbox's ipc namespace lasts, its objects do not); a POSIX message
/// queue cannot be made at all. Both backends.
#[test]
fn ipc_objects_of_one_turn_are_gone_in_the_next() {
    let mut backends = vec!["native"];
    if bwrap_on_path() {
        backends.push("bwrap");
    } else {
        eprintln!(
            "SKIPPED the bwrap part of ipc_objects_of_one_turn_are_gone_in_the_next: bubblewrap is not on PATH"
        );
    }
    for backend in backends {
        let mut warm = Warm::start(backend, "worker").unwrap();
        let make = format!(
            "ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcmk -S 2 >/dev/null \
             && ipcs | grep -c '^0x'; /usr/bin/python3 -c \"{MQUEUE}\" make"
        );
        let (out, reply) = warm.turn(&["sh", "-c", &make], &[]);
        assert_eq!(reply, TurnReply::Ended { code: 0 }, "{backend}: {out}");
        assert_eq!(out, "3\nmq EACCES\n", "{backend}");
        let look = format!("ipcs | grep -c '^0x'; /usr/bin/python3 -c \"{MQUEUE}\" look");
        let (out, reply) = warm.turn(&["sh", "-c", &look], &[]);
        assert_eq!(reply, TurnReply::Ended { code: 0 }, "{backend}: {out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.first(),
            Some(&"0"),
            "{backend}: System V objects left: {out}"
        );
        // Nothing to open (natively ENOENT; bwrap's view refuses first).
        assert!(
            matches!(lines.get(1), Some(&"mq ENOENT" | &"mq EACCES")),
            "{backend}: {out}"
        );
        assert_eq!(warm.end(), 0);
    }
}
