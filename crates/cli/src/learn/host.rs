//! The host as the plan asks about it: what a path is, and where its
//! links lead (its longest existing part resolved, the rest kept).

use std::path::{Path, PathBuf};

use substrat_policy::learn::{EntryKind, Host};

#[derive(Debug)]
pub struct RealHost;

impl Host for RealHost {
    fn kind(&self, path: &Path) -> Option<EntryKind> {
        let meta = std::fs::metadata(path).ok()?;
        Some(if meta.is_dir() {
            EntryKind::Dir
        } else {
            EntryKind::File
        })
    }

    fn resolve(&self, path: &Path) -> PathBuf {
        for existing in path.ancestors() {
            if let Ok(real) = existing.canonicalize()
                && let Ok(rest) = path.strip_prefix(existing)
            {
                // join("") would add a trailing `/` (a file then reads as absent).
                return match rest.as_os_str().is_empty() {
                    true => real,
                    false => real.join(rest),
                };
            }
        }
        path.to_path_buf()
    }
}
