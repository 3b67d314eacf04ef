//! The daemon's state directory and database, each held by this daemon
//! alone for its life: the directory made private and locked, a SQLite
//! database locked beside it, the store opened seated as this daemon.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use super::{DaemonConfig, DaemonError, io};
use crate::store::{StateDatabase, Store};

/// The longest Unix socket path (sun_path holds 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// Creates the state directory with mode 0700 (and tightens an existing one).
/// With `sockets` (the agents' sockets live there), refuses one too deep
/// for their paths, which would otherwise fail only when an agent is made.
pub fn prepare_state_dir(dir: &Path, sockets: bool) -> Result<(), DaemonError> {
    if sockets {
        check_socket_room(dir)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir.join("agents"))
        .map_err(io(format!("create {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("chmod {}", dir.display())))
}

/// Refuses a directory (the state's or the runtime's) too deep for the
/// agents' socket paths, which would otherwise fail only when an agent is
/// made.
pub(super) fn check_socket_room(dir: &Path) -> Result<(), DaemonError> {
    let longest = dir
        .join("agents")
        .join(uuid::Uuid::nil().to_string())
        .join("broker.sock");
    let length = longest.as_os_str().len();
    if length > SUN_PATH_MAX {
        return Err(DaemonError::Io(
            format!("directory {}", dir.display()),
            std::io::Error::other(format!(
                "too long for Unix sockets: an agent's socket path would be {length} bytes, at most {SUN_PATH_MAX} fit; use a shorter --state-dir or --runtime-dir"
            )),
        ));
    }
    Ok(())
}

/// Locks the state directory for this daemon's life (the lock goes with
/// the process, however it ends). A second daemon on the same directory
/// would replace the first's control socket and run the same turns twice;
/// it is refused, naming the holder's pid (written into the lock file).
pub fn lock_state_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    lock_file(&dir.join("daemon.lock"), |holder| DaemonError::Locked {
        dir: dir.to_path_buf(),
        holder,
    })
}

/// Locks the runtime directory (`--runtime-dir`) the same way: one
/// daemon's sockets in it.
pub fn lock_runtime_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    lock_file(&dir.join("daemon.lock"), |holder| {
        DaemonError::RuntimeLocked {
            dir: dir.to_path_buf(),
            holder,
        }
    })
}

/// Locks a SQLite database named by `--state sqlite:PATH` the same way,
/// through `PATH.daemon.lock` (a lock on the database file itself would
/// be released with SQLite's own locks when either closes it). Two state
/// directories could otherwise name one database.
pub fn lock_sqlite_database(
    database: &Path,
) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    let mut name = database.as_os_str().to_owned();
    name.push(".daemon.lock");
    lock_file(Path::new(&name), |holder| DaemonError::DatabaseLocked {
        database: database.to_path_buf(),
        holder,
    })
}

fn lock_file(
    path: &Path,
    in_use: impl FnOnce(String) -> DaemonError,
) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Opened close-on-exec (std's default): the turns and upstream servers
    // the daemon starts must not keep the lock after it is gone.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        // A symlink planted at the lock's path is not followed (the pid
        // is written into the file).
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(format!("open {}", path.display())))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0)
                .and_then(|_| writeln!(*lock, "{}", std::process::id()))
                .map_err(io(format!("write {}", path.display())))?;
            Ok(lock)
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(path).unwrap_or_default();
            Err(in_use(match pid.trim() {
                "" => "pid not yet written".to_string(),
                pid => format!("pid {pid}"),
            }))
        }
        Err((_, errno)) => Err(DaemonError::Io(
            format!("lock {}", path.display()),
            std::io::Error::from(errno),
        )),
    }
}

/// Opens the state database, seated as this daemon: a SQLite file is
/// locked beside it (one daemon in all), a PostgreSQL one by a session
/// lock on this daemon's id (store::pg; other daemons share it). The
/// returned lock, if any, is held for the daemon's life.
pub(super) fn open_state(
    config: &DaemonConfig,
) -> Result<(Store, Option<nix::fcntl::Flock<std::fs::File>>), DaemonError> {
    let lock = match &config.state {
        StateDatabase::Sqlite(path) => Some(lock_sqlite_database(path)?),
        StateDatabase::Postgres(_) => None,
    };
    let id = crate::seat::daemon_id(&config.state_dir).map_err(io("read the daemon's id"))?;
    let mut store = Store::open_at(&config.state)?;
    store.take_seat(crate::seat::seat(id, config.lease));
    store.hold_daemon_lock()?;
    store.register_daemon(&crate::seat::daemon_name(&config.state_dir))?;
    store.declare_offer(&crate::store::Offer {
        max_agents: config.max_agents,
        shared_paths: config.shared_paths.clone(),
        state_dir: Some(config.state_dir.clone()),
        runtime_dir: config.runtime_dir.clone(),
    })?;
    Ok((store, lock))
}

/// Writes each inline role's policy to `roles/NAME.toml` (the directory
/// made anew, 0700; each file 0600, never through a link) and loads the
/// role from there, so its launches are given a policy file that is the
/// role (docs/roles.md). Done under the directory's lock: a second daemon
/// refused on it does not replace the first's files.
pub(super) fn write_inline_roles(config: &mut DaemonConfig) -> Result<(), DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = config.state_dir.join("roles");
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(DaemonError::Io(format!("remove {}", dir.display()), e));
        }
        _ => {}
    }
    if config.inline_roles.is_empty() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(io(format!("create {}", dir.display())))?;
    for (name, text) in &config.inline_roles {
        let path = dir.join(format!("{name}.toml"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io(format!("create {}", path.display())))?;
        file.write_all(text.as_bytes())
            .map_err(io(format!("write {}", path.display())))?;
        let loaded = substrat_policy::load_file(&path, &substrat_policy::LoadOptions::default())
            .map_err(|e| {
                DaemonError::Io(
                    format!("load role `{name}` from {}", path.display()),
                    std::io::Error::other(e.to_string()),
                )
            })?;
        config.roles.insert(name.clone(), loaded);
    }
    Ok(())
}
