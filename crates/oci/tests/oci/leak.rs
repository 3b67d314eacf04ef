//! A launcher killed with SIGKILL cannot leave and remove the groups below
//! `linux.cgroupsPath` (issue 44): `delete` removes them from the record
//! the launcher wrote.

use serde_json::json;

use super::{Bundle, cgroups_of, pid_of, runnable, wait_launcher};

#[test]
fn delete_removes_the_groups_of_a_launcher_killed_with_sigkill() {
    let test = "delete_removes_the_groups_of_a_launcher_killed_with_sigkill";
    if !runnable(test) {
        return;
    }
    let top = format!("substrat-leak-{}", std::process::id());
    let path = format!("/{top}/pod/ctr");
    let bundle = Bundle::new("sleep 1000", |config| {
        config["linux"]["cgroupsPath"] = json!(path);
        config["linux"]["resources"]["memory"] = json!({"limit": 268435456});
    });
    let id = "leak";
    assert!(
        bundle.create(id, &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state(id));
    assert!(bundle.oci(&["start", id]).status.success());
    let levels: Vec<_> = ["memory", "pids", "cpuacct", "freezer"]
        .iter()
        .map(|h| std::path::Path::new("/sys/fs/cgroup").join(h).join(&top))
        .filter(|p| p.is_dir())
        .collect();
    assert!(!levels.is_empty(), "no level was made below /{top}");
    assert!(!cgroups_of(id).is_empty(), "the limit made no group");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
        .expect("kill the launcher");
    assert_eq!(wait_launcher(pid), 128 + 9);
    // The sandbox's processes die with their launcher (parent-death signal).
    super::wait_until("the container's processes end", || {
        cgroups_of(id)
            .iter()
            .all(|g| std::fs::read_to_string(g.join("cgroup.procs")).is_ok_and(|p| p.is_empty()))
    });
    assert!(!cgroups_of(id).is_empty(), "nothing was left to remove");
    let deleted = bundle.oci(&["delete", id]);
    assert!(deleted.status.success(), "{}", super::text(&deleted.stderr));
    assert_eq!(
        cgroups_of(id),
        Vec::<std::path::PathBuf>::new(),
        "a group survived delete"
    );
    for level in &levels {
        assert!(!level.exists(), "{} survived delete", level.display());
    }
}
