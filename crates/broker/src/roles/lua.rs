//! Script roles (seed 004 §3.2): a Lua 5.4 script defines `agent.name`,
//! `description`, `tools`, `arguments` and `resolve(args, config,
//! context)`. Each evaluation gets a fresh Lua state with only the
//! string, table, math and utf8 libraries: no io, os, package/require,
//! debug or coroutine, no `load`, `loadfile`, `dofile`, `print`,
//! `collectgarbage` or `string.dump`, and the script is loaded as text
//! only (bytecode can crash the VM). A memory limit bounds the state; an
//! instruction hook ends it at the time limit, and `pcall` cannot swallow
//! either (it hands them on). What goes wrong becomes a `RoleError`.
//!
//! This is the evaluator's engine: the hook never fires inside a C call,
//! so nothing here is bounded in time on its own. The daemon and the CLI
//! run it only in an evaluator process (`eval`), killed at the limit.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mlua::chunk::ChunkMode;
use mlua::{
    Function, HookTriggers, Lua, LuaOptions, LuaSerdeExt, StdLib, Table, Value as Lua_, VmState,
};
use serde::Deserialize;
use serde_json::Value;

use super::{
    PromptMessage, RoleArgs, RoleArgument, RoleError, RoleInfo, RolePrompt, RoleSource,
    TeamContext, check_prompt,
};

/// The largest script file.
pub const MAX_SCRIPT_BYTES: u64 = 1 << 20;
/// Names whose absence gets its own error text.
const WITHHELD: [&str; 10] = [
    "io",
    "os",
    "require",
    "package",
    "debug",
    "load",
    "loadfile",
    "dofile",
    "coroutine",
    "collectgarbage",
];
/// How often the hook looks at the clock.
const HOOK_EVERY: u32 = 1000;

/// A script role's settings, from its policy's `[persona]`.
#[derive(Debug, Clone)]
pub struct LuaLimits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    /// Calls of `context` functions per evaluation.
    pub context_calls: u32,
}

/// A loaded script: its source and what it declares.
#[derive(Debug, Clone)]
pub struct LuaRole {
    pub info: RoleInfo,
    source: Arc<str>,
    config: Value,
    limits: LuaLimits,
}

/// What the top level of a script declares.
#[derive(Debug)]
struct Declared {
    name: Option<String>,
    description: String,
    tools: Vec<String>,
    arguments: Vec<RoleArgument>,
}

/// What `resolve` returns.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resolved {
    system: String,
    #[serde(default)]
    messages: Vec<PromptMessage>,
}

impl LuaRole {
    /// Reads and runs the script's top level (with the same limits) to
    /// learn what it declares; `role` is the policy's name, which the
    /// script's `agent.name`, if given, must match.
    pub fn load(
        role: &str,
        path: &Path,
        config: Value,
        limits: LuaLimits,
    ) -> Result<Self, RoleError> {
        let source = read_script(role, path)?;
        Self::from_source(role, source.into(), config, limits)
    }

    /// As `load`, the script's text given.
    pub fn from_source(
        role: &str,
        source: Arc<str>,
        config: Value,
        limits: LuaLimits,
    ) -> Result<Self, RoleError> {
        let run = Run::new(role, &limits)?;
        let agent = run.agent_table(&source)?;
        let declared = run.declared(&agent)?;
        if let Some(name) = declared.name.as_deref().filter(|n| *n != role) {
            return Err(RoleError::Script {
                role: role.to_string(),
                message: format!("agent.name is `{name}` but the role is `{role}`"),
            });
        }
        if !matches!(agent.get::<Lua_>("resolve"), Ok(Lua_::Function(_))) {
            return Err(RoleError::Script {
                role: role.to_string(),
                message: "agent.resolve is not a function".into(),
            });
        }
        Ok(Self {
            info: RoleInfo {
                name: role.to_string(),
                description: declared.description,
                tools: declared.tools,
                source: RoleSource::Lua,
                arguments: declared.arguments,
            },
            source,
            config,
            limits,
        })
    }

    pub fn limits(&self) -> &LuaLimits {
        &self.limits
    }

    /// Runs `agent.resolve(args, config, context)` in a fresh state. The
    /// caller runs it on a thread of its own (`super::resolve_on_thread`).
    pub fn resolve(
        &self,
        args: &RoleArgs,
        context: Arc<dyn TeamContext>,
    ) -> Result<RolePrompt, RoleError> {
        let role = self.info.name.as_str();
        let run = Run::new(role, &self.limits)?;
        let agent = run.agent_table(&self.source)?;
        let resolve: Function = agent
            .get("resolve")
            .map_err(|e| run.error(e, "agent.resolve"))?;
        let lua = &run.lua;
        let args = lua.to_value(args).map_err(|e| run.error(e, "args"))?;
        let config = lua
            .to_value(&self.config)
            .map_err(|e| run.error(e, "config"))?;
        let context = run.context_table(context, self.limits.context_calls)?;
        let out: Lua_ = resolve
            .call((args, config, context))
            .map_err(|e| run.error(e, "resolve"))?;
        measure(&out, 0, &mut Measured::default()).map_err(|message| RoleError::Invalid {
            role: role.to_string(),
            message,
        })?;
        let resolved: Resolved = lua.from_value(out).map_err(|e| RoleError::Script {
            role: role.to_string(),
            message: format!("resolve must return {{system = string, messages = {{...}}}}: {e}"),
        })?;
        let prompt = RolePrompt {
            system: resolved.system,
            tools: self.info.tools.clone(),
            messages: resolved.messages,
        };
        check_prompt(role, &prompt)?;
        Ok(prompt)
    }
}

/// A script's text, at most `MAX_SCRIPT_BYTES` (errors name its path: they
/// are the operator's, when the daemon starts or `check` runs).
pub fn read_script(role: &str, path: &Path) -> Result<String, RoleError> {
    let fail = |message: String| RoleError::Script {
        role: role.to_string(),
        message,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| fail(format!("script {}: {e}", path.display())))?
        .len();
    if size > MAX_SCRIPT_BYTES {
        return Err(fail(format!(
            "script {} has {size} bytes, over the limit of {MAX_SCRIPT_BYTES}",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| fail(format!("script {}: {e}", path.display())))
}

/// One evaluation's Lua state, its deadline and limits.
struct Run {
    lua: Lua,
    role: String,
    deadline: Instant,
    limits: LuaLimits,
}

impl Run {
    fn new(role: &str, limits: &LuaLimits) -> Result<Self, RoleError> {
        let setup = |e: mlua::Error| RoleError::Script {
            role: role.to_string(),
            message: format!("cannot set up Lua: {e}"),
        };
        let libs = StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8;
        let lua = Lua::new_with(libs, LuaOptions::default()).map_err(setup)?;
        lua.set_memory_limit(limits.memory_bytes).map_err(setup)?;
        let deadline = Instant::now() + limits.timeout;
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| {
                if Instant::now() >= deadline {
                    Err(mlua::Error::runtime("time limit"))
                } else {
                    Ok(VmState::Continue)
                }
            },
        )
        .map_err(setup)?;
        withhold(&lua, deadline, limits.memory_bytes as f64).map_err(setup)?;
        Ok(Self {
            lua,
            role: role.to_string(),
            deadline,
            limits: limits.clone(),
        })
    }

    /// Runs the script's top level, which returns (or sets) `agent`. The
    /// chunk is named `ROLE.lua`, never by its path: its errors reach
    /// agents, the daemon's paths must not.
    fn agent_table(&self, source: &str) -> Result<Table, RoleError> {
        let value: Lua_ = self
            .lua
            .load(source)
            .set_name(format!("@{}.lua", self.role))
            .set_mode(ChunkMode::Text)
            .eval()
            .map_err(|e| self.error(e, "the script"))?;
        match value {
            Lua_::Table(t) => Ok(t),
            _ => match self.lua.globals().raw_get::<Lua_>("agent") {
                Ok(Lua_::Table(t)) => Ok(t),
                _ => Err(RoleError::Script {
                    role: self.role.clone(),
                    message: "the script neither returns nor sets an `agent` table".into(),
                }),
            },
        }
    }

    /// The `agent` table's fields, each of its type.
    fn declared(&self, agent: &Table) -> Result<Declared, RoleError> {
        let field = |name: &str| -> Result<Lua_, RoleError> {
            agent
                .raw_get(name)
                .map_err(|e| self.error(e, "the `agent` table"))
        };
        let typed = |name: &str, what: &str| -> Result<Option<Value>, RoleError> {
            let value = field(name)?;
            if value.is_nil() {
                return Ok(None);
            }
            let json = self
                .lua
                .from_value::<Value>(value)
                .map_err(|e| RoleError::Script {
                    role: self.role.clone(),
                    message: format!("agent.{name} must be {what}: {e}"),
                })?;
            Ok(Some(json))
        };
        let invalid = |name: &str, what: &str, e: serde_json::Error| RoleError::Script {
            role: self.role.clone(),
            message: format!("agent.{name} must be {what}: {e}"),
        };
        let string = "a string";
        let name = typed("name", string)?
            .map(serde_json::from_value::<String>)
            .transpose()
            .map_err(|e| invalid("name", string, e))?;
        let description = typed("description", string)?
            .map(serde_json::from_value::<String>)
            .transpose()
            .map_err(|e| invalid("description", string, e))?
            .unwrap_or_default();
        let list = "a list of tool names";
        let tools = typed("tools", list)?
            .map(serde_json::from_value::<Vec<String>>)
            .transpose()
            .map_err(|e| invalid("tools", list, e))?
            .unwrap_or_default();
        let args = "a list of {name, description, required}";
        let arguments = typed("arguments", args)?
            .map(serde_json::from_value::<Vec<RoleArgument>>)
            .transpose()
            .map_err(|e| invalid("arguments", args, e))?
            .unwrap_or_default();
        Ok(Declared {
            name,
            description,
            tools,
            arguments,
        })
    }

    /// `context.team()`, `context.inbox()`, `context.inspect(name)`, each
    /// call counted.
    fn context_table(&self, team: Arc<dyn TeamContext>, limit: u32) -> Result<Table, RoleError> {
        let calls = Arc::new(AtomicU32::new(0));
        let lua = &self.lua;
        let table = lua.create_table().map_err(|e| self.error(e, "context"))?;
        let count = move |calls: &AtomicU32| -> mlua::Result<()> {
            if calls.fetch_add(1, Ordering::Relaxed) >= limit {
                return Err(mlua::Error::runtime(format!(
                    "more than {limit} context calls (the role's mcp.tool_steps_per_turn)"
                )));
            }
            Ok(())
        };
        let (t, c) = (team.clone(), calls.clone());
        let team_fn = lua.create_function(move |lua, ()| {
            count(&c)?;
            lua.to_value(&t.team())
        });
        let (t, c) = (team.clone(), calls.clone());
        let inbox_fn = lua.create_function(move |lua, ()| {
            count(&c)?;
            lua.to_value(&t.inbox())
        });
        let (t, c) = (team, calls);
        let inspect_fn = lua.create_function(move |lua, name: String| {
            count(&c)?;
            match t.inspect(&name) {
                Some(view) => lua.to_value(&view),
                None => Ok(Lua_::Nil),
            }
        });
        let set =
            |name: &str, f: mlua::Result<Function>| -> mlua::Result<()> { table.set(name, f?) };
        set("team", team_fn)
            .and_then(|()| set("inbox", inbox_fn))
            .and_then(|()| set("inspect", inspect_fn))
            .map_err(|e| self.error(e, "context"))?;
        Ok(table)
    }

    /// A Lua error as the role's error: the time and memory limits by
    /// name, anything else with the script's message.
    fn error(&self, e: mlua::Error, during: &str) -> RoleError {
        if Instant::now() >= self.deadline {
            return RoleError::Timeout {
                role: self.role.clone(),
                ms: u64::try_from(self.limits.timeout.as_millis()).unwrap_or(u64::MAX),
            };
        }
        if is_memory(&e) {
            return RoleError::Memory {
                role: self.role.clone(),
                bytes: self.limits.memory_bytes,
            };
        }
        RoleError::Script {
            role: self.role.clone(),
            message: format!("{during}: {}", first_line(&e)),
        }
    }
}

/// Text a result may hold in all, counted as it would be copied out: the
/// system prompt's and the messages' limits and room for the rest.
pub const MAX_RESULT_BYTES: usize = 2 * super::MAX_SYSTEM_BYTES + (64 << 10);
/// Table entries a result may hold (each reference to a table counted).
pub const MAX_RESULT_ENTRIES: usize = 4096;
/// Tables within tables a result may nest.
const MAX_RESULT_DEPTH: usize = 8;

#[derive(Default)]
struct Measured {
    bytes: usize,
    entries: usize,
}

/// Measures a result before anything copies it: one string or table
/// referenced many times counts as many times as it would be copied (a
/// list of 10,000 references to one 1 MiB string is 10 GiB once copied,
/// though it holds 1 MiB in Lua). Raw access only: no metamethod runs.
fn measure(value: &Lua_, depth: usize, m: &mut Measured) -> Result<(), String> {
    match value {
        Lua_::String(s) => {
            m.bytes = m.bytes.saturating_add(s.as_bytes().len());
            if m.bytes > MAX_RESULT_BYTES {
                return Err(format!(
                    "the result holds over {MAX_RESULT_BYTES} bytes of text (each reference to a string counted as it would be copied)"
                ));
            }
        }
        Lua_::Table(t) => {
            if depth >= MAX_RESULT_DEPTH {
                return Err(format!(
                    "the result nests tables deeper than {MAX_RESULT_DEPTH}"
                ));
            }
            for pair in t.pairs::<Lua_, Lua_>() {
                let (key, value) = pair.map_err(|e| format!("the result: {}", first_line(&e)))?;
                m.entries += 1;
                if m.entries > MAX_RESULT_ENTRIES {
                    return Err(format!(
                        "the result holds over {MAX_RESULT_ENTRIES} table entries (each reference to a table counted)"
                    ));
                }
                measure(&key, depth + 1, m)?;
                measure(&value, depth + 1, m)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn is_memory(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory(cause),
        other => other.to_string().contains("not enough memory"),
    }
}

/// The message without the traceback mlua adds.
fn first_line(e: &mlua::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or("").trim();
    line.chars().take(500).collect()
}

/// Removes what a role script must not have, says so when it is used, and
/// makes `pcall`/`xpcall` hand on the time and memory limits' errors.
fn withhold(lua: &Lua, deadline: Instant, bound: f64) -> mlua::Result<()> {
    let globals = lua.globals();
    for name in ["load", "loadfile", "dofile", "print", "collectgarbage"] {
        globals.raw_set(name, Lua_::Nil)?;
    }
    let string: Table = globals.raw_get("string")?;
    string.raw_set("dump", Lua_::Nil)?;
    let meta = lua.create_table()?;
    meta.set(
        "__index",
        lua.create_function(|_, (_, key): (Table, Lua_)| {
            let key = key.to_string().unwrap_or_default();
            if WITHHELD.contains(&key.as_str()) {
                return Err(mlua::Error::runtime(format!(
                    "`{key}` is not available to role scripts (no io, os, require, load, debug)"
                )));
            }
            Ok(Lua_::Nil)
        })?,
    )?;
    globals.set_metatable(Some(meta))?;
    let fatal = lua.create_function(move |_, message: Lua_| {
        let text = message.to_string().unwrap_or_default();
        Ok(Instant::now() >= deadline || text.contains("not enough memory"))
    })?;
    // Lua runs a finalizer (`__gc`) with hooks off, and `string.rep` and
    // `table.move` loop in C without allocating: each would run past the
    // time limit. Finalizers are refused; the loops are bounded by the
    // memory limit (a count of bytes or slots the script could hold).
    let guard: Function = lua
        .load(
            r#"
            local fatal, raw_pcall, raw_xpcall, err, raw_setmetatable, raw_rep, raw_move, bound = ...
            local rawget, type, tonumber, tostring = rawget, type, tonumber, tostring
            local function hand_on(ok, ...)
                if not ok and fatal((...)) then err((...), 0) end
                return ok, ...
            end
            pcall = function(f, ...) return hand_on(raw_pcall(f, ...)) end
            xpcall = function(f, h, ...) return hand_on(raw_xpcall(f, h, ...)) end
            setmetatable = function(t, mt)
                if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
                    err("__gc is not available to role scripts (finalizers run outside the time limit)", 2)
                end
                return raw_setmetatable(t, mt)
            end
            string.rep = function(s, n, sep)
                local count = tonumber(n)
                if count then
                    local each = #tostring(s) + (sep ~= nil and #tostring(sep) or 0)
                    if count * (each > 0 and each or 1) > bound then
                        err("not enough memory (string.rep over the role's memory limit)", 2)
                    end
                end
                return raw_rep(s, n, sep)
            end
            table.move = function(a1, f, e, t, a2)
                local first, last = tonumber(f), tonumber(e)
                if first and last and last - first > bound then
                    err("table.move: more elements than the role's memory limit allows", 2)
                end
                return raw_move(a1, f, e, t, a2)
            end
            "#,
        )
        .set_mode(ChunkMode::Text)
        .into_function()?;
    let table: Table = globals.raw_get("table")?;
    guard.call::<()>((
        fatal,
        globals.raw_get::<Function>("pcall")?,
        globals.raw_get::<Function>("xpcall")?,
        globals.raw_get::<Function>("error")?,
        globals.raw_get::<Function>("setmetatable")?,
        string.raw_get::<Function>("rep")?,
        table.raw_get::<Function>("move")?,
        bound,
    ))
}
