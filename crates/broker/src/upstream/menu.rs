//! One menu per role: the built-in tools first, then each upstream
//! server's tools in config order, each in its listed order, namespaced
//! `<server>_<tool>`; only what the role's scope allows; at most the cap.
//! Pure: tested by comparing whole menus.

use serde::Serialize;
use serde_json::Value;
use substrat_policy::model::{MAX_TOOLS, Policy};

use crate::tools::{BUILTIN_TOOLS, in_scope};

/// Longest namespaced tool name.
pub const MAX_TOOL_NAME: usize = 60;

/// An upstream tool's definition as listed by its server. Name,
/// description, input schema and annotations are pinned; the rest is
/// relayed to agents as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UpstreamTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub annotations: Value,
    pub title: Option<String>,
    pub output_schema: Option<serde_json::Map<String, Value>>,
    pub icons: Option<Vec<rmcp::model::Icon>>,
    pub meta: Option<rmcp::model::MetaObject>,
}

/// A tool's pin, as the store decided it.
pub use crate::store::PinState;

/// What one server currently offers, with each tool's pin state.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTools {
    pub server: String,
    pub tools: Vec<(UpstreamTool, PinState)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MenuEntry {
    /// The name the agent sees and calls.
    pub name: String,
    /// None for a built-in.
    pub server: Option<String>,
    /// The name on its server.
    pub tool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dropped {
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Menu {
    pub entries: Vec<MenuEntry>,
    /// In scope but not listed: over the cap, colliding, badly named,
    /// quarantined.
    pub dropped: Vec<Dropped>,
}

impl Menu {
    pub fn find(&self, name: &str) -> Option<&MenuEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// `<server>_<tool>`: the tool's name must keep to MCP's characters
/// (letters, digits, `_`, `-`, `.`) and the whole to 60 characters. Server
/// names have no `_`, so the first `_` always separates the two.
pub fn namespaced(server: &str, tool: &str) -> Result<String, NameError> {
    let ok_chars = !tool.is_empty()
        && tool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !ok_chars {
        return Err(NameError::Characters);
    }
    let name = format!("{server}_{tool}");
    if name.len() > MAX_TOOL_NAME {
        return Err(NameError::TooLong);
    }
    Ok(name)
}

/// Why an upstream tool's name cannot be offered (the menu drops it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("invalid_name: not letters, digits, `_`, `-`, `.`")]
    Characters,
    #[error("invalid_name: longer than {MAX_TOOL_NAME} characters")]
    TooLong,
}

pub fn build(policy: &Policy, servers: &[ServerTools]) -> Menu {
    let cap = policy.mcp.tool_cap.unwrap_or(MAX_TOOLS).min(MAX_TOOLS) as usize;
    let mut menu = Menu::default();
    // Every built-in name is taken, in scope or not: nothing may shadow one.
    let mut taken: Vec<String> = BUILTIN_TOOLS.iter().map(|t| t.to_string()).collect();
    let offer = |menu: &mut Menu, entry: MenuEntry| {
        if menu.entries.len() < cap {
            menu.entries.push(entry);
        } else {
            menu.dropped.push(Dropped {
                name: entry.name,
                reason: format!("cap: the menu holds {cap} tools"),
            });
        }
    };
    for tool in BUILTIN_TOOLS.iter().filter(|t| in_scope(policy, t)) {
        offer(
            &mut menu,
            MenuEntry {
                name: tool.to_string(),
                server: None,
                tool: tool.to_string(),
            },
        );
    }
    for server in servers {
        for (tool, pin) in &server.tools {
            let name = match namespaced(&server.server, &tool.name) {
                Ok(name) => name,
                Err(reason) => {
                    menu.dropped.push(Dropped {
                        name: format!("{}_{}", server.server, tool.name),
                        reason: reason.to_string(),
                    });
                    continue;
                }
            };
            if !in_scope(policy, &name) {
                continue;
            }
            if taken.contains(&name) {
                menu.dropped.push(Dropped {
                    name,
                    reason: "collision: the name is already in the menu".into(),
                });
                continue;
            }
            taken.push(name.clone());
            if let PinState::Quarantined(why) = pin {
                menu.dropped.push(Dropped {
                    name,
                    reason: format!("quarantined: {why}"),
                });
                continue;
            }
            offer(
                &mut menu,
                MenuEntry {
                    name,
                    server: Some(server.server.clone()),
                    tool: tool.name.clone(),
                },
            );
        }
    }
    menu
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_policy::{LoadOptions, load_str};

    fn policy(tools: &str, cap: u32) -> Policy {
        let text = format!(
            "version = 1\nextends = \"worker\"\n[mcp]\ntool_cap = {cap}\n[tools]\n{tools}\n"
        );
        load_str(
            std::path::Path::new("p.toml"),
            &text,
            &LoadOptions::default(),
        )
        .unwrap()
        .policy
    }

    fn tool(name: &str) -> (UpstreamTool, PinState) {
        (
            UpstreamTool {
                name: name.into(),
                description: String::new(),
                input_schema: Value::Null,
                annotations: Value::Null,
                ..UpstreamTool::default()
            },
            PinState::Approved,
        )
    }

    fn entry(name: &str, server: Option<&str>, tool: &str) -> MenuEntry {
        MenuEntry {
            name: name.into(),
            server: server.map(String::from),
            tool: tool.into(),
        }
    }

    #[test]
    fn builtins_first_then_servers_in_order_scoped_and_capped() {
        let mut quarantined = tool("shifty");
        quarantined.1 = PinState::Quarantined("definition changed".into());
        let servers = [
            ServerTools {
                server: "fs".into(),
                tools: vec![tool("read"), tool("write"), tool("bad name"), quarantined],
            },
            ServerTools {
                server: "git".into(),
                tools: vec![tool("log"), tool("status"), tool("diff")],
            },
            ServerTools {
                // `send_message` would not collide (it is namespaced), but a
                // server named like a built-in's prefix can: `check_inbox`.
                server: "check".into(),
                tools: vec![tool("inbox")],
            },
        ];
        let p = policy(
            r#"allow = ["send_message", "check_inbox", "fs_*", "git_*", "check_*"]
deny = ["fs_write"]"#,
            6,
        );
        let menu = build(&p, &servers);
        assert_eq!(
            menu,
            Menu {
                entries: vec![
                    entry("send_message", None, "send_message"),
                    entry("check_inbox", None, "check_inbox"),
                    entry("fs_read", Some("fs"), "read"),
                    entry("git_log", Some("git"), "log"),
                    entry("git_status", Some("git"), "status"),
                    entry("git_diff", Some("git"), "diff"),
                ],
                dropped: vec![
                    Dropped {
                        name: "fs_bad name".into(),
                        reason: "invalid_name: not letters, digits, `_`, `-`, `.`".into()
                    },
                    Dropped {
                        name: "fs_shifty".into(),
                        reason: "quarantined: definition changed".into()
                    },
                    Dropped {
                        name: "check_inbox".into(),
                        reason: "collision: the name is already in the menu".into()
                    },
                ],
            }
        );
        let capped = build(&policy(r#"allow = ["*"]"#, 7), &servers);
        assert_eq!(capped.entries.len(), 7);
        assert_eq!(
            capped.entries.last().map(|e| e.name.as_str()),
            Some("fs_write")
        );
        assert!(
            capped
                .dropped
                .iter()
                .any(|d| d.name == "git_diff" && d.reason.starts_with("cap"))
        );
    }

    #[test]
    fn names_stay_within_the_rules() {
        assert_eq!(namespaced("fs", "read_file").unwrap(), "fs_read_file");
        assert!(namespaced("fs", "").is_err());
        assert!(namespaced("fs", "a/b").is_err());
        assert!(namespaced("server", &"x".repeat(54)).is_err());
        assert_eq!(namespaced("server", &"x".repeat(53)).unwrap().len(), 60);
    }
}
