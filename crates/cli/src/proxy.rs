//! The egress proxy of a `network = "proxy"` sandbox: the launcher starts
//! it as a separate process (`__proxy`) before the sandbox and binds its
//! socket in; it ends with the launcher.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use substrat_policy::model::ProxyPolicy;
use substrat_proxy::{Audit, ProxyRules};

/// `__proxy`: serve until the launcher is gone.
pub fn main(
    socket: &Path,
    agent: &str,
    rules: &str,
    audit: Option<&Path>,
    parent: i32,
) -> ExitCode {
    match serve(socket, agent, rules, audit, parent) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("substrat-sandbox proxy: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(socket: &Path, agent: &str, rules: &str, audit: Option<&Path>, parent: i32) -> Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    if nix::unistd::getppid().as_raw() != parent {
        bail!("the launcher is gone");
    }
    let rules: ProxyRules = serde_json::from_str(rules).context("the proxy rules")?;
    rules
        .validate()
        .map_err(|e| anyhow::anyhow!("the proxy rules: {e}"))?;
    let out: Box<dyn std::io::Write + Send> = match audit {
        Some(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?,
        ),
        None => Box::new(std::io::stderr()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        // SIGTERM from the launcher when the sandbox has ended.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            term.recv().await;
        };
        substrat_proxy::serve(
            listener,
            Arc::from(agent),
            Arc::new(rules),
            Arc::new(Audit::new(out)),
            shutdown,
        )
        .await;
        Ok(())
    })
}

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

/// Starts the proxy for `policy` and waits until its socket answers.
pub fn start(policy: &ProxyPolicy, agent: &str, audit: Option<&Path>) -> Result<ProxyProcess> {
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
    let own = substrat_proxy::own_addresses()
        .context("cannot list this host's addresses (the proxy refuses them)")?;
    let rules = ProxyRules::from_policy(policy, own);
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("__proxy")
        .arg("--socket")
        .arg(&socket)
        .args(["--agent", agent, "--rules", &serde_json::to_string(&rules)?])
        .args(["--parent", &std::process::id().to_string()])
        .stdin(Stdio::null());
    if let Some(audit) = audit {
        command.arg("--audit").arg(audit);
    }
    let child = command.spawn().context("cannot start the proxy")?;
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
