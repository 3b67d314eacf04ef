//! `agent cert NAME --out DIR`: the daemon's answer (the agent's new
//! certificate, its key and the authority's certificate, PEM) written to
//! files a relay on another host is given; the answer shown names the
//! files, never the key.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Makes `out` (0700) or checks it, before the daemon is asked (a
/// `--replace` revokes the old certificate: the new one must have
/// somewhere to go). It must be the user's own and writable by no one
/// else: whoever can swap `ca.crt` there chooses whom the relay trusts.
pub fn prepare(out: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(out)
        .with_context(|| format!("--out {}", out.display()))?;
    let meta =
        std::fs::symlink_metadata(out).with_context(|| format!("--out {}", out.display()))?;
    if !meta.is_dir() {
        bail!("--out {}: not a directory", out.display());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        bail!(
            "--out {}: must be your own directory, writable by no one else (chmod go-w)",
            out.display()
        );
    }
    let probe = out.join(".substrat-write-test");
    std::fs::write(&probe, b"")
        .with_context(|| format!("--out {}: not writable", out.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Writes agent.crt, agent.key (0600) and ca.crt into `out` (`prepare`d;
/// files there are replaced) and returns what to show.
pub fn write(out: &Path, reply: Value) -> Result<Value> {
    let mut files = serde_json::Map::new();
    for (field, file, mode) in [
        ("cert", "agent.crt", 0o644),
        ("key", "agent.key", 0o600),
        ("ca", "ca.crt", 0o644),
    ] {
        let Some(text) = reply[field].as_str() else {
            bail!("the daemon's answer has no {field}");
        };
        let path = out.join(file);
        // Replaced, not rewritten: a new file gets the mode (an old key
        // file's wider mode, or a symlink there, is not followed).
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("replace {}", path.display()));
            }
            _ => {}
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .with_context(|| format!("write {}", path.display()))?;
        files.insert(field.to_string(), json!(path));
    }
    Ok(json!({
        "ok": true,
        "name": reply["name"], "id": reply["id"], "fingerprint": reply["fingerprint"],
        "cert": files["cert"], "key": files["key"], "ca": files["ca"],
        "certificates": reply["certificates"],
    }))
}
