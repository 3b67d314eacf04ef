//! `run -t`: the command gets a pseudo-terminal of its own, with job
//! control (Ctrl-C reaches its foreground job, not the whole sandbox) and
//! the window size following the launcher's terminal. The launcher keeps
//! the real terminal (in raw mode while the command runs) and relays
//! between the two. TIOCSTI stays denied inside (seccomp), on this
//! terminal as on any other.
//!
//! How: the pty's slave becomes the launcher's own stdin, stdout and
//! stderr for the launch, so either backend hands it on as the command's;
//! the command, a session leader, takes it as its controlling terminal
//! (`LaunchPlan::terminal`). A relay process copies between the real
//! terminal and the pty's master; the launcher's stdio is given back on
//! `finish`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{Mode, OFlags};
use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::{OptionalActions, Winsize, isatty, tcgetattr, tcgetwinsize};
use rustix::termios::{tcsetattr, tcsetwinsize};

/// How often the relay looks at the window size (no signal handler needed).
const RESIZE_CHECK: Duration = Duration::from_millis(200);

/// Whether the command gets a pseudo-terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TtyMode {
    /// When stdin, stdout and stderr are all terminals (a run with
    /// `2>log` keeps its stderr apart).
    Auto,
    Always,
    Never,
}

impl TtyMode {
    pub fn wanted(self) -> bool {
        match self {
            TtyMode::Always => true,
            TtyMode::Never => false,
            TtyMode::Auto => isatty(io::stdin()) && isatty(io::stdout()) && isatty(io::stderr()),
        }
    }
}

/// The launcher's stdio on a pseudo-terminal, and the relay to the real
/// one: a process of its own (`substrat-sandbox __tty-relay`), since the
/// native backend forks and must stay single-threaded.
#[derive(Debug)]
pub struct Terminal {
    /// The launcher's real stdin, stdout and stderr.
    real: [OwnedFd; 3],
    relay: Option<Child>,
}

impl Terminal {
    /// `start` when `wanted`.
    pub fn start_if(wanted: bool) -> io::Result<Option<Self>> {
        wanted.then(Self::start).transpose()
    }

    /// Makes the pty, starts the relay and puts the pty's slave on fds 0-2.
    pub fn start() -> io::Result<Self> {
        let real = [
            io::stdin().as_fd().try_clone_to_owned()?,
            io::stdout().as_fd().try_clone_to_owned()?,
            io::stderr().as_fd().try_clone_to_owned()?,
        ];
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let name = ptsname(&master, Vec::new())?;
        let slave = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        if let Ok(size) = tcgetwinsize(&real[0]).or_else(|_| tcgetwinsize(&real[1])) {
            tcsetwinsize(&master, size)?;
        }
        // The relay: the real input on its stdin, the real output on its
        // stdout, the pty's master on its stderr. The slave (close-on-exec)
        // stays here.
        let program = std::env::current_exe()?.with_file_name("substrat-sandbox");
        let relay = Command::new(program)
            .arg("__tty-relay")
            .stdin(Stdio::from(real[0].try_clone()?))
            .stdout(Stdio::from(real[1].try_clone()?))
            .stderr(Stdio::from(master))
            .spawn()?;
        rustix::stdio::dup2_stdin(&slave)?;
        rustix::stdio::dup2_stdout(&slave)?;
        rustix::stdio::dup2_stderr(&slave)?;
        Ok(Self {
            real,
            relay: Some(relay),
        })
    }

    /// Puts the real stdio back and waits for the relay, which writes what
    /// the command wrote last and restores the terminal's settings.
    pub fn finish(mut self) {
        self.restore();
    }

    fn restore(&mut self) {
        let _ = rustix::stdio::dup2_stdin(&self.real[0]);
        let _ = rustix::stdio::dup2_stdout(&self.real[1]);
        let _ = rustix::stdio::dup2_stderr(&self.real[2]);
        // No slave descriptor is left here: the relay sees the hangup once
        // the sandbox's are gone too.
        if let Some(mut relay) = self.relay.take() {
            let _ = relay.wait();
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.restore();
    }
}

/// `substrat-sandbox __tty-relay`: the real input on fd 0, the real output
/// on fd 1, the pty's master on fd 2. The real terminal is in raw mode
/// while it runs (keys, Ctrl-C included, go to the pty, whose line
/// discipline signals the command's foreground job) and restored at the
/// end, also when the launcher was killed (the pty hangs up then too).
pub fn relay_main() -> ExitCode {
    let input = io::stdin().as_fd().try_clone_to_owned();
    let output = io::stdout().as_fd().try_clone_to_owned();
    let master = io::stderr().as_fd().try_clone_to_owned();
    let (Ok(input), Ok(output), Ok(master)) = (input, output, master) else {
        return ExitCode::from(2);
    };
    let input_is_tty = isatty(&input);
    let saved = input_is_tty.then(|| tcgetattr(&input).ok()).flatten();
    if let Some(before) = &saved {
        let mut raw = before.clone();
        raw.make_raw();
        let _ = tcsetattr(&input, OptionalActions::Now, &raw);
    }
    relay(&master, &input, &output, input_is_tty);
    if let Some(before) = &saved {
        let _ = tcsetattr(&input, OptionalActions::Now, before);
    }
    ExitCode::SUCCESS
}

/// Copies input to the pty and the pty to output until the pty hangs up
/// (no slave left open), and makes the pty's window size follow input's.
/// The master is non-blocking: input waits in `pending` until the pty
/// takes it, so a command that does not read never stops its output (nor
/// Ctrl-C) from getting through.
fn relay(master: &OwnedFd, input: &OwnedFd, output: &OwnedFd, input_is_tty: bool) {
    let _ = rustix::io::ioctl_fionbio(master, true);
    let mut buf = [0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut input_open = true;
    let mut size = tcgetwinsize(input).ok().map(dims);
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: RESIZE_CHECK.as_nanos() as _,
    };
    loop {
        let master_wants = if pending.is_empty() {
            PollFlags::IN
        } else {
            PollFlags::IN | PollFlags::OUT
        };
        let mut fds = vec![PollFd::new(master, master_wants)];
        // More input only once the pty took what is pending.
        if input_open && pending.is_empty() {
            fds.push(PollFd::new(input, PollFlags::IN));
        }
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
        let from_master = fds[0].revents();
        let from_input = fds.get(1).map(PollFd::revents);
        if from_master.contains(PollFlags::IN) && !drain(master, output, &mut buf) {
            return;
        }
        if !from_master.contains(PollFlags::IN)
            && from_master.intersects(PollFlags::HUP | PollFlags::ERR)
        {
            return;
        }
        if from_master.contains(PollFlags::OUT) {
            match rustix::io::write(master, &pending) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
        if let Some(flags) = from_input
            && flags.intersects(PollFlags::IN | PollFlags::HUP)
        {
            match rustix::io::read(input, &mut buf) {
                Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                // End of a piped input: the line discipline's end-of-file
                // (Ctrl-D), twice after a line without its newline (the
                // first only hands that line over).
                _ => {
                    input_open = false;
                    pending.extend_from_slice(&[4, 4]);
                }
            }
        }
        if input_is_tty {
            let now = tcgetwinsize(input).ok().map(dims);
            if now != size {
                if let Ok(current) = tcgetwinsize(input) {
                    let _ = tcsetwinsize(master, current);
                }
                size = now;
            }
        }
    }
}

/// Everything the pty has now, to `output`; false when the pty is gone.
fn drain(master: &OwnedFd, output: &OwnedFd, buf: &mut [u8]) -> bool {
    loop {
        match rustix::io::read(master, &mut *buf) {
            Ok(0) => return false,
            Ok(n) => {
                if write_all(output, &buf[..n]).is_err() {
                    return false;
                }
            }
            Err(rustix::io::Errno::AGAIN) => return true,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}

fn dims(size: Winsize) -> (u16, u16) {
    (size.ws_row, size.ws_col)
}

fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
