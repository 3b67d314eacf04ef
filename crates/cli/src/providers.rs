//! The daemon's agent CLIs and model gateway, from its arguments and
//! environment: every CLI found on PATH can run turns (`--provider` names
//! the default), and each model API whose key the daemon holds gets an
//! upstream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use substrat_broker::secret_env;
use substrat_broker::turns::Providers;
use substrat_gateway::{Api, Budget, GatewayConfig, Secret, Upstream};
use substrat_provider::{ClaudeCode, Codex, CursorAgent, GeminiCli, Provider};

use crate::{DaemonArgs, ProviderArg};

/// The environment variable holding each API's real key (one of the
/// daemon's secrets, `substrat_broker::secret_env`), and its public
/// endpoint.
const KEYS: [(Api, &str, &str); 3] = [
    (
        Api::Anthropic,
        secret_env::ANTHROPIC_API_KEY,
        "https://api.anthropic.com",
    ),
    (
        Api::OpenAi,
        secret_env::OPENAI_API_KEY,
        "https://api.openai.com",
    ),
    (
        Api::Gemini,
        secret_env::GEMINI_API_KEY,
        "https://generativelanguage.googleapis.com",
    ),
];

pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// `PROGRAM --version`'s first line, within 20 s; none if it fails.
fn version_of(program: &Path) -> Option<String> {
    let mut child = std::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let start = std::time::Instant::now();
    while child.try_wait().ok()?.is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
}

/// Claude Code, Codex and Gemini CLI, each when it is on PATH.
fn model_clis() -> Vec<Arc<dyn Provider>> {
    let mut found: Vec<Arc<dyn Provider>> = Vec::new();
    if let Some(program) = on_path("claude")
        && let Some(package) = ClaudeCode::package_of(&program)
    {
        found.push(Arc::new(ClaudeCode::new(&package, version_of(&program))));
    }
    if let Some(program) = on_path("codex")
        && let Some(vendor) = Codex::vendor_of(&program)
    {
        let version = version_of(&vendor.join("bin/codex"));
        found.push(Arc::new(Codex::new(&vendor, version)));
    }
    if let (Some(program), Some(node)) = (on_path("gemini"), on_path("node"))
        && let (Some(package), Ok(node)) = (GeminiCli::package_of(&program), node.canonicalize())
    {
        found.push(Arc::new(GeminiCli::new(
            &package,
            &node,
            version_of(&program),
        )));
    }
    found
}

/// The providers, the default one first; none when turns are off.
pub fn providers(
    args: &DaemonArgs,
    stand_in: impl Fn() -> Result<PathBuf>,
) -> Result<Option<Providers>> {
    let cursor = || -> Result<Option<Arc<dyn Provider>>> {
        let Some(program) = on_path("cursor-agent") else {
            return Ok(None);
        };
        let program = program.canonicalize()?;
        let agent = CursorAgent::new("cursor-agent", &program, true)
            .context("the provider's program path has no file name")?;
        Ok(Some(Arc::new(agent)))
    };
    let mut available: Vec<Arc<dyn Provider>> = model_clis();
    if let Some(agent) = cursor()? {
        available.push(agent);
    }
    let wanted = match args.provider {
        ProviderArg::None => return Ok(None),
        ProviderArg::StandIn => {
            let program = stand_in()?.canonicalize()?;
            let agent = CursorAgent::new("stand-in", &program, false)
                .context("the stand-in's path has no file name")?;
            available.push(Arc::new(agent));
            "stand-in"
        }
        ProviderArg::Auto if available.iter().all(|p| p.name() != "cursor-agent") => {
            return Ok(None);
        }
        ProviderArg::Auto | ProviderArg::CursorAgent => "cursor-agent",
        ProviderArg::Claude => "claude",
        ProviderArg::Codex => "codex",
        ProviderArg::Gemini => "gemini",
    };
    let Some(default) = available.iter().find(|p| p.name() == wanted).cloned() else {
        bail!("--provider {wanted}: `{wanted}` is not on PATH");
    };
    let mut providers = Providers::new(default);
    for provider in available {
        // Kept, so its agents' turns fail with this reason (not as unknown).
        if let Err(problem) = substrat_provider::version::check_version(provider.as_ref()) {
            tracing::warn!(cli = provider.name(), "{problem}");
        }
        providers.add(provider);
    }
    Ok(Some(providers))
}

/// The gateway's upstreams: those given (`--model-upstream API=URL`) and,
/// for each API whose key the daemon holds, its public endpoint; none
/// when no API has a key.
pub fn gateway_config(args: &DaemonArgs) -> Result<Option<GatewayConfig>> {
    let mut urls: HashMap<Api, String> = HashMap::new();
    for given in &args.model_upstream {
        let Some((name, url)) = given.split_once('=') else {
            bail!("--model-upstream {given}: expected API=URL (anthropic, openai or gemini)");
        };
        let Some((api, _, _)) = KEYS.iter().find(|(api, _, _)| api.as_str() == name) else {
            bail!("--model-upstream {given}: `{name}` is not anthropic, openai or gemini");
        };
        urls.insert(*api, url.to_string());
    }
    let mut upstreams = HashMap::new();
    for (api, var, public) in KEYS {
        let key = std::env::var(var).ok().filter(|k| !k.is_empty());
        let url = urls.remove(&api);
        let (url, key) = match (url, key) {
            (Some(url), Some(key)) => (url, key),
            (None, Some(key)) => (public.to_string(), key),
            (Some(_), None) => bail!("--model-upstream {}: the daemon has no {var}", api.as_str()),
            (None, None) => continue,
        };
        let upstream = Upstream::new(api, &url, Secret::new(key), &args.model_destination)
            .map_err(|e| anyhow::anyhow!("--model-upstream {}: {e}", api.as_str()))?;
        upstreams.insert(api, upstream);
    }
    if upstreams.is_empty() {
        return Ok(None);
    }
    Ok(Some(GatewayConfig {
        upstreams,
        team: Budget {
            requests_per_minute: args.team_requests_per_minute,
            tokens_per_day: args.team_tokens_per_day,
            concurrent_requests: args.team_concurrent_model_requests,
            ..Budget::default()
        },
        spool: Default::default(),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gateway_port_is_the_sandboxs() {
        assert_eq!(
            substrat_broker::turns::GATEWAY_PORT,
            substrat_sandbox::plan::GATEWAY_PORT
        );
        assert_eq!(
            substrat_broker::turns::GATEWAY_SOCKET_INSIDE,
            substrat_sandbox::plan::GATEWAY_SOCKET_INSIDE
        );
    }
}
