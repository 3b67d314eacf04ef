//! Starting the egress proxy of one `network = "proxy"` launch: a separate
//! process (`substrat-sandbox __proxy`) whose socket the sandbox gets; it is
//! stopped when the launch ends.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use substrat_policy::model::ProxyPolicy;
use substrat_proxy::{Destination, ProxyRules, TestSwitches};

/// The running proxy of one launch; stopped and cleaned up when dropped.
#[derive(Debug)]
pub struct ProxyProcess {
    child: Child,
    dir: PathBuf,
    pub socket: PathBuf,
}

impl Drop for ProxyProcess {
    /// SIGTERM first, so the proxy writes the audit lines of connections
    /// that just closed; SIGKILL after two seconds.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `--proxy-test-host NAME=ADDR`.
pub fn test_host(text: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected NAME=ADDR"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("`{text}`: `{addr}` is not an IP address"))?;
    Ok((name.to_string(), addr))
}

/// Starts the proxy for `policy` and waits until its socket answers.
pub fn start(
    policy: &ProxyPolicy,
    destinations: Vec<Destination>,
    switches: TestSwitches,
    agent: &str,
    audit: Option<&Path>,
) -> Result<ProxyProcess> {
    // A policy's switches for tests stop the launch before anything starts.
    let own = substrat_proxy::own_addresses()
        .context("cannot list this host's addresses (the proxy refuses them)")?;
    let rules = ProxyRules::from_policy(policy, own, destinations, switches)?;
    // The proxy is a subcommand of the full program, which sits beside
    // this one (itself, or substrat-run). Checked before anything is made.
    let program = std::env::current_exe()?.with_file_name("substrat-sandbox");
    if !program.is_file() {
        bail!(
            "the proxy needs {} (install it beside this program)",
            program.display()
        );
    }
    remove_stale_dirs(&std::env::temp_dir());
    let rules = serde_json::to_string(&rules)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("substrat-proxy-{}-{nanos:x}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let socket = dir.join("proxy.sock");
    let mut command = Command::new(&program);
    command
        .arg("__proxy")
        .arg("--socket")
        .arg(&socket)
        .args(["--agent", agent, "--rules", &rules])
        .args(["--parent", &std::process::id().to_string()])
        .stdin(Stdio::null());
    if let Some(audit) = audit {
        command.arg("--audit").arg(audit);
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e).context("cannot start the proxy");
        }
    };
    let mut proxy = ProxyProcess { child, dir, socket };
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&proxy.socket).is_err() {
        if let Some(status) = proxy.child.try_wait()? {
            bail!("the proxy exited at start ({status})");
        }
        if start.elapsed() > Duration::from_secs(5) {
            bail!("the proxy did not start within 5 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(proxy)
}

/// The directories of launchers that died without cleaning up (SIGKILL):
/// `substrat-proxy-PID-*` of this user whose PID is gone. A PID in use
/// again keeps its directory (a few bytes), never someone else's.
pub fn remove_stale_dirs(temp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("substrat-proxy-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // Not followed: a symlink or another user's entry is left alone.
        let ours = entry
            .path()
            .symlink_metadata()
            .is_ok_and(|m| m.is_dir() && m.uid() == me);
        let gone = pid > 0
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
        if ours && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
