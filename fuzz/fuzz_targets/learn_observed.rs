//! Arbitrary bytes as what `learn`'s observer reads from the observed
//! command's memory: a path (NUL-terminated) or a socket address, the first
//! byte picking which and the kind of access; then the path through the
//! plan and the policy text, on a host where every path exists. Invariants:
//! nothing panics; a path taken is non-empty, without NUL, under PATH_MAX,
//! and once made absolute has no `.` or `..` and stays the same made
//! absolute again; a planned bind is never a secret place and its name is
//! plain text; the policy text is TOML that extends the base and holds
//! exactly the planned binds (a name cannot end a comment and add a line);
//! a destination reads as plain text.
#![no_main]

use std::path::{Component, Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use substrat_policy::learn::parse::{PATH_MAX, absolute, c_path, sockaddr};
use substrat_policy::learn::secret::secret_of;
use substrat_policy::learn::{AccessKind, EntryKind, Host, Observations, PlanInput, plan, render};
use substrat_policy::text::escape_text;

struct Everything;

impl Host for Everything {
    fn kind(&self, path: &Path) -> Option<EntryKind> {
        Some(if path.as_os_str().len() % 2 == 0 { EntryKind::Dir } else { EntryKind::File })
    }
    fn resolve(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
}

const KINDS: [AccessKind; 5] = [
    AccessKind::Read,
    AccessKind::List,
    AccessKind::Exec,
    AccessKind::Write,
    AccessKind::Look,
];

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else { return };
    if first & 0x80 != 0 {
        if let Ok(d) = sockaddr(rest) {
            let text = d.to_string();
            assert_eq!(escape_text(&text), text, "{text:?}");
        }
        return;
    }
    let Ok(path) = c_path(rest) else { return };
    let bytes = path.as_os_str().as_encoded_bytes();
    assert!(!bytes.is_empty() && !bytes.contains(&0) && bytes.len() < PATH_MAX);
    let home = PathBuf::from("/home/ann");
    let full = absolute(&home.join("proj"), &path);
    assert!(full.is_absolute());
    assert!(full.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
    assert_eq!(absolute(Path::new("/"), &full), full);
    let mut seen = Observations::default();
    seen.record_path(full.clone(), KINDS[usize::from(*first) % KINDS.len()]);
    seen.record_path(full.join("x"), AccessKind::Read);
    let input = PlanInput {
        base: "worker".to_string(),
        command: vec![String::from_utf8_lossy(rest).into_owned()],
        home: Some(home.clone()),
        covered: vec![PathBuf::from("/usr"), home.join("proj")],
    };
    let planned = plan(&seen, &input, &Everything);
    for bind in &planned.binds {
        assert!(secret_of(&bind.source, Some(&home)).is_none(), "{:?}", bind.source);
        let text = bind.source.to_str().expect("a bind's name is UTF-8");
        assert_eq!(escape_text(text), text);
        assert!(!text.contains("${"));
    }
    let policy = render(&planned, &seen, &input);
    let value: toml::Value = toml::from_str(&policy).expect("the policy is TOML");
    assert_eq!(value.get("extends").and_then(|v| v.as_str()), Some("worker"));
    let binds = value
        .get("filesystem")
        .and_then(|f| f.get("binds_add"))
        .and_then(|b| b.as_array())
        .map(Vec::len);
    assert_eq!(binds, Some(planned.binds.len()), "{policy}");
});
