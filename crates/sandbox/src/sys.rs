//! The raw system calls no safe wrapper offers. Every unsafe block of the
//! crate is here, each with its reasoning.

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of
/// creating a ruleset.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The Landlock ABI version of the running kernel, or the errno that says
/// why there is none (ENOSYS: not built in; EOPNOTSUPP: disabled at boot).
pub fn landlock_abi_version() -> Result<u32, nix::errno::Errno> {
    // With a null attribute pointer, size 0 and the VERSION flag the
    // kernel reads no memory and creates no file descriptor; it only returns
    // the ABI number or -1 with errno. No restriction is applied.
    // SAFETY: no pointer is dereferenced and nothing is created (null attr, size 0).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        u32::try_from(ret).map_err(|_| nix::errno::Errno::EINVAL)
    }
}

/// Forks the calling process. Only the launcher calls this, and only while
/// it has a single thread (checked by the caller with `thread_count`).
pub fn fork() -> nix::Result<nix::unistd::ForkResult> {
    // The launcher is single-threaded when it forks (callers check
    // `thread_count() == 1` first), so no lock or allocator state can be
    // held by another thread in the child; the child only runs our setup
    // code and then execs or exits.
    // SAFETY: single-threaded caller (checked); the child only runs setup, execs or exits.
    unsafe { nix::unistd::fork() }
}

/// The number of threads of this process: the entries of /proc/self/task
/// (cheaper than /proc/self/status, which the kernel fills with memory
/// statistics; this runs on every launch).
pub fn thread_count() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    // An entry that cannot be read makes the count unknown, not smaller.
    tasks.collect::<Result<Vec<_>, _>>().ok().map(|t| t.len())
}

/// Closes every descriptor above 2 a program inherited: for its `main`,
/// before it opens anything (nothing of this program owns one yet; std
/// opens none above 2 at start), so that what it starts inherits none of
/// its parent's either (`substrat-oci`'s launchers); but `keep`, the
/// descriptors passed on purpose.
pub fn close_inherited_fds(keep: &[i32]) -> Result<(), nix::errno::Errno> {
    close_fds_except(keep)
}

/// Closes every file descriptor above 2 except `keep`, so what runs next
/// inherits only stdin, stdout, stderr (and `keep`). close_range first;
/// where it is refused (an old kernel, a seccomp profile without it) each
/// descriptor listed in /proc/self/fd is closed. An error means some may be
/// left open: the caller must not go on to run the command.
pub fn close_fds_except(keep: &[i32]) -> Result<(), nix::errno::Errno> {
    let mut kept: Vec<u32> = keep
        .iter()
        .filter_map(|&k| u32::try_from(k).ok())
        .filter(|&k| k > 2)
        .collect();
    kept.sort_unstable();
    kept.dedup();
    // The ranges between the kept ones: 3..first-1, first+1..second-1, ...
    let mut ranges = Vec::new();
    let mut next = 3u32;
    for &k in &kept {
        if k > next {
            ranges.push((next, k - 1));
        }
        next = k.saturating_add(1);
    }
    ranges.push((next, u32::MAX));
    let closed_by_range = ranges
        .into_iter()
        .filter(|(first, last)| first <= last)
        .all(|(first, last)| {
            // Close_range takes plain integers and only closes descriptors;
            // no memory is passed. Descriptors owned by Rust objects in this
            // process are never used again: the caller execs right after
            // (or, at a program's start, no Rust object owns one yet).
            // SAFETY: integers only; the caller execs next or owns none, so no closed fd is used again.
            unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) == 0 }
        });
    if closed_by_range {
        return Ok(());
    }
    let errno =
        |e: std::io::Error| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    // An entry that cannot be read fails the whole call: an unlisted
    // descriptor would stay open.
    let listed = std::fs::read_dir("/proc/self/fd")
        .map_err(errno)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(errno)?;
    let numbers = listed
        .iter()
        .filter_map(|name| name.to_str()?.parse::<i32>().ok());
    for fd in numbers.filter(|&fd| fd > 2 && !keep.contains(&fd)) {
        // The listing's own descriptor is already closed (EBADF, harmless);
        // as above, nothing in this process uses a closed one again.
        // SAFETY: closes a number from our own fd table that nothing uses again.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// The signal state a command gets from std's `Command`: SIGPIPE at its
/// default action, no signal blocked. Rust's runtime ignores SIGPIPE in
/// this program and an ignored signal stays ignored across exec (`yes |
/// head -1` would end with "Broken pipe" errors instead of quietly); and
/// the two backends reach the command with different masks (bwrap is
/// started by `Command`, the native init keeps the launcher's). With a
/// terminal of its own (`terminal`), SIGINT and SIGQUIT too: its keys must
/// reach the command's foreground job even when the launcher was started
/// with them ignored (in the background of a script, under `setsid`).
pub fn default_signals(terminal: bool) -> Result<(), nix::errno::Errno> {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
    let keys: &[Signal] = if terminal {
        &[Signal::SIGPIPE, Signal::SIGINT, Signal::SIGQUIT]
    } else {
        &[Signal::SIGPIPE]
    };
    for &sig in keys {
        // SAFETY: SIG_DFL installs no handler, so no code of ours can run in a signal context.
        unsafe { signal(sig, SigHandler::SigDfl) }?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

/// SIGPIPE back at its default action in this process, which Rust's
/// runtime ignores: a command whose reader went away (`... | head -c1`)
/// then ends at its next write, killed by the signal as C tools are,
/// instead of failing the write (`println!` panics on it).
pub fn pipe_signal_default() -> Result<(), nix::errno::Errno> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_DFL installs no handler, so no code of ours can run in a signal context.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }.map(drop)
}

/// Exits the process at once, without running Rust destructors or atexit
/// handlers (a forked child must not flush the parent's buffers twice).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit only ends the process; it is always sound to call.
    unsafe { libc::_exit(code) }
}

/// Installs a classic BPF seccomp program (as exported by libseccomp) on the
/// calling thread. no_new_privs must already be set.
/// linux/seccomp.h (libc has no constant for it).
const SECCOMP_FILTER_FLAG_SPEC_ALLOW: u32 = 1 << 2;

/// Loads one filter; `spec_allow` leaves the CPU's speculation setting
/// as it is (SECCOMP_FILTER_FLAG_SPEC_ALLOW) instead of turning the
/// Speculative Store Bypass mitigation on.
pub fn load_seccomp_program(program: &[u8], spec_allow: bool) -> Result<(), nix::errno::Errno> {
    // struct sock_filter is 8 bytes: u16 code, u8 jt, u8 jf, u32 k.
    if program.is_empty() || !program.len().is_multiple_of(8) {
        return Err(nix::errno::Errno::EINVAL);
    }
    let filters: Vec<libc::sock_filter> = program
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let len = u16::try_from(filters.len()).map_err(|_| nix::errno::Errno::E2BIG)?;
    let fprog = libc::sock_fprog {
        len,
        filter: filters.as_ptr() as *mut libc::sock_filter,
    };
    // `fprog` points at `filters`, a live, correctly sized array of
    // sock_filter for the duration of the call; the kernel copies the
    // program and keeps no pointer to our memory.
    // SAFETY: `fprog` points into `filters`, alive and correctly sized for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            if spec_allow {
                SECCOMP_FILTER_FLAG_SPEC_ALLOW
            } else {
                0u32
            },
            &fprog as *const libc::sock_fprog,
        )
    };
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

/// Fails with the thread count unless this process has exactly one thread.
pub fn require_single_thread() -> Result<(), usize> {
    match thread_count() {
        Some(1) => Ok(()),
        other => Err(other.unwrap_or(0)),
    }
}

/// Takes ownership of a descriptor number inherited from the launcher
/// (the bwrap backend's helper gets its status pipe this way).
pub fn inherited_fd(fd: i32) -> Result<std::os::fd::OwnedFd, nix::errno::Errno> {
    use std::os::fd::FromRawFd;
    // Refuse numbers that are not open descriptors before owning one.
    nix::fcntl::fcntl(
        // Borrowing for this one fcntl call; F_GETFD on a closed
        // number only fails with EBADF.
        // SAFETY: borrowed for one F_GETFD, which only fails with EBADF on a closed number.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )?;
    if fd <= 2 {
        return Err(nix::errno::Errno::EBADF);
    }
    // The descriptor is open (checked above), above the standard
    // three, and nothing else in this process owns it: the launcher passed
    // its number for this helper alone.
    // SAFETY: the fd is open, above 2, and owned by nothing else in this process.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Brings the loopback interface of the current network namespace up (a new
/// namespace starts with `lo` down). Needs CAP_NET_ADMIN in the namespace:
/// init calls it before dropping capabilities.
pub fn loopback_up() -> nix::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain socket(2); the result is checked and owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SIOCGIFFLAGS reads the name and writes the flags of `request`.
    // SAFETY: `request` is a valid, exclusively borrowed ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the one set.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads `request`, valid as above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

/// Makes this process opaque to the sandbox it serves (the native init,
/// the proxy bridges): not dumpable, so its /proc/N/{mem,environ,fd,maps}
/// need ptrace access nothing inside has; and its command line and
/// environment blanked in memory, since /proc/N/cmdline stays readable to
/// every process and showed the launcher's arguments (the environment is
/// blanked too, in case a later change leaves the process dumpable).
/// Nothing in the caller may read its arguments or environment afterwards.
pub fn conceal_process() -> Result<(), nix::errno::Errno> {
    nix::sys::prctl::set_dumpable(false)?;
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|_| nix::errno::Errno::EIO)?;
    // Fields after the command name (which may hold spaces and parentheses):
    // the first is field 3 (state); arg_start..env_end are fields 48-51.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .ok_or(nix::errno::Errno::EIO)?
        .1
        .split_whitespace()
        .collect();
    let field = |n: usize| -> Result<usize, nix::errno::Errno> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or(nix::errno::Errno::EIO)
    };
    for (start, end) in [(field(48)?, field(49)?), (field(50)?, field(51)?)] {
        if start == 0 || end <= start {
            continue;
        }
        // [start, end) is this process's own argument (or environment) area
        // on the stack the kernel mapped at exec: mapped and writable for
        // the process's whole life. The caller reads neither its arguments
        // nor its environment again (std and libc keep pointers into it,
        // which then see empty strings), and no other thread exists (the
        // callers are freshly forked, single-threaded processes).
        // SAFETY: our own mapped, writable exec-time stack area; nothing reads it afterwards.
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
    }
    Ok(())
}

/// Sets `attr` (MOUNT_ATTR_* bits: read-only, nosuid, nodev) on the mount
/// at `path` and on every mount below it (mount_setattr with AT_RECURSIVE,
/// Linux 5.12): a plain remount changes only the top mount, and a
/// filesystem mounted below a bind source would stay writable. Adding
/// these flags is allowed on mounts the user namespace inherited locked.
pub fn set_mount_attr_recursive(path: &std::path::Path, attr: u64) -> nix::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| nix::errno::Errno::EINVAL)?;
    let attr = libc::mount_attr {
        attr_set: attr,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    mount_setattr(
        libc::AT_FDCWD,
        &path,
        libc::AT_RECURSIVE as libc::c_uint,
        &attr,
    )
}

/// mount_setattr(2) on `path` relative to `dirfd`, with `flags`.
fn mount_setattr(
    dirfd: i32,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
    attr: &libc::mount_attr,
) -> nix::Result<()> {
    // `path` is a NUL-terminated string and `attr` a mount_attr, both alive
    // for the call, with the size of the struct passed; the kernel only
    // reads them.
    // SAFETY: valid pointers to live, correctly sized values for the call's duration.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

/// Sets the extended attribute `name` (a `user.` one) to `value` on the
/// file or directory open at `fd`.
pub fn set_xattr(
    fd: &impl std::os::fd::AsRawFd,
    name: &std::ffi::CStr,
    value: &[u8],
) -> nix::Result<()> {
    // `name` is NUL-terminated, `value` a live slice whose length is passed;
    // the kernel only reads both.
    // SAFETY: valid pointers and lengths for the call's duration; read only.
    let ret = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

/// Whether the file or directory open at `fd` has the attribute `name`.
pub fn has_xattr(fd: &impl std::os::fd::AsRawFd, name: &std::ffi::CStr) -> bool {
    // With a null buffer and size 0 the kernel only returns the value's
    // size (or -1 with ENODATA): no memory of ours is written.
    // SAFETY: null buffer with size 0: nothing is written.
    let ret = unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) };
    ret >= 0
}

/// The value of the attribute `name` of the file or directory open at
/// `fd`, read into `buf`: its length, or None when it is absent or longer.
pub fn xattr_value(
    fd: &impl std::os::fd::AsRawFd,
    name: &std::ffi::CStr,
    buf: &mut [u8],
) -> Option<usize> {
    // SAFETY: `name` is NUL-terminated; the kernel writes at most
    // `buf.len()` bytes into `buf`, a live exclusive slice.
    let ret = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(ret).ok()
}

/// A detached copy of the mount tree at `fd` (the mount holding it and
/// every mount below; open_tree with OPEN_TREE_CLONE and AT_RECURSIVE,
/// Linux 5.2): it belongs to no namespace until `attach_tree` places it.
pub fn clone_tree(fd: &impl std::os::fd::AsRawFd) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_EMPTY_PATH as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint;
    // An empty NUL-terminated path with AT_EMPTY_PATH: the kernel reads the
    // string and acts on `fd`; it writes no memory of ours.
    // SAFETY: a valid, live C string; no memory of ours is written.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    if ret < 0 {
        return Err(nix::errno::Errno::last());
    }
    let raw = i32::try_from(ret).map_err(|_| nix::errno::Errno::EBADF)?;
    // The kernel returned a new descriptor that nothing else owns.
    // SAFETY: `raw` is a fresh descriptor owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// Makes the detached tree at `tree`, and every mount in it, show its
/// files' owners through the id maps of the user namespace `userns`
/// (MOUNT_ATTR_IDMAP, Linux 5.12; only on a tree not yet attached), and
/// sets the MOUNT_ATTR_* bits in `attr` on them in the same call.
pub fn idmap_tree(
    tree: &impl std::os::fd::AsRawFd,
    userns: &impl std::os::fd::AsRawFd,
    attr: u64,
) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP | attr,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
    mount_setattr(tree.as_raw_fd(), c"", flags, &attr)
}

/// Sets `attr` on every mount of the detached tree at `tree`, no idmap.
pub fn set_tree_attr(tree: &impl std::os::fd::AsRawFd, attr: u64) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: attr,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
    mount_setattr(tree.as_raw_fd(), c"", flags, &attr)
}

/// Attaches the detached tree at `tree` on `target` (move_mount, Linux 5.2).
pub fn attach_tree(tree: &impl std::os::fd::AsRawFd, target: &std::path::Path) -> nix::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| nix::errno::Errno::EINVAL)?;
    // Two NUL-terminated strings alive for the call; the kernel reads them.
    // SAFETY: valid, live C strings; no memory of ours is written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

/// `*_STAT_ANY` (Linux 4.17): an IPC object's state by its index, with no
/// permission check; `*_INFO`: the highest index in use.
const SHM_INFO: libc::c_int = 14;
const SHM_STAT_ANY: libc::c_int = 15;
const MSG_STAT_ANY: libc::c_int = 13;
const SEM_STAT_ANY: libc::c_int = 20;

/// Removes every System V IPC object (shared memory segment, message
/// queue, semaphore set) of the caller's ipc namespace that it owns; the
/// number removed. Found by index with `*_STAT_ANY`, so no /proc is
/// needed (a Landlocked turn server reads none).
pub fn remove_sysv_ipc() -> usize {
    let mut removed = 0;
    // SAFETY: each call writes at most one struct of the buffer's type, or
    // a *_INFO call a shm_info, msginfo or seminfo (each smaller than the
    // shmid_ds, msqid_ds or semid_ds buffer given), into a zeroed buffer
    // alive for the call; IPC_RMID reads and writes nothing of ours.
    unsafe {
        let mut shm: libc::shmid_ds = std::mem::zeroed();
        let highest = libc::shmctl(0, SHM_INFO, &mut shm);
        for index in 0..=highest {
            let id = libc::shmctl(index, SHM_STAT_ANY, &mut shm);
            if id >= 0 && libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) == 0 {
                removed += 1;
            }
        }
        let mut msg: libc::msqid_ds = std::mem::zeroed();
        let highest = libc::msgctl(0, libc::MSG_INFO, &mut msg);
        for index in 0..=highest {
            let id = libc::msgctl(index, MSG_STAT_ANY, &mut msg);
            if id >= 0 && libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) == 0 {
                removed += 1;
            }
        }
        let mut sem: libc::semid_ds = std::mem::zeroed();
        let sem_ptr: *mut libc::semid_ds = &mut sem;
        let highest = libc::semctl(0, 0, libc::SEM_INFO, sem_ptr);
        for index in 0..=highest {
            let id = libc::semctl(index, 0, SEM_STAT_ANY, sem_ptr);
            if id >= 0 && libc::semctl(id, 0, libc::IPC_RMID) == 0 {
                removed += 1;
            }
        }
    }
    removed
}

/// The caller's ipc namespace's mqueue filesystem, mounted nowhere
/// (fsopen, fsconfig, fsmount: Linux 5.2) and opened for reading: a
/// turn server lists the POSIX message queues through it after Landlock
/// (the directory is open already, and mq_unlink is not a path access).
/// Needs CAP_SYS_ADMIN over the namespaces.
pub fn open_detached_mqueue() -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let owned = |ret: libc::c_long| -> nix::Result<OwnedFd> {
        if ret < 0 {
            return Err(nix::errno::Errno::last());
        }
        let raw = i32::try_from(ret).map_err(|_| nix::errno::Errno::EBADF)?;
        // SAFETY: the kernel returned a new descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: a valid, live C string; the kernel only reads it.
    let raw = unsafe { libc::syscall(libc::SYS_fsopen, c"mqueue".as_ptr(), FSOPEN_CLOEXEC) };
    let context = owned(raw)?;
    // SAFETY: no key, value or buffer: the kernel reads no memory of ours.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: plain integers only.
    let mount = owned(unsafe {
        libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, 0)
    })?;
    nix::fcntl::openat(
        &mount,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
}

/// Removes the POSIX message queue `name` (without its leading `/`) of the
/// caller's ipc namespace.
pub fn mq_unlink(name: &std::ffi::CStr) -> nix::Result<()> {
    let mut path = b"/".to_vec();
    path.extend_from_slice(name.to_bytes_with_nul());
    let path = std::ffi::CStr::from_bytes_with_nul(&path).map_err(|_| nix::errno::Errno::EINVAL)?;
    // SAFETY: a valid, live C string; the kernel only reads it.
    if unsafe { libc::mq_unlink(path.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(nix::errno::Errno::last())
    }
}
