//! Groups made in temporary directories and, where the host has one, a
//! real cgroup v2 hierarchy.

use super::delegate::{LEAF, parent_of};
use super::*;
use std::time::SystemTime;

fn made(dir: &Path, name: &str, age: Duration) -> PathBuf {
    let path = dir.join(name);
    fs::create_dir(&path).unwrap();
    fs::File::open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
    path
}

/// The "no internal processes" rule on this host's real cgroup v2
/// hierarchy, with a controller it has there (hybrid hosts keep pids,
/// memory and cpu in v1, hugetlb often not): a group that holds a
/// process, as a delegated scope holds its launcher, gets the
/// controller enabled for its children once the process is in the leaf.
#[test]
fn a_group_holding_processes_enables_a_controller_through_a_leaf() {
    let test = "a_group_holding_processes_enables_a_controller_through_a_leaf";
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED {test}: not root");
        return;
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounts = parse_cgroup_mounts(&mountinfo);
    let Some(v2) = mounts.iter().find(|m| m.v2) else {
        println!("SKIPPED {test}: no cgroup v2 hierarchy here");
        return;
    };
    let root = v2.mount_point.clone();
    let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let Some(controller) = ["pids", "memory", "cpu", "hugetlb", "io"]
        .into_iter()
        .find(|c| available.split_whitespace().any(|a| a == *c))
    else {
        println!("SKIPPED {test}: the v2 hierarchy has no domain controller here ({available})");
        return;
    };
    let subtree = root.join("cgroup.subtree_control");
    let was_enabled = fs::read_to_string(&subtree)
        .unwrap_or_default()
        .split_whitespace()
        .any(|c| c == controller);
    if !was_enabled {
        fs::write(&subtree, format!("+{controller}")).unwrap();
    }
    let name = format!("substrat-test-{}", std::process::id());
    let group = root.join(&name);
    fs::create_dir(&group).unwrap();
    // The "launcher" is a shell with a child of its own (as the native
    // backend's holder is), both in the group; `other` is not its.
    let mut sleeper = std::process::Command::new("sh")
        .args(["-c", "read go; sleep 60 & wait"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    fs::write(group.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    fs::write(group.join("cgroup.procs"), other.id().to_string()).unwrap();
    // The shell's child, started once the shell is in the group.
    if let Some(mut stdin) = sleeper.stdin.take() {
        std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
    }
    let mut child = None;
    for _ in 0..500 {
        let procs = fs::read_to_string(group.join("cgroup.procs")).unwrap();
        child = procs
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .find(|&pid| parent_of(pid) == Some(sleeper.id()));
        if child.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let child = child.expect("the shell's child in the group");
    // Without the leaf the kernel refuses, which is what is tested.
    let refused = fs::write(
        group.join("cgroup.subtree_control"),
        format!("+{controller}"),
    );
    // Another process there (a shell, a daemon) is not moved: refused.
    let crowded = enable_v2_controller(&group, controller, sleeper.id());
    let _ = other.kill();
    let _ = other.wait();
    let result = enable_v2_controller(&group, controller, sleeper.id());
    let enabled = fs::read_to_string(group.join("cgroup.subtree_control")).unwrap();
    let sleeper_group = fs::read_to_string(format!("/proc/{}/cgroup", sleeper.id())).unwrap();
    let child_group = fs::read_to_string(format!("/proc/{child}/cgroup")).unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let _ = fs::remove_dir(group.join(LEAF));
    let _ = fs::remove_dir(&group);
    if !was_enabled {
        let _ = fs::write(&subtree, format!("-{controller}"));
    }
    assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EBUSY));
    let crowded = crowded.unwrap_err().to_string();
    assert!(crowded.contains("holds other processes"), "{crowded}");
    result.unwrap();
    assert!(
        enabled.split_whitespace().any(|c| c == controller),
        "{enabled}"
    );
    assert!(
        sleeper_group.contains(&format!("0::/{name}/{LEAF}\n")),
        "{sleeper_group}"
    );
    assert!(
        child_group.contains(&format!("0::/{name}/{LEAF}\n")),
        "{child_group}"
    );
}

#[test]
fn a_launcher_in_the_leaf_makes_groups_beside_it() {
    let root = Path::new("/sys/fs/cgroup");
    assert_eq!(
        own_parent(root, "user.slice/run-1.scope/substrat-leaf"),
        root.join("user.slice/run-1.scope")
    );
    assert_eq!(
        own_parent(root, "user.slice/run-1.scope"),
        root.join("user.slice/run-1.scope")
    );
    assert_eq!(own_parent(root, ""), root.to_path_buf());
}

/// Plain directories stand for groups: rmdir refuses a non-empty one
/// as the kernel refuses a group that still has processes.
#[test]
fn only_old_empty_substrat_groups_are_swept() {
    let parent = tempfile::tempdir().unwrap();
    let old = Duration::from_secs(120);
    let stale = made(parent.path(), "substrat-run-1-a-41", old);
    let fresh = made(parent.path(), "substrat-run-2-b-42", Duration::ZERO);
    let busy = made(parent.path(), "substrat-agent-c-43", old);
    // An administrator's delegated group, empty: not a launch's.
    let delegated = made(parent.path(), "substrat-alice", old);
    fs::write(busy.join("cgroup.procs"), "42\n").unwrap();
    let foreign = made(parent.path(), "user-session", old);
    let unit = made(parent.path(), "substrat-daemon.service", old);
    fs::write(parent.path().join("substrat-file"), "").unwrap();

    let removed = sweep_stale(parent.path(), STALE_AFTER);

    assert_eq!(removed, vec![stale.clone()]);
    assert!(!stale.exists());
    assert!(fresh.exists() && busy.exists() && foreign.exists() && unit.exists());
    assert!(delegated.exists());
    assert!(parent.path().join("substrat-file").exists());
    // A launch's group of another owner (a user's, seen by root) stays.
    if nix::unistd::geteuid().is_root() {
        let theirs = made(parent.path(), "substrat-run-3-c-44", old);
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert!(sweep_stale(parent.path(), STALE_AFTER).is_empty());
        assert!(theirs.exists());
    } else {
        println!(
            "SKIPPED the other-owner part of only_old_empty_substrat_groups_are_swept: needs root to chown"
        );
    }
    // A parent that cannot be read is not an error: nothing to sweep.
    assert!(sweep_stale(&parent.path().join("absent"), STALE_AFTER).is_empty());
}

/// A daemon alone in its group moves into the leaf; one sharing it (a
/// login session's), or already in the leaf, stays (temporary directories
/// standing for the groups: no v2 hierarchy to delegate here).
#[test]
fn a_daemon_alone_in_its_group_moves_into_the_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let group = dir.path().join("substrat-daemon.service");
    fs::create_dir(&group).unwrap();
    fs::write(group.join("cgroup.procs"), "4242\n").unwrap();
    assert_eq!(
        delegate::settle_daemon_in_leaf(&group, 4242, false).unwrap(),
        DaemonGroup::MovedToLeaf {
            group: group.clone()
        }
    );
    assert_eq!(
        fs::read_to_string(group.join(LEAF).join("cgroup.procs")).unwrap(),
        "4242"
    );
    assert_eq!(
        delegate::settle_daemon_in_leaf(&group.join(LEAF), 4242, false).unwrap(),
        DaemonGroup::Stays {
            reason: "already in the leaf".to_string()
        }
    );
    let shared = dir.path().join("session-1.scope");
    fs::create_dir(&shared).unwrap();
    fs::write(shared.join("cgroup.procs"), "4242\n17\n").unwrap();
    assert_eq!(
        delegate::settle_daemon_in_leaf(&shared, 4242, false).unwrap(),
        DaemonGroup::Stays {
            reason: "1 other process(es) share its group".to_string()
        }
    );
    assert!(!shared.join(LEAF).exists());
}

/// Root may write any group: a root daemon alone in a unit's group that
/// no one delegated (a service without Delegate=yes) must not make
/// subgroups in it; one systemd marked delegated it moves in. (Before,
/// the test above moved root, which these tests run as, into any group.)
#[test]
fn a_root_daemon_moves_only_into_a_group_marked_delegated() {
    let dir = tempfile::tempdir().unwrap();
    let group = dir.path().join("plain.service");
    fs::create_dir(&group).unwrap();
    fs::write(group.join("cgroup.procs"), "4242\n").unwrap();
    assert_eq!(
        delegate::settle_daemon_in_leaf(&group, 4242, true).unwrap(),
        DaemonGroup::Stays {
            reason: "run as root in a group not marked delegated (no Delegate=yes)".to_string()
        }
    );
    assert!(!group.join(LEAF).exists());
    let opened = fs::File::open(&group).unwrap();
    if let Err(e) = crate::sys::set_xattr(&opened, c"user.delegate", b"1") {
        println!("SKIPPED the delegated half: no user xattrs here ({e})");
        return;
    }
    assert!(delegate::marked_delegated(&group));
    assert_eq!(
        delegate::settle_daemon_in_leaf(&group, 4242, true).unwrap(),
        DaemonGroup::MovedToLeaf {
            group: group.clone()
        }
    );
}
