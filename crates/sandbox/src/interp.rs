//! Whether a dynamically linked program can start inside a plan's view.
//!
//! The bwrap backend runs its helper (`substrat-init`) inside the sandbox,
//! where only the policy's binds exist. A dynamically linked helper needs
//! its program interpreter (the ELF `PT_INTERP`, e.g.
//! `/lib64/ld-linux-x86-64.so.2`) in that view; without it the kernel's
//! exec fails with a bare ENOENT. The launcher checks first and refuses
//! with the reason. (The native backend needs nothing of the view: its
//! init is the launcher's own process.)

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::plan::MountStep;

const PT_INTERP: u32 = 3;
/// The interpreter's path sits in the first page of every ELF file built
/// by the usual linkers; reading more is not needed.
const HEAD: u64 = 4096;

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<usize> {
    let value = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
    usize::try_from(value).ok()
}

/// The program interpreter a 64-bit little-endian ELF file asks for, read
/// from its first bytes; `None` for a static program or anything else.
pub fn elf_interpreter(head: &[u8]) -> Option<PathBuf> {
    // ELF magic, 64-bit class, little-endian.
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let table = u64_at(head, 0x20)?;
    let entry_size = usize::from(u16_at(head, 0x36)?);
    let entries = usize::from(u16_at(head, 0x38)?);
    (0..entries).find_map(|i| {
        let entry = table.checked_add(i.checked_mul(entry_size)?)?;
        if u32_at(head, entry)? != PT_INTERP {
            return None;
        }
        let offset = u64_at(head, entry + 8)?;
        let size = u64_at(head, entry + 32)?;
        let raw = head.get(offset..offset.checked_add(size)?)?;
        let text = std::str::from_utf8(raw.split(|&b| b == 0).next()?).ok()?;
        text.starts_with('/').then(|| PathBuf::from(text))
    })
}

/// The interpreter of the program at `path` (its first page is read).
pub fn program_interpreter(path: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut head = Vec::new();
    std::fs::File::open(path)?
        .take(HEAD)
        .read_to_end(&mut head)?;
    Ok(elf_interpreter(&head))
}

/// Whether `path` exists inside a view made of `mounts` (a plan's): the
/// deepest mount that covers it must be a bind whose host source has it (a
/// tmpfs, /dev or /proc over it hides the host's file).
pub fn visible_in_view(mounts: &[MountStep], path: &Path) -> bool {
    let covering = mounts
        .iter()
        .filter_map(|step| {
            let target = match step {
                MountStep::Bind { target, .. }
                | MountStep::Tmpfs { target, .. }
                | MountStep::Dev { target }
                | MountStep::Proc { target }
                | MountStep::Sysfs { target }
                | MountStep::Mqueue { target }
                | MountStep::Mask { target }
                | MountStep::Empty { target } => target,
                MountStep::Protect { .. }
                | MountStep::RootReadOnly
                | MountStep::ReadOnly { .. } => {
                    return None;
                }
            };
            let rest = path.strip_prefix(target).ok()?;
            Some((target.components().count(), step, rest))
        })
        .max_by_key(|(depth, _, _)| *depth);
    match covering {
        Some((_, MountStep::Bind { source, .. }, rest)) => source.join(rest).exists(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Access, SocketUse};

    #[test]
    fn this_test_program_names_its_interpreter_and_garbage_names_none() {
        let me = std::env::current_exe().unwrap();
        let interp = program_interpreter(&me).unwrap();
        // Test binaries are dynamically linked against the C library.
        let interp = interp.expect("a dynamically linked test binary");
        assert!(interp.is_absolute() && interp.exists(), "{interp:?}");
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(b""), None);
        // A header whose program table points past the bytes read.
        let cut = std::fs::read(&me).unwrap()[..64].to_vec();
        assert_eq!(elf_interpreter(&cut), None);
    }

    fn bind(source: &str, target: &str) -> MountStep {
        MountStep::Bind {
            source: source.into(),
            target: target.into(),
            access: Access::Ro,
            optional: false,
            socket: SocketUse::Unjudged,
        }
    }

    #[test]
    fn the_deepest_covering_mount_decides() {
        let host = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(host.path().join("lib")).unwrap();
        std::fs::write(host.path().join("lib/ld.so"), "").unwrap();
        let src = host.path().to_str().unwrap();
        let interp = Path::new("/sys-root/lib/ld.so");

        assert!(visible_in_view(&[bind(src, "/sys-root")], interp));
        // Not bound at all, or bound elsewhere.
        assert!(!visible_in_view(&[], interp));
        assert!(!visible_in_view(&[bind(src, "/other")], interp));
        // Bound, but the host source lacks the file.
        assert!(!visible_in_view(
            &[bind(src, "/sys-root")],
            Path::new("/sys-root/lib/absent.so")
        ));
        // A tmpfs deeper than the bind hides it.
        let hidden = vec![
            bind(src, "/sys-root"),
            MountStep::Tmpfs {
                target: "/sys-root/lib".into(),
                mode: 0o755,
                size: None,
            },
        ];
        assert!(!visible_in_view(&hidden, interp));
    }
}
