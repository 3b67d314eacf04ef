//! The raw system calls no safe wrapper offers. Every unsafe block of the
//! crate is here, each with its reasoning.

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of
/// creating a ruleset.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The Landlock ABI version of the running kernel, or the errno that says
/// why there is none (ENOSYS: not built in; EOPNOTSUPP: disabled at boot).
pub fn landlock_abi_version() -> Result<u32, nix::errno::Errno> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the
    // kernel reads no memory and creates no file descriptor; it only returns
    // the ABI number or -1 with errno. No restriction is applied.
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
