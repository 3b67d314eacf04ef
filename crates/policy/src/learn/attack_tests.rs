//! The plan against what an attacker (the learned command) claimed in
//! issue 45's review: each claim, and the exact bind or refusal it gets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{AccessKind, EntryKind, Host, Observations, Plan, PlanInput, plan};
use AccessKind::*;

#[derive(Default)]
struct Fake {
    entries: BTreeMap<PathBuf, EntryKind>,
    sockets: BTreeSet<PathBuf>,
    credential_names: BTreeSet<PathBuf>,
}

impl Fake {
    fn new(files: &[&str], dirs: &[&str]) -> Self {
        let mut f = Fake::default();
        for p in files {
            f.entries.insert(PathBuf::from(p), EntryKind::File);
        }
        for d in dirs {
            f.entries.insert(PathBuf::from(d), EntryKind::Dir);
        }
        f
    }
}

impl Host for Fake {
    fn kind(&self, path: &Path) -> Option<EntryKind> {
        self.entries.get(path).copied()
    }
    fn resolve(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
    fn holds_socket(&self, dir: &Path) -> bool {
        self.sockets.iter().any(|s| s.starts_with(dir))
    }
    fn holds_credential_name(&self, dir: &Path) -> bool {
        self.credential_names.iter().any(|s| s.starts_with(dir))
    }
}

fn input() -> PlanInput {
    PlanInput {
        base: "worker".into(),
        command: vec!["sh".into()],
        home: Some(PathBuf::from("/home/ann")),
        covered: ["/usr", "/tmp", "/proc", "/dev", "/home/ann/proj"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    }
}

fn run(host: &Fake, items: &[(&str, AccessKind)]) -> Plan {
    let mut o = Observations::default();
    for (p, k) in items {
        o.record_path(PathBuf::from(p), *k);
    }
    plan(&o, &input(), host)
}

fn binds(p: &Plan) -> Vec<(String, bool)> {
    p.binds
        .iter()
        .map(|b| (b.source.display().to_string(), b.writable))
        .collect()
}

fn refused(p: &Plan) -> Vec<String> {
    p.refused
        .iter()
        .map(|r| r.path.display().to_string())
        .collect()
}

#[test]
fn a_write_claim_never_makes_a_directory_writable() {
    let host = Fake::new(
        &["/home/ann/.cargo/bin/cargo", "/home/ann/.cache/x/a"],
        &[
            "/home/ann",
            "/home/ann/.config/systemd",
            "/home/ann/projects",
            "/home/ann/.cargo/bin",
            "/home/ann/.cache/x",
            "/srv/new",
        ],
    );
    let p = run(
        &host,
        &[
            // O_WRONLY of a directory (EISDIR): no claim at all.
            ("/home/ann/.config/systemd", Write),
            ("/home/ann/projects", Write),
            // A toolchain's program, truncated: refused, never its root rw.
            ("/home/ann/.cargo/bin/cargo", Write),
            // A new file outside the home: its directory stays as it is.
            ("/srv/new/file", Write),
            // A cache file written and read: the file rw, nothing wider.
            ("/home/ann/.cache/x/a", Write),
            ("/home/ann/.cache/x/a", Read),
        ],
    );
    assert_eq!(
        binds(&p),
        vec![("/home/ann/.cache/x/a".to_string(), true)],
        "{p:?}"
    );
    assert_eq!(
        refused(&p),
        ["/home/ann/.cargo/bin/cargo", "/srv/new/file"],
        "{p:?}"
    );
}

#[test]
fn directories_of_sockets_are_refused_whole() {
    let mut host = Fake::new(
        &[
            "/run/libvirt/libvirt-sock",
            "/srv/app/s.sock",
            "/run/x.conf",
        ],
        &[
            "/run/libvirt",
            "/run/user/4242/systemd",
            "/srv/app",
            "/srv/app/sub",
        ],
    );
    host.sockets.insert(PathBuf::from("/srv/app/sub/s.sock"));
    let p = run(
        &host,
        &[
            ("/run/libvirt", List),
            ("/run/user/4242/systemd", List),
            ("/srv/app", List),
            ("/run/x.conf", Read),
        ],
    );
    assert_eq!(binds(&p), vec![("/run/x.conf".to_string(), false)]);
    assert_eq!(
        refused(&p),
        ["/run/libvirt", "/run/user/4242/systemd", "/srv/app"]
    );
    assert!(p.refused.iter().all(|r| r.why.contains("sockets")), "{p:?}");
}

#[test]
fn a_home_gives_only_known_safe_configuration() {
    let mut host = Fake::new(
        &[
            "/home/ann/.npmrc",
            "/home/ann/.claude/.credentials.json",
            "/home/ann/.codex/auth.json",
            "/home/ann/.gitconfig",
            "/home/ann/projects/secret/a",
            "/etc/letsencrypt/live/x/privkey.pem",
            "/etc/wireguard/wg0.conf",
            "/var/backups/shadow.bak",
            "/opt/app/README",
        ],
        &["/opt/app", "/opt/app/.aws", "/home/ann/projects/secret"],
    );
    host.credential_names.insert(PathBuf::from("/opt/app/.aws"));
    let p = run(
        &host,
        &[
            ("/home/ann/.npmrc", Read),
            ("/home/ann/.claude/.credentials.json", Read),
            ("/home/ann/.codex/auth.json", Read),
            ("/home/ann/.gitconfig", Read),
            ("/home/ann/projects/secret/a", Read),
            ("/etc/letsencrypt/live/x/privkey.pem", Read),
            ("/etc/wireguard/wg0.conf", Read),
            ("/var/backups/shadow.bak", Read),
            ("/opt/app/README", Read),
        ],
    );
    // /opt/app holds .aws: its file alone, never the root.
    assert_eq!(
        binds(&p),
        vec![
            ("/home/ann/.gitconfig".to_string(), false),
            ("/opt/app/README".to_string(), false)
        ]
    );
    assert_eq!(refused(&p).len(), 7, "{p:?}");
}

#[test]
fn the_collapse_never_widens_into_a_home_or_a_credential_holder() {
    let mut host = Fake::new(
        &[
            "/srv/svc/a",
            "/srv/svc/b",
            "/srv/svc/c",
            "/var/tmp/x",
            "/srv/ok/a",
            "/srv/ok/b",
            "/srv/ok/c",
        ],
        &["/srv/svc", "/srv/svc2", "/srv/ok"],
    );
    host.credential_names
        .insert(PathBuf::from("/srv/svc/.aws/credentials"));
    host.credential_names
        .insert(PathBuf::from("/srv/svc2/.aws/credentials"));
    let p = run(
        &host,
        &[
            ("/srv/svc/a", Read),
            ("/srv/svc/b", Read),
            ("/srv/svc/c", Read),
            ("/srv/svc2", List),
            ("/var/tmp/x", Read),
            ("/srv/ok/a", Read),
            ("/srv/ok/b", Read),
            ("/srv/ok/c", Read),
        ],
    );
    assert_eq!(
        binds(&p),
        vec![
            ("/srv/ok".to_string(), false),
            ("/srv/svc/a".to_string(), false),
            ("/srv/svc/b".to_string(), false),
            ("/srv/svc/c".to_string(), false),
        ]
    );
    assert_eq!(refused(&p), ["/srv/svc2", "/var/tmp/x"]);
}

#[test]
fn many_paths_plan_in_linear_time() {
    let mut files = Vec::new();
    for i in 0..4000 {
        files.push(format!("/srv/d{}/e{}/f{i}", i % 50, i % 7));
    }
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    let host = Fake::new(&refs, &[]);
    let items: Vec<(&str, AccessKind)> = refs.iter().map(|f| (*f, Read)).collect();
    let started = std::time::Instant::now();
    let p = run(&host, &items);
    assert_eq!(p.binds.len(), 4000);
    // 2.2 s in a debug build here, 8 s with a release build beside it:
    // a loose bound, against a plan gone quadratic or worse.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

#[test]
fn the_record_is_bounded_in_bytes_not_only_in_paths() {
    let mut o = Observations::default();
    let long = "a".repeat(4000);
    for i in 0..4000 {
        o.record_path(PathBuf::from(format!("/{long}/{i}")), Look);
    }
    assert!(o.truncated, "4000 names of 4 KB kept whole");
    assert!(o.path_bytes <= super::MAX_PATH_BYTES);
    assert_eq!(o.paths.len(), super::MAX_PATH_BYTES / 4006);
}
