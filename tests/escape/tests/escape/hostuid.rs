//! Never host root (issue 17, part 7): launched by root, the command runs
//! as a subordinate uid and gid of root's (/etc/subuid, /etc/subgid), one
//! pair per running sandbox, so a kernel bug in an allowed call would give
//! an id that owns nothing; the binds still show root's files as the
//! command's own (idmapped), and what it writes is root's on the disk.
//! Launched by nobody, it runs as nobody.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::*;

/// What the host's kernel says about a process on the other end of a socket.
#[derive(Debug)]
struct HostCredentials {
    uid: u32,
    gid: u32,
    /// The `Uid:` and `Gid:` lines of its /proc status: real, effective,
    /// saved and filesystem ids.
    status: String,
}

/// Accepts `count` connections on `listener` and reads each peer's host
/// credentials while all of them are connected (they run at the same
/// time); then answers each, so the probes can end. Gives up after 120 s
/// (under load a sandbox can take long to start; the probe waits as long).
fn credentials_of_peers(
    listener: UnixListener,
    count: usize,
) -> std::thread::JoinHandle<Vec<HostCredentials>> {
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut peers: Vec<(UnixStream, HostCredentials)> = Vec::new();
        while peers.len() < count && Instant::now() < deadline {
            let Ok((mut stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let cred = getsockopt(&stream, PeerCredentials).unwrap();
            let status = std::fs::read_to_string(format!("/proc/{}/status", cred.pid()))
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:"))
                .collect::<Vec<_>>()
                .join(" ");
            let mut hello = [0u8; 5];
            std::io::Read::read_exact(&mut stream, &mut hello).unwrap();
            peers.push((
                stream,
                HostCredentials {
                    uid: cred.uid(),
                    gid: cred.gid(),
                    status,
                },
            ));
        }
        peers
            .into_iter()
            .map(|(mut stream, cred)| {
                let _ = std::io::Write::write_all(&mut stream, b"ok");
                cred
            })
            .collect()
    })
}

/// Root's ranges in `file` as (start, count) pairs.
fn roots_ranges(file: &str) -> Vec<(u32, u32)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let owner = fields.next()?;
            let start = fields.next()?.parse().ok()?;
            let count = fields.next()?.parse().ok()?;
            (owner == "root" || owner == "0").then_some((start, count))
        })
        .collect()
}

fn in_ranges(ranges: &[(u32, u32)], id: u32) -> bool {
    ranges
        .iter()
        .any(|&(start, count)| id >= start && id - start < count)
}

attack!(the_command_never_runs_as_host_root, |case| {
    // A socket only its owner may use, in a directory only its owner may
    // enter, like the broker's agent sockets; bound into the sandbox.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("peer.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    if case.who == Who::Nobody {
        for entry in [dir.path(), socket.as_path()] {
            std::os::unix::fs::chown(entry, Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let peers = credentials_of_peers(listener, 2);
    let bind = [
        "--agent-bind",
        "rw",
        socket.to_str().unwrap(),
        "/run/peer.sock",
    ]
    .map(OsStr::new);
    let argv = ["./substrat-probe", "connect-unix", "/run/peer.sock"];
    // Two sandboxes at once: each must get ids of its own.
    let children: Vec<_> = (0..2)
        .map(|_| {
            case.command_with("worker", &bind, &argv)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("OUTCOME ok"),
            "the command could not use the socket bound in: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let peers = peers.join().unwrap();
    assert_eq!(peers.len(), 2, "{peers:?}");
    let all_four = |uid: u32, gid: u32| {
        format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid} Gid:\t{gid}\t{gid}\t{gid}\t{gid}")
    };
    match case.who {
        Who::Invoker => {
            let (uids, gids) = (roots_ranges("/etc/subuid"), roots_ranges("/etc/subgid"));
            for peer in &peers {
                assert!(
                    peer.uid != 0 && in_ranges(&uids, peer.uid),
                    "{peer:?} {uids:?}"
                );
                assert!(
                    peer.gid != 0 && in_ranges(&gids, peer.gid),
                    "{peer:?} {gids:?}"
                );
                assert_eq!(peer.status, all_four(peer.uid, peer.gid));
            }
            assert_ne!(peers[0].uid, peers[1].uid, "{peers:?}");
            assert_ne!(peers[0].gid, peers[1].gid, "{peers:?}");
        }
        Who::Nobody => {
            for peer in &peers {
                assert_eq!(peer.status, all_four(NOBODY, NOBODY));
            }
        }
    }
});

attack!(the_workspace_stays_its_owners, |case| {
    // A file only its owner may read or write, and a directory only its
    // owner may write: the command still may, as root inside.
    std::fs::write(case.path().join("private.txt"), "mine").unwrap();
    std::fs::set_permissions(
        case.path().join("private.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::create_dir(case.path().join("owned")).unwrap();
    std::fs::set_permissions(
        case.path().join("owned"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    case.fix_ownership();
    let script = "id -u; stat -c '%u:%g %a' private.txt; cat private.txt; echo; \
                  echo new > owned/made.txt && mkdir owned/dir && stat -c '%u:%g' owned/made.txt";
    let out = case.run("worker", &["/bin/sh", "-c", script]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0\n0:0 600\nmine\n0:0\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // On the host, what it made is the workspace owner's.
    let owner = match case.who {
        Who::Invoker => 0,
        Who::Nobody => NOBODY,
    };
    for made in ["owned/made.txt", "owned/dir"] {
        let meta = std::fs::metadata(case.path().join(made)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (owner, owner), "{made}");
    }
});

attack!(read_only_binds_stay_read_only_with_capabilities, |case| {
    // What a kernel bug in an allowed call would give the command: every
    // capability in the sandbox's own user namespace. The test lends it
    // that from outside (nsenter into the running sandbox's namespaces as
    // its root), then tries to make a read-only bind writable. Launched by
    // root, /usr is shown as the sandbox's own (idmapped): writable, it
    // would let the command rewrite root's programs. Its flags must be
    // locked, set by root when the copy was made.
    let marker = unique("substrat-caps-holder");
    let mut child = case
        .command("worker", &["/bin/sh", "-c", "sleep 60; :", &marker])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    wait_until("the sandbox's command", Duration::from_secs(60), || {
        pids = host_processes_with(&marker)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sh")
            })
            .collect();
        !pids.is_empty()
    });
    let attempt = |script: &str| {
        Command::new("nsenter")
            .args([
                "-t",
                &pids[0].to_string(),
                "-U",
                "-m",
                "-p",
                "-S",
                "0",
                "-G",
                "0",
            ])
            .args(["--", "/bin/sh", "-c", script])
            .output()
            .unwrap()
    };
    // The attack is real: in there the shell holds CAP_SYS_ADMIN (bit 21).
    let caps = attempt("grep CapEff /proc/self/status");
    let remount = attempt("mount -o remount,bind,rw /usr 2>&1; touch /usr/substrat-pwned 2>&1");
    let _ = child.kill();
    let _ = child.wait();
    let effective = String::from_utf8_lossy(&caps.stdout)
        .trim()
        .strip_prefix("CapEff:")
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
    assert!(
        effective.is_some_and(|bits| bits & (1 << 21) != 0),
        "{caps:?}"
    );
    let said = String::from_utf8_lossy(&remount.stdout);
    // Should the attack work, the host is put back before the test fails.
    let pwned = Path::new("/usr/substrat-pwned");
    let written = pwned.exists();
    let _ = std::fs::remove_file(pwned);
    assert!(!written, "the command wrote /usr on the host: {said}");
    match case.who {
        // Launched by root the copy's flags were set by root, so they are
        // locked (native), or the command's user namespace does not even
        // own its mounts (bwrap's nested one): the remount is refused, and
        // /usr stays read-only.
        Who::Invoker => {
            assert!(said.contains("permission denied"), "{said}");
            assert!(said.contains("Read-only file system"), "{said}");
        }
        // Launched by nobody nothing is idmapped: whatever becomes of the
        // flags, root's files are not the sandbox's.
        Who::Nobody => assert!(
            said.contains("Permission denied") || said.contains("Read-only file system"),
            "{said}"
        ),
    }
});

attack!(no_pid_namespace_is_refused_to_root, |case| {
    let out = case.run("no-pid-namespace", &["/bin/sh", "-c", "echo ran"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match case.who {
        Who::Invoker => {
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(stderr.contains("without a pid namespace"), "{stderr}");
            assert!(out.stdout.is_empty());
        }
        Who::Nobody => {
            assert_eq!(out.status.code(), Some(0), "{stderr}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
        }
    }
});
