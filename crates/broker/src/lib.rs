#![forbid(unsafe_code)]
//! The broker: the agents' only way out of their sandboxes. It serves each
//! agent's MCP tools on that agent's own socket, decides every call against
//! the agent's policy and team, and keeps durable state in SQLite.
//!
//! The modules, in the order a call goes through them:
//! - `daemon`: the sockets (one per agent, the control socket), the state
//!   directory's lock, start and shutdown; `server`: one agent's MCP
//!   session on its socket; `strict_json`: the requests' JSON, refused
//!   when ambiguous.
//! - `broker`: the decisions (the call path, the team's tools and rules,
//!   upstream tools, the operator's requests, turns in flight); `gate`: a
//!   call checked against the policy's limits; `limits`: rate buckets and
//!   output truncation; `tools`: the built-in tools' schemas.
//! - `upstream`: third-party MCP servers (configuration, the menus, pins,
//!   their state, a call to one); `upstream_supervisor`: each server run in
//!   its sandbox, restarted, its tools listed; `turns`: agents' turns run
//!   through the launcher and a provider; `carried`: the text a turn's
//!   launch cannot carry, refused where it is given; `control`: the operator's
//!   requests; `roles`: what a role resolves to (a policy's persona, a Lua
//!   script, a compiled `Role`); `role_http`: the roles' HTTP endpoints.
//! - `secret_env`: the daemon's secrets by variable name, removed from
//!   every launch's environment.
//! - `sockets`: the daemon's Unix sockets, bound owner-only; `tls`: the
//!   daemon's certificate authority; `tls_listen`: its listener for relays
//!   on other hosts (mutual TLS, an agent per certificate).
//! - `store`: durable state (SQLite), one module per table family;
//!   `audit`: the audit log; `metrics`: the daemon's metrics (`GET
//!   /metrics`); `locks`: locks that survive a panic.

pub mod agent_http;
pub mod agent_http_events;
mod agent_http_sessions;
mod agent_http_speaks;
pub mod audit;
pub mod broker;
pub mod carried;
pub mod control;
mod control_oauth;
pub mod daemon;
pub mod gate;
pub mod limits;
mod locks;
pub mod metrics;
pub mod output_budget;
pub mod placement;
pub mod role_http;
pub mod roles;
pub mod seat;
pub mod secret_env;
pub mod server;
pub mod sockets;
pub mod store;
pub mod strict_json;
pub mod team_ca;
pub mod team_key;
pub mod tls;
pub mod tls_listen;
pub mod tools;
pub mod turns;
pub mod upstream;
pub mod upstream_supervisor;

pub use broker::{Broker, BrokerError, CreateError, NewAgent, Roles, Session, ToolOutcome};
