//! Unix sockets at paths of any length. `sun_path` holds 108 bytes, and an
//! engine's root for the runtime plus a 64-character container id passes
//! that with ordinary roots (issue 44): a socket is bound and reached as
//! `/proc/self/fd/N/NAME`, N a descriptor of its directory opened with
//! `O_PATH`, so only the name has to fit.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

/// Listens on a new socket at `path`.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    through_dir(path, |short| UnixListener::bind(short))
}

/// Connects to the socket at `path`.
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    through_dir(path, |short| UnixStream::connect(short))
}

fn through_dir<T>(path: &Path, act: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return act(path);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = open(
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    act(&short)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_socket_deeper_than_sun_path_is_bound_and_reached() {
        let base = tempfile::tempdir().expect("tempdir");
        // 64-character components, as containerd's ids: over 300 bytes.
        let mut dir = base.path().to_path_buf();
        for _ in 0..5 {
            dir.push("c".repeat(64));
        }
        std::fs::create_dir_all(&dir).expect("dirs");
        let path = dir.join("notify.sock");
        assert!(path.as_os_str().len() > 300);
        let plain = UnixListener::bind(&path);
        assert!(plain.is_err(), "a plain bind of a long path worked");
        let listener = bind(&path).expect("bind");
        assert!(path.exists(), "the socket is not where it was asked");
        let mut client = connect(&path).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(b"ready").expect("write");
        drop(client);
        let mut got = String::new();
        server.read_to_string(&mut got).expect("read");
        assert_eq!(got, "ready");
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_socket_elsewhere() {
        let base = tempfile::tempdir().expect("tempdir");
        let path = base.path().join("missing").join("x.sock");
        let err = bind(&path).expect_err("bound in a missing directory");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
