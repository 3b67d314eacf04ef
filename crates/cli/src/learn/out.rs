//! `--out`: never where the learned command could write (the workspace,
//! a writable bind of the base or of the learned policy), never through a
//! link: a temporary file in the same directory, renamed over the name
//! (rename replaces a link, never follows it), and a name that is a link
//! refused.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Where `out` is, resolved; refused when the command could write there.
pub fn destination(out: &Path, workspace: &Path, writable: &[PathBuf]) -> Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("--out {}: not a file name", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = parent
        .canonicalize()
        .with_context(|| format!("--out {}: its directory", out.display()))?;
    let dest = parent.join(name);
    refuse_writable(&dest, workspace, writable)?;
    refuse_link(&dest)?;
    Ok(dest)
}

fn refuse_writable(dest: &Path, workspace: &Path, writable: &[PathBuf]) -> Result<()> {
    if dest.starts_with(workspace) {
        bail!(
            "--out {} is in the workspace, which the command writes: it could plant a link \
             there or change the policy after the check; write it elsewhere",
            dest.display()
        );
    }
    if let Some(w) = writable.iter().find(|w| {
        let w = w.canonicalize().unwrap_or_else(|_| w.to_path_buf());
        dest.starts_with(&w)
    }) {
        bail!(
            "--out {} is in {}, which the command may write: write it elsewhere",
            dest.display(),
            w.display()
        );
    }
    Ok(())
}

fn refuse_link(dest: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dest).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "--out {} is a symbolic link: not written through it",
            dest.display()
        );
    }
    Ok(())
}

/// Writes `text` at `dest` (from `destination`), refusing it when the
/// learned policy lets the command write there.
pub fn write(dest: &Path, text: &str, learned_writable: &[PathBuf]) -> Result<()> {
    refuse_writable(dest, Path::new("/nonexistent/workspace"), learned_writable)?;
    refuse_link(dest)?;
    let dir = dest.parent().unwrap_or(Path::new("/"));
    let mut tmp = tempfile::Builder::new()
        .prefix(".substrat-learn")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(dest)
        .with_context(|| format!("cannot write {}", dest.display()))?;
    Ok(())
}
