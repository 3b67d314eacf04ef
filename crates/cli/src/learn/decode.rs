//! One notification to what it means: which call, which path (read from
//! the caller's memory through /proc/PID/mem, resolved against its working
//! directory or the directory its dirfd names) or which destination. The
//! caller may change its memory between the kernel's read and ours: what
//! is recorded is a claim, checked later by `check` and the replay.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use libseccomp::ScmpSyscall;
use substrat_policy::learn::parse::{self, Destination, PATH_MAX, SOCKADDR_MAX};
use substrat_policy::learn::{AccessKind, Observations};

/// The calls the observing filter notifies: every call that names a path
/// to open, execute, look at or change, and `connect`.
pub const NOTIFIED_CALLS: [&str; 23] = [
    "open",
    "openat",
    "openat2",
    "creat",
    "execve",
    "execveat",
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "mkdir",
    "mkdirat",
    "unlink",
    "unlinkat",
    "rmdir",
    "truncate",
    "chdir",
    "connect",
];

/// Where a call's arguments are.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// dirfd argument (none: the working directory), path argument, and
    /// how the kind is decided.
    Path(Option<usize>, usize, Kind),
    Connect,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// From open flags in this argument.
    Flags(usize),
    /// From `struct open_how` pointed to by this argument (openat2).
    How(usize),
    Fixed(AccessKind),
}

fn layout(name: &str) -> Option<Layout> {
    use AccessKind::*;
    use Kind::*;
    let l = match name {
        "open" => Layout::Path(None, 0, Flags(1)),
        "openat" => Layout::Path(Some(0), 1, Flags(2)),
        "openat2" => Layout::Path(Some(0), 1, How(2)),
        "creat" | "mkdir" | "unlink" | "rmdir" | "truncate" => Layout::Path(None, 0, Fixed(Write)),
        "mkdirat" | "unlinkat" => Layout::Path(Some(0), 1, Fixed(Write)),
        "execve" => Layout::Path(None, 0, Fixed(Exec)),
        "execveat" => Layout::Path(Some(0), 1, Fixed(Exec)),
        "stat" | "lstat" | "access" | "readlink" => Layout::Path(None, 0, Fixed(Look)),
        "chdir" => Layout::Path(None, 0, Fixed(List)),
        "newfstatat" | "statx" | "faccessat" | "faccessat2" | "readlinkat" => {
            Layout::Path(Some(0), 1, Fixed(Look))
        }
        "connect" => Layout::Connect,
        _ => return None,
    };
    Some(l)
}

/// The notified calls by number.
#[derive(Debug)]
pub struct Table(Vec<(ScmpSyscall, Layout)>);

impl Table {
    pub fn new() -> Self {
        Table(
            NOTIFIED_CALLS
                .iter()
                .filter_map(|n| Some((ScmpSyscall::from_name(n).ok()?, layout(n)?)))
                .collect(),
        )
    }

    fn layout(&self, call: ScmpSyscall) -> Option<Layout> {
        self.0.iter().find(|(c, _)| *c == call).map(|(_, l)| *l)
    }
}

const O_ACCMODE: u64 = 0o3;
const O_CREAT: u64 = 0o100;
const O_TRUNC: u64 = 0o1000;
const O_DIRECTORY: u64 = 0o200000;
const O_PATH: u64 = 0o10000000;
const AT_FDCWD: i32 = -100;

fn kind_of_flags(flags: u64) -> AccessKind {
    if flags & O_ACCMODE != 0 || flags & (O_CREAT | O_TRUNC) != 0 {
        AccessKind::Write
    } else if flags & O_DIRECTORY != 0 {
        AccessKind::List
    } else if flags & O_PATH != 0 {
        AccessKind::Look
    } else {
        AccessKind::Read
    }
}

/// Up to `max` bytes of process `pid`'s memory at `addr`, read page by
/// page until a NUL (for strings) or `max`.
fn read_memory(mem: &File, addr: u64, max: usize, until_nul: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        let page_left = 4096 - (at % 4096) as usize;
        let mut chunk = vec![0u8; page_left.min(max - out.len())];
        let Ok(n) = mem.read_at(&mut chunk, at) else {
            break;
        };
        if n == 0 {
            break;
        }
        chunk.truncate(n);
        let done = until_nul && chunk.contains(&0);
        out.extend_from_slice(&chunk);
        at += n as u64;
        if done {
            break;
        }
    }
    out
}

/// The directory a relative path of `pid` starts from.
fn base_dir(pid: u32, dirfd: Option<u64>) -> Option<PathBuf> {
    let link = match dirfd.map(|d| d as i32) {
        None | Some(AT_FDCWD) => format!("/proc/{pid}/cwd"),
        Some(fd) => format!("/proc/{pid}/fd/{fd}"),
    };
    std::fs::read_link(link).ok()
}

/// What one notified call named.
#[derive(Debug)]
pub enum Event {
    Path(PathBuf, AccessKind),
    Destination(Destination),
    /// The caller's memory or directories could not be read.
    Unreadable,
}

impl Event {
    pub fn record(self, seen: &mut Observations) {
        match self {
            Event::Path(path, kind) => seen.record_path(path, kind),
            Event::Destination(d) => seen.record_destination(d),
            Event::Unreadable => seen.dropped += 1,
        }
    }
}

/// What one notified call of `pid` with `args` names, if anything.
pub fn decode(table: &Table, call: ScmpSyscall, pid: u32, args: &[u64; 6]) -> Option<Event> {
    let layout = table.layout(call)?;
    let Ok(mem) = File::open(format!("/proc/{pid}/mem")) else {
        return Some(Event::Unreadable);
    };
    match layout {
        Layout::Connect => {
            let len = (args[2] as usize).min(SOCKADDR_MAX);
            let bytes = read_memory(&mem, args[1], len, false);
            match parse::sockaddr(&bytes) {
                Ok(Destination::Unix(name)) if name.is_empty() => None,
                Ok(d) => Some(Event::Destination(d)),
                Err(_) => Some(Event::Unreadable),
            }
        }
        Layout::Path(dirfd, path_arg, kind) => {
            let bytes = read_memory(&mem, args[path_arg], PATH_MAX, true);
            // An empty path (AT_EMPTY_PATH: the call is on the fd) names none.
            let path = parse::c_path(&bytes).ok()?;
            let kind = match kind {
                Kind::Fixed(k) => k,
                Kind::Flags(i) => kind_of_flags(args[i]),
                Kind::How(i) => {
                    let how = read_memory(&mem, args[i], 8, false);
                    let flags = how
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes);
                    kind_of_flags(flags.unwrap_or(0))
                }
            };
            let absolute = if path.is_absolute() {
                parse::absolute(Path::new("/"), &path)
            } else {
                match base_dir(pid, dirfd.map(|i| args[i])) {
                    Some(base) if base.is_absolute() => parse::absolute(&base, &path),
                    _ => return Some(Event::Unreadable),
                }
            };
            Some(Event::Path(absolute, kind))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_notified_call_has_a_layout_and_flags_read_as_the_kernel_means_them() {
        for name in NOTIFIED_CALLS {
            assert!(layout(name).is_some(), "{name}");
        }
        assert_eq!(kind_of_flags(0), AccessKind::Read);
        assert_eq!(kind_of_flags(0o1), AccessKind::Write);
        assert_eq!(kind_of_flags(0o2), AccessKind::Write);
        assert_eq!(kind_of_flags(O_CREAT), AccessKind::Write);
        assert_eq!(kind_of_flags(O_TRUNC), AccessKind::Write);
        assert_eq!(kind_of_flags(O_DIRECTORY), AccessKind::List);
        assert_eq!(kind_of_flags(O_PATH), AccessKind::Look);
        assert_eq!(kind_of_flags(O_PATH | O_DIRECTORY), AccessKind::List);
    }
}
