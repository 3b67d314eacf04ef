//! What substrat-sandbox does with the kernel: probing a host, planning a
//! sandbox from a policy (pure), and applying the plan (native backend).
//! All unsafe code of this crate lives in `sys`.

mod bridge;
pub mod bwrap;
pub mod cgroup;
pub mod gitdir;
mod gitfiles;
pub mod gitscan;
pub mod host;
pub mod hostid;
mod inside;
pub mod interp;
pub mod landlock;
pub mod mountpoints;
pub mod mounts;
pub mod native;
pub mod plan;
pub mod report;
pub mod seccomp;
pub mod stage;
pub mod supervise;
mod sys;

pub use host::{ProbeOptions, bwrap_path, find_bwrap, probe_host, userns_probe_child};
pub use native::run;
pub use plan::{
    Access, AgentBind, AgentContext, LaunchPlan, PlanError, build_plan, writable_in_view,
};
pub use supervise::{Backend, LaunchError, RunOptions, RunOutcome, SetupReport};
