//! Engine places judged by what a bind really is (issue 44, the
//! attacker's review of hostsock): the kubelet bind-mounts a pod's
//! `subPath` at `pods/UID/volume-subpaths/...`, a path that looked like
//! the pod's own, so host directories came in idmapped (host root).
//!
//! The test makes the kubelet's layout in a mount namespace of its own
//! (a tmpfs on /var/lib/kubelet, private, the host's untouched), on the
//! thread that then runs `substrat-oci` (its children inherit it).

use std::path::Path;

use nix::mount::{MsFlags, mount};
use serde_json::json;

use super::{Bundle, pid_of, runnable, wait_launcher};

const POD: &str = "0123abcd-1111-4222-8333-444455556666";

/// This thread in a private mount namespace with an empty kubelet
/// directory; false (and why, printed) when that cannot be made.
fn private_kubelet(test: &str) -> bool {
    let made = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .and_then(|()| {
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
        })
        .and_then(|()| {
            std::fs::create_dir_all("/var/lib/kubelet").map_err(|_| nix::errno::Errno::EIO)
        })
        .and_then(|()| {
            mount(
                Some("tmpfs"),
                "/var/lib/kubelet",
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=755"),
            )
        });
    if let Err(e) = made {
        println!("SKIPPED {test}: no private mount namespace for the kubelet's layout: {e}");
        return false;
    }
    true
}

fn bind_mount(from: &Path, at: &Path) {
    std::fs::create_dir_all(at).expect("mount point");
    mount(Some(from), at, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
}

/// Creates container `id` of pod `POD` binding `source` read-write at
/// /hx; runs `script` and returns its output, or the refusal.
fn run_in_pod(source: &Path, id: &str, script: &str) -> Result<String, String> {
    let source = source.display().to_string();
    let bundle =
        Bundle::new(script, |config| {
            config["mounts"].as_array_mut().expect("mounts").push(json!({
            "destination": "/hx", "type": "bind", "source": source, "options": ["rbind", "rw"]
        }));
            config["linux"]["cgroupsPath"] = json!(format!("/kubepods/besteffort/pod{POD}/{id}"));
        });
    let created = bundle.create(id, &[]);
    if !created.status.success() {
        return Err(bundle.output());
    }
    let pid = pid_of(&bundle.state(id));
    assert!(bundle.oci(&["start", id]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    let out = bundle.output();
    assert!(bundle.oci(&["delete", id]).status.success());
    Ok(out)
}

const TRY: &str = "cat /hx/secret >/dev/null 2>&1 && echo secret-opened || echo secret-closed; \
                   echo x > /hx/made 2>/dev/null && echo made-opened || echo made-closed";

/// Attacker's subpath.sh: a pod with `hostPath` `/` and `subPath` `etc`
/// (the kubelet binds host /etc at `volume-subpaths/vol/ctr/0`) was "own",
/// allowed read-write and idmapped: /etc/shadow read, host /etc written as
/// root. A root-only host directory bound the same way was opened by
/// container root. Now both are judged as what they are: /etc refused,
/// the directory shown as it is; the pod's own emptyDir through a subPath
/// stays the pod's.
#[test]
fn atk_a_kubelet_subpath_is_judged_by_what_it_binds() {
    let test = "atk_a_kubelet_subpath_is_judged_by_what_it_binds";
    if !runnable(test) || !private_kubelet(test) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let pod = Path::new("/var/lib/kubelet/pods").join(POD);
    let subpaths = pod.join("volume-subpaths/vol/ctr");
    // A root-only host directory (as root leaves one, no list names it).
    let host = tempfile::tempdir().expect("host dir");
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(host.path().join("secret"), "root's").expect("secret");
    std::fs::set_permissions(
        host.path().join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod secret");
    // The pod's emptyDir, and the three subPath binds.
    let empty = pod.join("volumes/kubernetes.io~empty-dir/cache/sub");
    std::fs::create_dir_all(&empty).expect("emptyDir");
    std::fs::write(empty.join("secret"), "the pod's").expect("pod file");
    std::fs::set_permissions(empty.join("secret"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    bind_mount(Path::new("/etc"), &subpaths.join("0"));
    bind_mount(host.path(), &subpaths.join("1"));
    bind_mount(&empty, &subpaths.join("2"));

    // Read only: were it let in, nothing is written to the host's /etc.
    let shadow = "head -c 5 /hx/shadow >/dev/null && echo shadow-read";
    let etc = run_in_pod(&subpaths.join("0"), "subpathetc", shadow);
    let refusal = etc.expect_err("host /etc came in read-write through a subPath");
    assert!(
        refusal.contains("/etc") && refusal.contains("refused"),
        "{refusal}"
    );
    let stranger = run_in_pod(&subpaths.join("1"), "subpathhost", TRY).expect("as it is");
    assert!(
        stranger.contains("secret-closed") && stranger.contains("made-closed"),
        "root's directory was the container's: {stranger}"
    );
    let own = run_in_pod(&subpaths.join("2"), "subpathown", TRY).expect("the pod's own");
    assert!(
        own.contains("secret-opened") && own.contains("made-opened"),
        "the pod's emptyDir was not its own: {own}"
    );
    println!("subPath: /etc refused; root's dir: {stranger}; emptyDir: {own}");
}

/// The attacker's procroot.sh: a source reached through another mount
/// namespace (`/proc/PID/root/...`, another container's) is on a mount
/// this namespace does not have; its path said nothing true (the kernel
/// refused it later, at open_tree). Refused at create, by name.
#[test]
fn atk_a_source_in_another_mount_namespace_is_refused() {
    let test = "atk_a_source_in_another_mount_namespace_is_refused";
    if !runnable(test) {
        return;
    }
    let host = tempfile::tempdir().expect("host dir");
    let dir = host.path().join("x");
    std::fs::create_dir(&dir).expect("x");
    // Another namespace with a tmpfs of its own at `x`.
    let mut other = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs tmpfs {} && echo mounted && exec sleep 60",
            dir.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut line = String::new();
    let stdout = other.stdout.take().expect("stdout");
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    if line.trim() != "mounted" {
        let _ = other.kill();
        let _ = other.wait();
        println!("SKIPPED {test}: no other mount namespace with a tmpfs ({line:?})");
        return;
    }
    let via = format!("/proc/{}/root{}", other.id(), dir.display());
    let bundle = Bundle::new("echo in", |config| {
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({
                "destination": "/hx", "type": "bind", "source": via, "options": ["rbind", "ro"]
            }));
    });
    let created = bundle.create("procroot", &[]);
    let _ = other.kill();
    let _ = other.wait();
    let out = bundle.output();
    assert!(
        !created.status.success(),
        "another namespace's mount was bound: {out}"
    );
    assert!(
        out.contains("mount namespace") && out.contains("mounts[4]"),
        "{out}"
    );
}

/// The attacker's grant_link.sh: the operator grants `/var/tmp/shared`
/// (allow and idmap); an unprivileged user pre-creates it as a link to
/// `/`. Grants were canonicalised at each read: the grant became `/`, and
/// a bind of /etc read-write was allowed and idmapped. A grant is now
/// taken as written: a link in it fails the configuration, by name.
#[test]
fn atk_a_grant_planted_as_a_link_grants_nothing() {
    let test = "atk_a_grant_planted_as_a_link_grants_nothing";
    if !runnable(test) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let shared = tempfile::tempdir().expect("shared");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod");
    let planted = shared.path().join("shared");
    std::os::unix::fs::symlink("/", &planted).expect("link");
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &planted,
        Some(65534.into()),
        Some(65534.into()),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .expect("nobody's link");
    let config = shared.path().join("oci.toml");
    let granted = planted.display();
    std::fs::write(
        &config,
        format!("allow_host_paths = [\"{granted}\"]\nidmap_host_paths = [\"{granted}\"]\n"),
    )
    .expect("config");
    let config = config.display().to_string();
    let bundle = Bundle::new("head -c 5 /he/shadow >/dev/null && echo shadow-read", |c| {
        c["mounts"].as_array_mut().expect("mounts").push(json!({
            "destination": "/he", "type": "bind", "source": "/etc", "options": ["rbind", "rw"]
        }));
    });
    let created = bundle.create("grantlink", &[("SUBSTRAT_OCI_CONFIG", &config)]);
    let out = bundle.output();
    if created.status.success() {
        let pid = pid_of(&bundle.state("grantlink"));
        let _ = bundle.oci(&["start", "grantlink"]);
        let _ = wait_launcher(pid);
        let _ = bundle.oci(&["delete", "-f", "grantlink"]);
        panic!(
            "host /etc was bound through a planted grant: {}",
            bundle.output()
        );
    }
    assert!(
        out.contains("holds a link") && out.contains(&granted.to_string()),
        "{out}"
    );
}
