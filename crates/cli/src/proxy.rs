//! The egress proxy of a `network = "proxy"` sandbox (`__proxy`): the
//! launcher starts it before the sandbox (substrat_cli::proxy_process) and
//! binds its socket in; it ends with the launcher.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
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
            eprintln!(
                "substrat-sandbox proxy: {}",
                substrat_cli::term::error_text(&e)
            );
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
