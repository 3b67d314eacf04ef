//! The one entry for a launch: the backend chosen once (for `run`,
//! `substrat-run` and so the daemon's turns), then the plan applied by it.
//! `auto` takes the native backend where this user can create a user
//! namespace (its first step, before anything is changed) and bwrap where
//! it cannot; `check --host` predicts the same choice from its probes.

use crate::bwrap::BwrapFeatures;
use crate::plan::LaunchPlan;
use crate::supervise::{LaunchError, RunOptions, RunOutcome};

/// Which backend a launch asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Native,
    Bwrap,
}

impl BackendChoice {
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Native => "native",
            BackendChoice::Bwrap => "bwrap",
        }
    }
}

/// Runs `plan` with the backend `choice` names, and says why that one.
pub fn launch(
    plan: &LaunchPlan,
    options: &RunOptions,
    choice: BackendChoice,
) -> Result<(RunOutcome, String), LaunchError> {
    if options.turns.is_some() && !plan.namespaces.pid {
        return Err(LaunchError::Setup(TURNS_NEED_PID_NS.into()));
    }
    // Without a pid namespace the command's processes can outlive the
    // launch, still as the subordinate id the next launch is given.
    if options.host_ids.subordinate().is_some() && !plan.namespaces.pid {
        return Err(LaunchError::Setup(
            "a policy without a pid namespace (`namespaces.pid = false`) cannot be launched by \
             root: its processes could outlive the launch, still as the subordinate id the next \
             launch is given. Keep the pid namespace, or launch as an unprivileged user"
                .into(),
        ));
    }
    match choice {
        BackendChoice::Native => Ok((
            crate::native::run(plan, options)?,
            "requested: native".into(),
        )),
        BackendChoice::Bwrap => Ok((run_bwrap(plan, options)?, "requested: bwrap".into())),
        BackendChoice::Auto => match crate::native::run(plan, options) {
            Ok(outcome) => Ok((
                outcome,
                "auto: user namespaces are available to the native backend".into(),
            )),
            Err(LaunchError::UsernsUnavailable(why)) => {
                let outcome = run_bwrap(plan, options).map_err(|e| {
                    LaunchError::Setup(format!("native backend: {why}; bwrap backend: {e}"))
                })?;
                Ok((
                    outcome,
                    format!("auto: native backend unavailable ({why}); used bwrap"),
                ))
            }
            Err(err) => Err(err),
        },
    }
}

/// Why the bwrap backend refuses a workspace layer: bubblewrap mounts
/// what its command line names, and Debian 12's 0.8 has no overlay option
/// (0.9 added `--overlay`); mounting one ourselves around bwrap would need
/// the user namespace whose absence is why bwrap was chosen.
pub const BWRAP_NO_OVERLAY: &str = "the bwrap backend cannot show the workspace through a layer \
     (workspace mode `overlay`): bubblewrap 0.8 has no overlay mount, and an overlay needs the user \
     namespace the native backend uses. Use the native backend (`--backend native`), or workspace \
     mode `direct`";

/// A warm sandbox ends each turn's processes with kill(-1) from its init:
/// only inside a pid namespace of its own is that the sandbox alone.
pub const TURNS_NEED_PID_NS: &str = "a sandbox serving turns needs a pid namespace of its own (`namespaces.pid = true`): \
     each turn ends by killing every process of it";

fn run_bwrap(plan: &LaunchPlan, options: &RunOptions) -> Result<RunOutcome, LaunchError> {
    if plan.overlay.is_some() {
        return Err(LaunchError::Setup(BWRAP_NO_OVERLAY.into()));
    }

    let bwrap = crate::host::bwrap_path().ok_or_else(|| {
        LaunchError::Setup(
            "the bwrap backend needs bubblewrap on PATH (Debian: apt-get install bubblewrap)"
                .into(),
        )
    })?;
    crate::bwrap::run(
        plan,
        options,
        &bwrap,
        BwrapFeatures {
            disable_userns: true,
        },
    )
}
