//! The plan and the policy text, compared whole, on a made-up host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::parse::{Destination, absolute, c_path, sockaddr};
use super::{AccessKind, EntryKind, Host, Observations, PlanInput, plan, render};

struct FakeHost {
    entries: BTreeMap<PathBuf, EntryKind>,
    links: BTreeMap<PathBuf, PathBuf>,
}

impl FakeHost {
    fn new(files: &[&str], dirs: &[&str], links: &[(&str, &str)]) -> Self {
        let mut entries = BTreeMap::new();
        for f in files {
            entries.insert(PathBuf::from(f), EntryKind::File);
        }
        for d in dirs {
            entries.insert(PathBuf::from(d), EntryKind::Dir);
        }
        let links = links
            .iter()
            .map(|(a, b)| (PathBuf::from(a), PathBuf::from(b)))
            .collect();
        FakeHost { entries, links }
    }
}

impl Host for FakeHost {
    fn kind(&self, path: &Path) -> Option<EntryKind> {
        let path = self.resolve(path);
        self.entries.get(&path).copied()
    }
    fn resolve(&self, path: &Path) -> PathBuf {
        self.links
            .get(path)
            .cloned()
            .unwrap_or_else(|| path.to_path_buf())
    }
}

fn input() -> PlanInput {
    PlanInput {
        base: "worker".to_string(),
        command: vec!["sh".into(), "-c".into(), "make\ntest".into()],
        home: Some(PathBuf::from("/home/ann")),
        covered: ["/usr", "/tmp", "/proc", "/dev", "/home/ann/proj"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    }
}

fn observed(items: &[(&str, AccessKind)]) -> Observations {
    let mut o = Observations::default();
    for (p, k) in items {
        o.record_path(PathBuf::from(p), *k);
    }
    o
}

#[test]
fn a_learned_policy_is_the_least_binds_with_reasons_and_refusals() {
    use AccessKind::*;
    let host = FakeHost::new(
        &[
            "/usr/lib/os-release",
            "/etc/hostname",
            "/etc/gitconfig",
            "/home/ann/.gitconfig",
            "/home/ann/.bashrc",
            "/home/ann/.ssh/id_ed25519",
            "/etc/shadow",
            "/srv/data/a",
            "/srv/data/b",
            "/srv/data/c",
            "/srv/other/file",
            "/home/ann/.cache/pip/x/y.whl",
        ],
        &[
            "/etc",
            "/srv",
            "/srv/data",
            "/home/ann/.cache",
            "/home/ann/.cache/pip",
            "/home/ann/.cache/pip/x",
            "/home/ann/.ssh",
            "/home/ann",
        ],
        &[
            ("/etc/os-release", "/usr/lib/os-release"),
            ("/home/ann/proj/key", "/home/ann/.ssh/id_ed25519"),
            ("/home/ann/proj/data", "/srv/other/file"),
        ],
    );
    let mut o = observed(&[
        ("/etc/os-release", Read),
        ("/etc/hostname", Read),
        ("/etc/hostname", Look),
        ("/etc/missing.conf", Read),
        ("/etc/shadow", Read),
        ("/usr/bin/cat", Exec),
        ("/tmp/x", Write),
        ("/home/ann/.ssh/id_ed25519", Read),
        ("/home/ann/.gitconfig", Read),
        ("/home/ann/.bashrc", Write),
        ("/srv/data/a", Read),
        ("/srv/data/b", Read),
        ("/srv/data/c", Read),
        ("/home/ann/proj/data", Read),
        ("/home/ann/proj/src/main.c", Read),
        ("/home/ann/.cache/pip/x/y.whl", Write),
        ("/etc/new.conf", Write),
        ("/etc", List),
        ("/home/ann", List),
        ("/home", Look),
        ("/", Look),
    ]);
    o.record_destination(Destination::Inet("10.0.0.1:443".into()));
    let p = plan(&o, &input(), &host);
    let text = render(&p, &o, &input());
    assert_eq!(
        text,
        r#"# Learned by substrat-sandbox learn: what sh -c 'make\ntest' used beyond worker.
# Checked (`check --fail-on high`) and replayed under this policy before it was written.
# Wanted, not granted (never added):
#   /etc: a directory holding secret places or homes (only its entries can be granted)
#   /etc/new.conf: a new file outside the workspace and the home (a directory is never made writable)
#   /etc/shadow: the host's password hashes (/etc/shadow)
#   /home/ann: a directory holding secret places or homes (only its entries can be granted)
#   /home/ann/.bashrc: a shell startup file or tool configuration (what is written there runs later)
#   /home/ann/.ssh/id_ed25519: credentials (~/.ssh of /home/ann)
# Connections tried (the base's network is kept):
#   10.0.0.1:443
version = 1
extends = "worker"
description = '''worker, plus what the command sh -c 'make\ntest' used (learned)'''

[filesystem]
binds_add = [
  # read, looked up: /etc/hostname
  { source = "/etc/hostname", mode = "ro" },
  # read: /etc/os-release
  { source = "/etc/os-release", mode = "ro" },
  # written: /home/ann/.cache/pip/x/y.whl
  { source = "${HOME}/.cache/pip/x/y.whl", mode = "rw" },
  # read: /home/ann/.gitconfig
  { source = "${HOME}/.gitconfig", mode = "ro" },
  # read: 3 paths, e.g. /srv/data/a
  { source = "/srv/data", mode = "ro" },
  # read: /home/ann/proj/data
  { source = "/srv/other/file", mode = "ro" },
]
"#
    );
}

#[test]
fn paths_from_memory_are_bounded_and_normalized() {
    assert_eq!(c_path(b"/etc/x\0junk"), Ok(PathBuf::from("/etc/x")));
    assert!(c_path(b"\0").is_err());
    assert!(c_path(&[b'a'; 5000]).is_err(), "no NUL within PATH_MAX");
    assert_eq!(
        absolute(Path::new("/w/src"), Path::new("../a/./b/../c")),
        PathBuf::from("/w/a/c")
    );
    assert_eq!(
        absolute(Path::new("/"), Path::new("../../x")),
        PathBuf::from("/x")
    );
}

#[test]
fn socket_addresses_read_as_people_read_them() {
    let mut v4 = vec![2u8, 0, 0x01, 0xbb, 10, 0, 0, 1];
    v4.extend([0; 8]);
    assert_eq!(sockaddr(&v4), Ok(Destination::Inet("10.0.0.1:443".into())));
    let mut unix = vec![1u8, 0];
    unix.extend(b"/run/x\nsock\0");
    assert_eq!(
        sockaddr(&unix),
        Ok(Destination::Unix("/run/x\\nsock".into()))
    );
    assert!(sockaddr(&[2u8, 0, 1]).is_err());
    assert!(sockaddr(&[10u8, 0, 0, 80, 0, 0, 0, 0]).is_err());
}
