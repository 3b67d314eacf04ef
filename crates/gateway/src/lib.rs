#![forbid(unsafe_code)]
//! The model gateway: agents' CLIs reach their model APIs only through it.
//! Each agent gets a placeholder key and its own Unix socket (bound into
//! its sandbox, bridged to a loopback port there); the gateway checks the
//! placeholder, swaps in the real key it holds, enforces the budgets,
//! forwards to the configured upstream over TLS, streams the answer back
//! and records the tokens it used. The real keys never enter a sandbox.
//!
//! The modules, in the order a request goes through them:
//! - `server`: the per-agent socket and the HTTP service;
//! - `api`: which API a path is, where its key is, its error shape;
//! - `ledger`: the budgets' counters (per minute, at once, turn, day;
//!   agent, team) and each request's reservation;
//! - `body`: the request's body spooled to a file, bounded in size and time;
//! - `request`: what the body asks for (output tokens, provider-side tools);
//! - `usage`: tokens read from the answer as it streams through;
//! - `problems`: each agent's last failed requests, budget refusals counted;
//! - `config`: the upstreams with their keys, budgets.

pub mod api;
pub mod body;
pub mod config;
pub mod ledger;
pub mod problems;
pub mod request;
pub mod server;
pub mod usage;

pub use api::Api;
pub use config::{Budget, GatewayConfig, Secret, Upstream, UpstreamError};
pub use ledger::{Refusal, Scope};
pub use problems::{ErrorKind, ModelError};
pub use server::{Gateway, GatewayError, ModelAccess, TeamMeter, UsageSink};
pub use usage::Usage;
