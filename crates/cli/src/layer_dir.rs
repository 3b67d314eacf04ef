//! Where `--keep-layer DIR` is, resolved before anything is made there
//! (`..` and links followed as the kernel would), and what a launch made
//! of it, so a launch that fails takes back what it made.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

/// What a launch made of its layer directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Made {
    /// The layer existed: only the launch's turn is new.
    Turn,
    /// The directory existed, empty: what is in it is new.
    Contents,
    /// The directory did not: this one (it, or an ancestor) is new.
    Tree(PathBuf),
}

/// `given` (relative to the current directory) resolved: its longest
/// existing part canonicalized, the rest (names that do not exist, so no
/// links) applied to it by name. With what the launch will make there.
pub fn resolve(given: &Path) -> Result<(PathBuf, Made)> {
    let absolute = if given.is_absolute() {
        given.to_path_buf()
    } else {
        std::env::current_dir()
            .context("cannot read the current directory")?
            .join(given)
    };
    let parts: Vec<Component<'_>> = absolute.components().collect();
    let mut split = parts.len();
    let base = loop {
        let prefix: PathBuf = parts[..split].iter().collect();
        match std::fs::symlink_metadata(&prefix) {
            Ok(_) => {
                break prefix.canonicalize().with_context(|| {
                    format!(
                        "the layer {}: cannot resolve {}",
                        given.display(),
                        prefix.display()
                    )
                })?;
            }
            Err(e) if e.kind() == ErrorKind::NotFound && split > 1 => split -= 1,
            Err(e) => {
                return Err(e).with_context(|| format!("the layer {}", given.display()));
            }
        }
    };
    let mut dir = base;
    for part in &parts[split..] {
        match part {
            Component::Normal(name) => dir.push(name),
            Component::ParentDir => {
                dir.pop();
            }
            _ => {}
        }
    }
    let made = made_by_launch(&dir, given)?;
    Ok((dir, made))
}

/// What making the layer at `dir` (resolved) will make.
fn made_by_launch(dir: &Path, given: &Path) -> Result<Made> {
    let missing = dir
        .ancestors()
        .take_while(|a| std::fs::symlink_metadata(a).is_err())
        .last();
    if let Some(top) = missing {
        return Ok(Made::Tree(top.to_path_buf()));
    }
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(match entries.next() {
            None => Made::Contents,
            Some(_) => Made::Turn,
        }),
        Err(e) if e.kind() == ErrorKind::NotADirectory => {
            bail!("the layer {} is not a directory", given.display())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read the layer {}", given.display())),
    }
}

/// Takes back what a launch that failed made: the tree, the contents of
/// the empty directory it was given, or its turn (`turn_dir`).
pub fn take_back(dir: &Path, made: &Made, turn_dir: &Path) -> std::io::Result<()> {
    match made {
        Made::Tree(top) => std::fs::remove_dir_all(top),
        Made::Turn => std::fs::remove_dir_all(turn_dir),
        Made::Contents => {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    std::fs::remove_dir_all(entry.path())?;
                } else {
                    std::fs::remove_file(entry.path())?;
                }
            }
            Ok(())
        }
    }
}
