//! The configuration's mounts as mount steps. Binds of host paths, proc,
//! tmpfs; /dev is the runtime's own minimal one (its harmless nodes, a
//! private devpts, /dev/shm), so the configuration's /dev/pts and /dev/shm
//! are already there. Options are checked one by one: an option that
//! would change what the mount is and that the runtime does not apply is
//! refused.

use std::path::Path;

use substrat_sandbox::plan::{Access, MountStep, SocketUse};

use crate::spec::Mount;
use crate::translate::Unsupported;

/// Options that change nothing the runtime must honour: propagation (the
/// container's mounts are private anyway), access times, and nosuid/nodev
/// (every mount has them).
const HARMLESS: [&str; 12] = [
    "private",
    "rprivate",
    "slave",
    "rslave",
    "nosuid",
    "nodev",
    "relatime",
    "norelatime",
    "noatime",
    "strictatime",
    "rw",
    "defaults",
];

/// Targets the runtime's /dev already provides.
const IN_OUR_DEV: [&str; 2] = ["/dev/pts", "/dev/shm"];

fn refuse(index: usize, reason: impl Into<String>) -> Unsupported {
    Unsupported {
        field: format!("mounts[{index}]"),
        reason: reason.into(),
    }
}

/// Whether translation drops `mount` (the runtime's /dev already holds
/// its target): such a mount is never made, so never judged as a bind.
pub fn dropped(mount: &Mount) -> bool {
    let is_bind = mount.options.iter().any(|o| o == "bind" || o == "rbind");
    let kind = mount
        .kind
        .as_deref()
        .unwrap_or(if is_bind { "bind" } else { "" });
    matches!(kind, "devpts" | "tmpfs" | "bind" | "none")
        && IN_OUR_DEV.iter().any(|d| {
            crate::translate::absolute_path(&mount.destination).is_ok_and(|t| t == Path::new(d))
        })
}

/// The step for one mount; `None` when the runtime's /dev already holds it.
pub fn mount_step(
    index: usize,
    mount: &Mount,
    notes: &mut Vec<String>,
) -> Result<Option<MountStep>, Unsupported> {
    let target = crate::translate::absolute_path(&mount.destination)
        .map_err(|reason| refuse(index, reason))?;
    if mount.uid_mappings.is_some() || mount.gid_mappings.is_some() {
        return Err(refuse(
            index,
            "idmapped mounts from the configuration are not supported",
        ));
    }
    let is_bind = mount.options.iter().any(|o| o == "bind" || o == "rbind");
    let kind = mount
        .kind
        .as_deref()
        .unwrap_or(if is_bind { "bind" } else { "" });
    if dropped(mount) {
        notes.push(format!(
            "mounts[{index}]: {} comes with the runtime's /dev (its size not limited)",
            target.display()
        ));
        return Ok(None);
    }
    match kind {
        "bind" | "none" if is_bind || kind == "bind" => {
            let step = bind_step(index, mount, target)?;
            if mount.options.iter().any(|o| o == "noexec") {
                notes.push(format!(
                    "mounts[{index}]: `noexec` of a read-only file not applied"
                ));
            }
            Ok(Some(step))
        }
        "proc" => {
            only_options(index, mount, &["noexec"])?;
            Ok(Some(MountStep::Proc { target }))
        }
        "tmpfs" if target == Path::new("/dev") => {
            notes.push(format!(
                "mounts[{index}]: /dev is the runtime's own (null, zero, full, random, urandom, tty, pts, shm; its size not limited)"
            ));
            Ok(Some(MountStep::Dev { target }))
        }
        "tmpfs" => tmpfs_step(index, mount, target).map(Some),
        "sysfs" => {
            only_options(index, mount, &["noexec", "ro"])?;
            if !mount.options.iter().any(|o| o == "ro") {
                notes.push(format!("mounts[{index}]: sysfs is read-only"));
            }
            Ok(Some(MountStep::Sysfs { target }))
        }
        "mqueue" => {
            only_options(index, mount, &["noexec"])?;
            Ok(Some(MountStep::Mqueue { target }))
        }
        // A cgroup filesystem of its own needs a cgroup namespace, which the
        // sandbox does not have yet: the container sees no cgroup at all.
        "cgroup" | "cgroup2" => {
            only_options(index, mount, &["noexec", "ro"])?;
            notes.push(format!(
                "mounts[{index}]: {} is an empty read-only directory (no cgroup is shown)",
                target.display()
            ));
            Ok(Some(MountStep::Empty { target }))
        }
        "devpts" => Err(refuse(
            index,
            "devpts is mounted only at /dev/pts, by the runtime",
        )),
        other => Err(refuse(
            index,
            format!("mount type `{other}` is not supported yet"),
        )),
    }
}

fn only_options(index: usize, mount: &Mount, more: &[&str]) -> Result<(), Unsupported> {
    match mount
        .options
        .iter()
        .find(|o| !HARMLESS.contains(&o.as_str()) && !more.contains(&o.as_str()))
    {
        Some(option) => Err(refuse(index, format!("option `{option}` is not supported"))),
        None => Ok(()),
    }
}

fn bind_step(
    index: usize,
    mount: &Mount,
    target: std::path::PathBuf,
) -> Result<MountStep, Unsupported> {
    only_options(index, mount, &["bind", "rbind", "ro", "noexec"])?;
    let source = mount
        .source
        .as_deref()
        .ok_or_else(|| refuse(index, "a bind needs a source"))?;
    let source = crate::translate::absolute_path(source).map_err(|reason| refuse(index, reason))?;
    // podman's --read-only marks its own files (/etc/hosts, /etc/hostname,
    // /run/.containerenv) noexec: harmless on a read-only data file, and
    // said. Anywhere else it would change what the mount is: refused.
    let read_only = mount.options.iter().any(|o| o == "ro");
    if mount.options.iter().any(|o| o == "noexec") && !(read_only && source.is_file()) {
        return Err(refuse(
            index,
            "option `noexec` is not supported (but on a read-only bind of a file)",
        ));
    }
    if target == Path::new("/") {
        return Err(refuse(
            index,
            "a bind over `/` would replace the root filesystem",
        ));
    }
    let access = if mount.options.iter().any(|o| o == "ro") {
        Access::Ro
    } else {
        Access::Rw
    };
    Ok(MountStep::Bind {
        source,
        target,
        access,
        optional: false,
        // A socket as the source is refused at launch: connect(2) ignores a
        // read-only bind (a runtime's socket is host root). Sockets inside
        // a bound directory are noted (log, state).
        socket: SocketUse::Refuse,
    })
}

fn tmpfs_step(
    index: usize,
    mount: &Mount,
    target: std::path::PathBuf,
) -> Result<MountStep, Unsupported> {
    let mut mode = 0o1777;
    let mut size = None;
    for option in &mount.options {
        if let Some(octal) = option.strip_prefix("mode=") {
            mode = u32::from_str_radix(octal, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| refuse(index, format!("`{option}` is not an octal mode")))?;
        } else if let Some(bytes) = option.strip_prefix("size=") {
            size = Some(tmpfs_size(bytes).ok_or_else(|| {
                refuse(
                    index,
                    format!("`{option}`: a size in bytes, or with k, m or g"),
                )
            })?);
        } else if !HARMLESS.contains(&option.as_str()) {
            return Err(refuse(
                index,
                format!("tmpfs option `{option}` is not supported"),
            ));
        }
    }
    Ok(MountStep::Tmpfs { target, mode, size })
}

/// tmpfs's `size=`: bytes, or k, m, g (powers of 1024); not a percentage.
fn tmpfs_size(text: &str) -> Option<u64> {
    let (digits, unit) = match text.char_indices().last()? {
        (at, 'k' | 'K') => (&text[..at], 1u64 << 10),
        (at, 'm' | 'M') => (&text[..at], 1 << 20),
        (at, 'g' | 'G') => (&text[..at], 1 << 30),
        _ => (text, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(unit)
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tmpfs_sizes_are_bytes_or_binary_multiples() {
        let size = super::tmpfs_size;
        assert_eq!(size("65536k"), Some(64 << 20));
        assert_eq!(size("1m"), Some(1 << 20));
        assert_eq!(size("2G"), Some(2 << 30));
        assert_eq!(size("4096"), Some(4096));
        for bad in [
            "",
            "k",
            "50%",
            "0",
            "-1k",
            "1.5m",
            "1t",
            "99999999999999999999g",
        ] {
            assert_eq!(size(bad), None, "{bad}");
        }
    }
}
