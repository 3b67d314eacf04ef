//! Upstream MCP servers behind the broker (seed 003's one menu): their
//! configuration, the menu each role sees, pinning, and the clients that
//! run each local server in its own sandbox (remote ones are reached over
//! HTTP by the broker).

pub mod config;
pub mod error;
pub mod menu;
pub mod oauth;
pub mod pins;
pub mod registry;
pub mod relay;
pub mod remote;
pub mod sse_events;
