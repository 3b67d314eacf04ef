//! Upstream MCP servers behind the broker (seed 003's one menu): their
//! configuration, the menu each role sees, pinning, and the clients that
//! run each server in its own sandbox.

pub mod config;
pub mod error;
pub mod menu;
pub mod pins;
pub mod registry;
