//! `substrat-sandbox role list | test | init` (seed 004 §9): the roles a
//! daemon started with the same `--policies` would serve, one resolved
//! as `prompts/get` would (with no team), and a template to start from.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use substrat_broker::roles::{
    NoTeam, Role, RoleArgs, RoleInfo, RolePrompt, RoleSource, load_scripts, resolve_on_thread,
    resolved_info, script_limits, static_info, static_prompt,
};
use substrat_policy::text::{self, escape_text as safe};

use crate::daemon::load_roles;

#[derive(Debug, clap::Args)]
pub struct RoleCliArgs {
    /// Directory of role policies (*.toml) besides the built-in ones. Default: ./policies when it exists.
    #[arg(long, global = true, value_name = "DIR")]
    pub policies: Option<PathBuf>,
    /// The daemon's configuration file, for its inline roles ([roles.NAME], [roles.script.NAME]).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: RoleCommand,
}

#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Every role: name, source (toml, lua), description, tools, arguments.
    List,
    /// Resolve a role as `prompts/get` would, with no team (context.team() is empty).
    Test {
        /// The role (see `role list`).
        name: String,
        /// An argument, as KEY=VALUE; repeatable.
        #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = crate::parse_role_arg)]
        args: Vec<(String, String)>,
    },
    /// Write a commented template role: DIR/NAME.toml, and with --lua DIR/NAME.lua. Existing files are never overwritten.
    Init {
        /// The new role's name (letters, digits, `-`, `_`).
        name: String,
        /// A script role (Lua) instead of a static system prompt.
        #[arg(long)]
        lua: bool,
        /// Where to write. Default: ./policies.
        #[arg(long, value_name = "DIR", default_value = "policies")]
        dir: PathBuf,
    },
}

pub fn role(args: &RoleCliArgs) -> ExitCode {
    let result = match &args.command {
        RoleCommand::List => list(args),
        RoleCommand::Test { name, args: given } => test(args, name, given),
        RoleCommand::Init { name, lua, dir } => init(name, *lua, dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox role: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

/// The roles and their script roles, loaded as the daemon loads them.
fn loaded(args: &RoleCliArgs) -> Result<(substrat_broker::Roles, Vec<Arc<dyn Role>>)> {
    let (roles, _) = load_roles(args.policies.as_deref(), args.config.as_deref())?;
    let scripts = load_scripts(&roles).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((roles, scripts))
}

fn list(args: &RoleCliArgs) -> Result<()> {
    let (roles, scripts) = loaded(args)?;
    let infos: Vec<RoleInfo> = roles
        .iter()
        .map(
            |(name, policy)| match scripts.iter().find(|s| s.name() == name) {
                Some(script) => resolved_info(script.as_ref(), RoleSource::Lua),
                None => static_info(name, policy),
            },
        )
        .collect();
    if args.json {
        println!("{}", text::json_safe(serde_json::to_string_pretty(&infos)?));
        return Ok(());
    }
    for info in &infos {
        let source = match info.source {
            RoleSource::Toml => "toml",
            RoleSource::Lua => "lua",
            RoleSource::Rust => "rust",
        };
        // A script computes these: shown escaped, as any text a program
        // chose (issue 40).
        let (name, description) = (safe(&info.name), safe(&info.description));
        println!("{name}  ({source})  {description}");
        if !info.tools.is_empty() {
            println!("  tools: {}", safe(&info.tools.join(", ")));
        }
        for a in &info.arguments {
            let required = if a.required { " (required)" } else { "" };
            let (name, description) = (safe(&a.name), safe(&a.description));
            println!("  --arg {name}=...{required}  {description}");
        }
    }
    Ok(())
}

fn test(args: &RoleCliArgs, name: &str, given: &[(String, String)]) -> Result<()> {
    let (roles, scripts) = loaded(args)?;
    let Some(policy) = roles.get(name) else {
        bail!("no role `{name}` (see `role list`)");
    };
    let given: RoleArgs = given.iter().cloned().collect();
    let prompt = match scripts.into_iter().find(|s| s.name() == name) {
        Some(script) => {
            let timeout = script_limits(&policy.policy).timeout;
            resolve_on_thread(script, given, Arc::new(NoTeam), timeout)
        }
        None => static_prompt(name, policy, &given),
    }
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        println!(
            "{}",
            text::json_safe(serde_json::to_string_pretty(&prompt)?)
        );
    } else {
        print_prompt(&prompt);
    }
    Ok(())
}

fn print_prompt(prompt: &RolePrompt) {
    println!("system:\n{}", text::escape_lines(prompt.system.trim_end()));
    if !prompt.tools.is_empty() {
        println!("\ntools: {}", safe(&prompt.tools.join(", ")));
    }
    for m in &prompt.messages {
        let role = serde_json::to_value(m.role)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        println!("\n{role}:\n{}", text::escape_lines(m.content.trim_end()));
    }
}

fn init(name: &str, lua: bool, dir: &Path) -> Result<()> {
    if !substrat_policy::valid_role_name(name) {
        bail!("`{name}` is not a role name (letters, digits, `-`, `_`)");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let policy = dir.join(format!("{name}.toml"));
    let script = dir.join(format!("{name}.lua"));
    let mut files = vec![(policy, policy_template(name, lua))];
    if lua {
        files.push((script, script_template(name)));
    }
    if let Some((taken, _)) = files.iter().find(|(path, _)| path.exists()) {
        bail!("{} exists; nothing written", taken.display());
    }
    for (path, text) in &files {
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    println!(
        "check it with: substrat-sandbox check {}",
        files[0].0.display()
    );
    Ok(())
}

fn policy_template(name: &str, lua: bool) -> String {
    let persona = if lua {
        format!(
            r#"[persona]
# The script resolves the role's system prompt from its arguments and the
# team (docs/roles.md); its path is relative to this file.
script = "{name}.lua"
# Limits of one evaluation (defaults: 2000 ms, 32 MiB).
timeout_ms = 2000
memory_mb = 32
# Passed to the script's resolve(args, config, context) as `config`.
config = {{ team_name = "the team" }}
"#
        )
    } else {
        r#"[persona]
description = "What this role is for, in one line"
system_prompt = """
You are ... Say what the agent is, what it works on and how it reports.
"""
"#
        .to_string()
    };
    format!(
        r#"# The role `{name}`: its sandbox is the worker's (extends), its tools are
# scoped below, and its persona says what the agent is told it is.
version = 1
extends = "worker"

[tools]
# The tools this role may see and call (names or globs); the broker enforces it.
allow = ["send_message", "check_inbox", "inspect_agent"]

{persona}"#
    )
}

fn script_template(name: &str) -> String {
    format!(
        r#"-- The role `{name}` (docs/roles.md). Only string, table, math and utf8
-- are available: no io, os, require or load. resolve runs with the limits
-- of the policy's [persona].
local agent = {{}}

agent.name = "{name}"
agent.description = "What this role is for, in one line"
-- The tools the role uses: keep them within the policy's [tools] allow.
agent.tools = {{ "send_message", "check_inbox", "inspect_agent" }}
-- Arguments given with `agent spawn --arg topic=...` or MCP prompts/get.
agent.arguments = {{
    {{ name = "topic", description = "What the agent works on", required = true }},
}}

-- args: the arguments; config: the policy's persona.config; context:
-- team(), inbox(), inspect(name), read-only, each call counted.
function agent.resolve(args, config, context)
    local team = context.team()
    return {{
        system = string.format(
            "You work on %s with %s (%d teammates). Report with send_message.",
            args.topic, config.team_name or "your team", #team),
        -- Optional opening messages.
        messages = {{}},
    }}
end

return agent
"#
    )
}
