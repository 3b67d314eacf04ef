//! An exec's process (`substrat-oci exec`): the engine's `process.json`
//! (or a command line) checked as the container's own process is, and made
//! a request to run in the running sandbox (`substrat_sandbox::join`).

use substrat_sandbox::join::ExecRequest;
use substrat_sandbox::plan::LaunchPlan;

use crate::checks::check_process;
use crate::spec::Process;
use crate::translate::{Unsupported, absolute, environment, refuse};

/// The request for `process` in the container `plan` was made for: the
/// same checks as the container's process, and the same ids (the sandbox
/// maps one uid and one gid). `console` says whether the engine gave a
/// console socket: `process.terminal` must agree with it (as runc).
/// Notes where the runtime differs go to `notes`.
pub fn exec_request(
    process: &Process,
    plan: &LaunchPlan,
    console: bool,
    notes: &mut Vec<String>,
) -> Result<ExecRequest, Unsupported> {
    check_process(process, notes)?;
    match (process.terminal, console) {
        (true, false) => {
            return Err(refuse(
                "process.terminal",
                "a terminal for an exec needs --console-socket (the engine's end of it)",
            ));
        }
        (false, true) => {
            return Err(refuse(
                "process.terminal",
                "false, and --console-socket was given: a console socket is for a terminal",
            ));
        }
        _ => {}
    }
    let ids = (process.user.uid, process.user.gid);
    if ids != (plan.uid_map.inside, plan.gid_map.inside) {
        return Err(refuse(
            "process.user",
            format!(
                "uid {} gid {}: an exec runs as the container's own ids ({} and {}), the only ones mapped",
                ids.0, ids.1, plan.uid_map.inside, plan.gid_map.inside
            ),
        ));
    }
    Ok(ExecRequest {
        argv: process.args.clone(),
        env: environment(&process.env)?,
        cwd: absolute("process.cwd", &process.cwd)?,
        terminal: process.terminal,
    })
}

/// An exec's `process.json` (at most the size of a configuration).
pub fn parse_process(bytes: &[u8]) -> Result<Process, crate::spec::SpecError> {
    if bytes.len() > crate::spec::MAX_CONFIG_BYTES {
        return Err(crate::spec::SpecError::TooLarge(bytes.len()));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|err| crate::spec::SpecError::Invalid {
        path: err.path().to_string(),
        message: err.into_inner().to_string(),
    })
}
