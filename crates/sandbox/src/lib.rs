//! What substrat-sandbox does with the kernel: planning a sandbox from a
//! policy (pure), applying the plan (native or bwrap backend), probing a
//! host. All unsafe code of this crate lives in `sys`.
//!
//! The modules, in the order a launch goes through them:
//! - `plan`: policy + agent context -> `LaunchPlan` (mounts in order,
//!   Landlock, seccomp, limits, environment); pure. `interp`: whether a
//!   program's interpreter is in the plan's view.
//! - `gitdir`, `gitfiles`, `gitscan`: the workspace's git metadata made the
//!   agent's own, repositories in writable trees found and made inert.
//! - `hostid`: whose host ids the sandbox runs as (never root); `stage`:
//!   the binds as idmapped copies for a launch by root.
//! - `mountpoints`: mount points made in writable binds, and removed.
//! - `cgroupfs`, `cgroup`: the host's hierarchies, the sandbox's groups.
//! - `seccomp`: the filter compiled; `landlock`: the ruleset applied.
//! - `backend`: the one launch entry, choosing the backend once;
//!   `supervise`: what both backends share (options, status pipe, signals,
//!   waiting); `native`: our own namespaces; `bwrap`: the plan through
//!   bubblewrap and its helper; `mounts`, `inside`: the view built and the
//!   process confined inside (`overlay`: the workspace through its layer;
//!   `layer_copy`: a quota's tmpfs upper kept; `devproc`: /dev and /proc); `bridge`: the proxy's loopback port; `turns`: a warm sandbox's turns.
//! - `socket_binds`: a Unix socket as a bind's source refused unless the
//!   policy marks it; `sockets`: the sockets a bind puts in the view.
//! - `report`: the run report; `host`: what this host can enforce
//!   (`check --host`); `sys`: the raw system calls.

pub mod backend;
mod bridge;
pub mod bwrap;
pub mod cgroup;
pub mod cgroupfs;
pub mod console;
mod devproc;
pub mod gitdir;
mod gitfiles;
pub mod gitscan;
pub mod host;
pub mod hostid;
mod inside;
pub mod interp;
pub mod join;
pub mod landlock;
mod layer_copy;
pub mod mount_origin;
pub mod mountpoints;
pub mod mounts;
pub mod native;
mod overlay;
pub use substrat_policy::place;
pub mod bind_judge;
mod joined_ns;
pub mod plan;
pub mod report;
pub mod rootfs;
pub mod seccomp;
mod share;
pub mod socket_binds;
pub mod sockets;
pub mod stage;
pub mod supervise;
mod sys;
pub mod turns;
pub mod unmapped;
pub mod workspace_git;

pub use host::{ProbeOptions, bwrap_path, find_bwrap, probe_host, userns_probe_child};
pub use native::run;
pub use plan::{
    Access, AgentBind, AgentContext, HomeMount, LaunchPlan, PlanError, build_plan, writable_in_view,
};
pub use supervise::{Backend, LaunchError, RunOptions, RunOutcome, SetupReport};
pub use sys::{close_inherited_fds, pipe_signal_default};
