//! The control protocol between the CLI and the daemon: one JSON request
//! per line on the control socket, one JSON response per line.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Create {
        name: String,
        role: String,
        parent: Option<String>,
        workspace: Option<String>,
    },
    List,
    Inspect {
        name: String,
    },
    Send {
        name: String,
        text: String,
    },
    Remove {
        name: String,
    },
}

/// `{"ok": true, ...}` or `{"ok": false, "error": CODE, "message": ...}`.
pub fn ok(mut body: Value) -> Value {
    if let Value::Object(map) = &mut body {
        map.insert("ok".into(), Value::Bool(true));
    }
    body
}

pub fn refused(code: &str, message: impl Into<String>) -> Value {
    serde_json::json!({"ok": false, "error": code, "message": message.into()})
}
