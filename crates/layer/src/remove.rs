//! Removing a tree of the layer: never following a symlink, and making
//! directories the agent left unwritable (mode 000) removable first: they
//! are the launcher's own files.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::LayerError;

pub(crate) fn remove_tree(path: &Path) -> Result<(), LayerError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LayerError::io("stat", path, e)),
    };
    if !meta.is_dir() {
        return fs::remove_file(path).map_err(|e| LayerError::io("remove", path, e));
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))
            .map_err(|e| LayerError::io("make removable", path, e))?;
    }
    for entry in fs::read_dir(path).map_err(|e| LayerError::io("read", path, e))? {
        let entry = entry.map_err(|e| LayerError::io("read", path, e))?;
        remove_tree(&entry.path())?;
    }
    fs::remove_dir(path).map_err(|e| LayerError::io("remove", path, e))
}

/// Bytes a tree takes on its filesystem (blocks, links not followed).
pub(crate) fn disk_usage(path: &Path) -> Result<u64, LayerError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LayerError::io("stat", path, e)),
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(|e| LayerError::io("read", path, e))? {
            let entry = entry.map_err(|e| LayerError::io("read", path, e))?;
            total += disk_usage(&entry.path())?;
        }
    }
    Ok(total)
}
