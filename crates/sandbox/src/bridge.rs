//! The bridges inside a sandbox with a loopback of its own: 127.0.0.1:PORT
//! to a Unix socket bound in by the launcher (the proxy's, the model
//! gateway's, the agent's broker socket: `plan::bridges`). Each runs as a
//! child of the sandbox's init (or of the bwrap helper) after every
//! restriction is in place, so it is as confined as the command; the
//! listening socket is made before the command starts, so the port is the
//! bridge's.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::plan::BridgePlan;

/// The loopback listener, made while binding is still allowed.
pub(crate) fn listen(plan: &BridgePlan) -> Result<TcpListener, crate::inside::SetupError> {
    TcpListener::bind(("127.0.0.1", plan.port)).map_err(|source| {
        crate::inside::SetupError::Bridge {
            port: plan.port,
            source,
        }
    })
}

/// Serves connections until the sandbox ends; never returns.
/// `tied_to_parent`: die with the parent (native: init); under bwrap the
/// bridge is reparented to bwrap's pid 1 and ends with the pid namespace
/// (`network = "proxy"` requires one).
pub(crate) fn run(listener: TcpListener, socket: PathBuf, tied_to_parent: bool) -> ! {
    if tied_to_parent {
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    }
    // A process the command can see but did not start: it is forked from a
    // process already hidden from the sandbox (native init; the bwrap
    // helper hides itself before the fork), so its memory, environment and
    // descriptors are out of the command's reach from its start.
    for stream in listener.incoming().flatten() {
        let socket = socket.clone();
        std::thread::spawn(move || relay(stream, &socket));
    }
    crate::sys::exit_now(0)
}

fn relay(tcp: TcpStream, socket: &Path) {
    let Ok(unix) = UnixStream::connect(socket) else {
        let mut tcp = tcp;
        let _ = tcp.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 30\r\nConnection: close\r\n\r\nsubstrat bridge: unreachable\r\n",
        );
        return;
    };
    let (Ok(tcp_read), Ok(unix_read)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let upstream =
        std::thread::spawn(move || copy(tcp_read, unix, |s| s.shutdown(Shutdown::Write)));
    copy(unix_read, tcp, |s| s.shutdown(Shutdown::Write));
    let _ = upstream.join();
}

/// Copies until the reader ends, then half-closes the writer.
fn copy<R: Read, W: Write>(mut from: R, mut to: W, close: impl Fn(&W) -> std::io::Result<()>) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = close(&to);
}
