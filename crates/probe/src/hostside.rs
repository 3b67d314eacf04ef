//! Attacks on the host through what the command leaves behind (set-id
//! files) and through the processes it can see but did not start (the
//! sandbox's own helpers), and reads of the mount flags it runs under.

use std::fs;

use nix::errno::Errno;

use crate::sys::{SysResult, cstring, ptr, syscall6};

const SETID: u64 = 0o4000 | 0o2000;

fn errno_name(result: SysResult) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("{e:?}"),
    }
}

/// Every way of giving a file a set-id mode, each on a fresh name in the
/// current directory: `value:<call>=<outcome>,...`. The file each chmod-like
/// call works on exists first (created 0755), so a refusal is the filter's.
pub fn set_id_modes(bit: u64) -> String {
    let mut results = Vec::new();
    let at_fdcwd = libc::AT_FDCWD as u64;
    let mode = 0o755 | bit;
    let fresh = |name: &str| {
        let _ = fs::remove_file(name);
        let file = cstring(name);
        let fd = syscall6(
            libc::SYS_open,
            [
                file.as_ptr() as u64,
                (libc::O_CREAT | libc::O_WRONLY) as u64,
                0o755,
                0,
                0,
                0,
            ],
        );
        if let Ok(fd) = fd {
            let _ = syscall6(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
        }
        file
    };
    let path = fresh("setid-chmod");
    results.push((
        "chmod",
        syscall6(libc::SYS_chmod, [path.as_ptr() as u64, mode, 0, 0, 0, 0]),
    ));
    let path = fresh("setid-fchmod");
    let fd = syscall6(
        libc::SYS_open,
        [path.as_ptr() as u64, libc::O_RDONLY as u64, 0, 0, 0, 0],
    );
    let fchmod = match fd {
        Ok(fd) => syscall6(libc::SYS_fchmod, [fd as u64, mode, 0, 0, 0, 0]),
        Err(e) => Err(e),
    };
    results.push(("fchmod", fchmod));
    let path = fresh("setid-fchmodat");
    let at = [at_fdcwd, path.as_ptr() as u64, mode, 0, 0, 0];
    results.push(("fchmodat", syscall6(libc::SYS_fchmodat, at)));
    let path = fresh("setid-fchmodat2");
    results.push(("fchmodat2", syscall6(452, at_with(at, &path))));
    let created = |name: &str| {
        let _ = fs::remove_file(name);
        cstring(name)
    };
    let creat_flags = (libc::O_CREAT | libc::O_WRONLY) as u64;
    let path = created("setid-open");
    results.push((
        "open",
        syscall6(
            libc::SYS_open,
            [path.as_ptr() as u64, creat_flags, mode, 0, 0, 0],
        ),
    ));
    let path = created("setid-openat");
    results.push((
        "openat",
        syscall6(
            libc::SYS_openat,
            [at_fdcwd, path.as_ptr() as u64, creat_flags, mode, 0, 0],
        ),
    ));
    let path = created("setid-creat");
    results.push((
        "creat",
        syscall6(libc::SYS_creat, [path.as_ptr() as u64, mode, 0, 0, 0, 0]),
    ));
    let regular = libc::S_IFREG as u64;
    let path = created("setid-mknod");
    results.push((
        "mknod",
        syscall6(
            libc::SYS_mknod,
            [path.as_ptr() as u64, regular | mode, 0, 0, 0, 0],
        ),
    ));
    let path = created("setid-mknodat");
    results.push((
        "mknodat",
        syscall6(
            libc::SYS_mknodat,
            [at_fdcwd, path.as_ptr() as u64, regular | mode, 0, 0, 0],
        ),
    ));
    // struct open_how { u64 flags; u64 mode; u64 resolve; }
    let path = created("setid-openat2");
    let how: [u64; 3] = [creat_flags, mode, 0];
    results.push((
        "openat2",
        syscall6(
            libc::SYS_openat2,
            [at_fdcwd, path.as_ptr() as u64, ptr(&how), 24, 0, 0],
        ),
    ));
    let list: Vec<String> = results
        .into_iter()
        .map(|(call, result)| format!("{call}={}", errno_name(result)))
        .collect();
    format!("value:{}", list.join(","))
}

fn at_with(mut args: [u64; 6], path: &std::ffi::CString) -> [u64; 6] {
    args[1] = path.as_ptr() as u64;
    args
}

/// The set-id files under `dir` (recursively, not following links):
/// `value:none` or `value:<path>:<mode>,...`.
pub fn set_id_files(dir: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from(dir)];
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if u64::from(meta.mode()) & SETID != 0 {
            found.push(format!("{}:{:o}", path.display(), meta.mode()));
        }
        if meta.is_dir() {
            for entry in fs::read_dir(&path).into_iter().flatten().flatten() {
                stack.push(entry.path());
            }
        }
    }
    if found.is_empty() {
        "value:none".into()
    } else {
        found.sort();
        format!("value:{}", found.join(","))
    }
}

/// TIOCSETD (set the line discipline) on stdin, asking for N_TTY.
pub fn tiocsetd() -> String {
    let n_tty: libc::c_int = 0;
    match syscall6(libc::SYS_ioctl, [0, libc::TIOCSETD, ptr(&n_tty), 0, 0, 0]) {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno:{e:?}"),
    }
}

/// The mount flags of `path` that matter to the host: `value:ro|rw,nosuid?,nodev?`.
pub fn mount_flags(path: &str) -> String {
    use nix::sys::statvfs::{FsFlags, statvfs};
    match statvfs(path) {
        Ok(st) => {
            let flags = st.flags();
            let mut out = vec![if flags.contains(FsFlags::ST_RDONLY) {
                "ro"
            } else {
                "rw"
            }];
            if flags.contains(FsFlags::ST_NOSUID) {
                out.push("nosuid");
            }
            if flags.contains(FsFlags::ST_NODEV) {
                out.push("nodev");
            }
            format!("value:{}", out.join(","))
        }
        Err(e) => format!("errno:{e:?}"),
    }
}

/// What this process can learn from or do to every other process it sees:
/// whether its command line or environment shows one of `needles` (given
/// reversed, so this probe's own command line does not hold them), whether
/// its environment is readable, whether its memory opens for writing.
/// `value:<n>:<summary>|<summary>...` (n processes, summaries deduplicated).
pub fn peers(reversed_needles: &[String]) -> String {
    let needles: Vec<String> = reversed_needles
        .iter()
        .map(|n| n.chars().rev().collect())
        .collect();
    let shows = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        needles.iter().any(|n| text.contains(n.as_str()))
    };
    let me = std::process::id();
    let mut summaries = std::collections::BTreeSet::new();
    let mut count = 0;
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue; // gone already
        };
        count += 1;
        let cmdline = if shows(&cmdline) { "leaks" } else { "clean" };
        let environ = match fs::read(format!("/proc/{pid}/environ")) {
            Ok(env) if shows(&env) => "leaks".to_string(),
            Ok(_) => "readable".to_string(),
            Err(e) => io_errno(e),
        };
        let mem = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
        {
            Ok(_) => "writable".to_string(),
            Err(e) => io_errno(e),
        };
        summaries.insert(format!("cmdline={cmdline} environ={environ} mem={mem}"));
    }
    let list: Vec<String> = summaries.into_iter().collect();
    format!("value:{count}:{}", list.join("|"))
}

fn io_errno(e: std::io::Error) -> String {
    format!("{:?}", Errno::from_raw(e.raw_os_error().unwrap_or(0)))
}

/// Dispatches the probes of this module; `None` for another module's name.
pub fn run(args: &[String]) -> Option<String> {
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    Some(match a(0) {
        "set-id-modes" => set_id_modes(match a(1) {
            "gid" => 0o2000,
            "none" => 0,
            _ => 0o4000,
        }),
        "set-id-files" => set_id_files(a(1)),
        "tiocsetd" => tiocsetd(),
        "mount-flags" => mount_flags(a(1)),
        "peers" => peers(&args[1..]),
        _ => return None,
    })
}
