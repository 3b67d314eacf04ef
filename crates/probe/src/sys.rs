//! Raw system calls the attacks need. The probe is hostile on purpose: each
//! function makes one call with arguments chosen to attempt an escape and
//! returns the raw result; nothing here is used outside the probe.

use std::ffi::CString;

fn result(ret: libc::c_long) -> Result<libc::c_long, nix::errno::Errno> {
    if ret < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(ret)
    }
}

pub type SysResult = Result<libc::c_long, nix::errno::Errno>;

/// A raw syscall with up to six integer arguments.
pub fn syscall6(nr: libc::c_long, a: [u64; 6]) -> SysResult {
    // The probe passes only integers, or pointers to buffers it owns
    // for the duration of the call (see the callers); the worst a wrong
    // argument does is fail or kill this probe process.
    // SAFETY: integers, or pointers to buffers the caller keeps alive; at worst the probe dies.
    let ret = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    result(ret)
}

/// The i386 `int 0x80` entry on x86_64 (getpid = 20 there). A filter built
/// for x86_64 only must kill the process.
#[cfg(target_arch = "x86_64")]
pub fn int80_getpid() -> i64 {
    let ret: i64;
    // Getpid takes no arguments and touches no memory; int 0x80 only
    // clobbers rax (the result) and the registers listed as preserved by the
    // i386 syscall ABI.
    // SAFETY: getpid takes no arguments and touches no memory; only rax is written.
    unsafe { std::arch::asm!("int 0x80", inlateout("rax") 20i64 => ret, options(nostack)) };
    ret
}

pub fn fork() -> nix::Result<nix::unistd::ForkResult> {
    // The probe is single-threaded; children only make raw
    // syscalls, exec, or _exit.
    // SAFETY: the probe is single-threaded; the child only makes syscalls, execs or exits.
    unsafe { nix::unistd::fork() }
}

pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(code) }
}

pub fn ptr<T>(value: &T) -> u64 {
    value as *const T as u64
}

pub fn cstring(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

pub fn pause() -> ! {
    loop {
        // SAFETY: pause only waits for a signal.
        unsafe { libc::pause() };
    }
}
