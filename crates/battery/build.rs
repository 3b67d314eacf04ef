//! SUBSTRAT_PROBE_SOURCE: a digest of the probe's source files
//! (crates/probe/src), so that the battery's digest changes with any
//! change of the probe, not only of the tables. Outside this repository's
//! layout (no probe source beside this crate) it is `none`.

use std::path::{Path, PathBuf};

fn main() {
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../probe/src");
    println!("cargo:rerun-if-changed={}", probe.display());
    let mut files = Vec::new();
    collect(&probe, &mut files);
    files.sort();
    let digest = match files.is_empty() {
        true => "none".to_string(),
        false => {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for file in &files {
                let name = file.strip_prefix(&probe).unwrap_or(file);
                let bytes = std::fs::read(file).unwrap_or_default();
                let name = name.to_string_lossy();
                for byte in name.bytes().chain([0]).chain(bytes).chain([0]) {
                    hash ^= u64::from(byte);
                    hash = hash.wrapping_mul(0x0100_0000_01b3);
                }
            }
            format!("{hash:016x}")
        }
    };
    println!("cargo:rustc-env=SUBSTRAT_PROBE_SOURCE={digest}");
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
