#![forbid(unsafe_code)]
//! The broker: the agents' only way out of their sandboxes. It serves each
//! agent's MCP tools on that agent's own socket, decides every call against
//! the agent's policy and team, and keeps durable state in SQLite.

pub mod audit;
pub mod broker;
pub mod control;
pub mod daemon;
pub mod gate;
pub mod limits;
mod locks;
pub mod server;
pub mod store;
pub mod strict_json;
pub mod tools;
pub mod turns;
pub mod upstream;

pub use broker::{Broker, BrokerError, CreateError, NewAgent, Roles, Session, ToolOutcome};
