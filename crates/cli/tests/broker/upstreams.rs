//! Upstream MCP servers' sandboxes as the daemon launches them.

use super::*;

/// The daemon's `--cgroup-parent` holds for an upstream server's sandbox
/// as for the turns': every process of it is in groups below the parent
/// (they were made below the daemon's own group instead).
#[test]
fn an_upstream_servers_sandbox_is_below_the_daemons_cgroup_parent() {
    let test = "an_upstream_servers_sandbox_is_below_the_daemons_cgroup_parent";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: only root can make a parent group here");
        return;
    }
    let parent = ParentGroups::make("upstream");
    if parent.dirs.is_empty() {
        println!("SKIPPED {test}: no cgroup v1 pids, memory or cpu hierarchy here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let upstreams = dir.path().join("upstreams.json");
    // Never answers the handshake: its sandbox lives until the timeout.
    std::fs::write(
        &upstreams,
        r#"{"mcpServers": {"idle": {"command": "sleep", "args": ["300"], "policy": "worker", "timeout_ms": 60000}}}"#,
    )
    .unwrap();
    let upstreams = upstreams.to_str().unwrap().to_string();
    let d = Daemon::start_with(
        dir,
        &["--cgroup-parent", &parent.name, "--upstreams", &upstreams],
    );
    let daemon_pid = d.child.id() as i32;
    let start = Instant::now();
    let sleeper = loop {
        let found = descendants(daemon_pid).into_iter().find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "sleep\n")
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the upstream server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let groups = std::fs::read_to_string(format!("/proc/{sleeper}/cgroup")).unwrap();
    let below = format!("/{}/substrat-", parent.name);
    for dir in &parent.dirs {
        let controller = dir.parent().unwrap().file_name().unwrap().to_str().unwrap();
        let line = groups
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == controller))
            })
            .unwrap_or_else(|| panic!("no {controller} line in {groups}"));
        assert!(
            line.contains(&below),
            "{controller}: {line} (not below {below})"
        );
    }
    // The groups go once the sandbox has followed the daemon.
    drop(d);
    let start = Instant::now();
    while Path::new(&format!("/proc/{sleeper}")).exists()
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process below `pid`: the children of each of its threads (the
/// daemon starts processes from its runtime's threads, whose children the
/// main thread's list does not hold).
pub(super) fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}
