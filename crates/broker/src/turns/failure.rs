//! Why a turn failed, as one enum the turn's record (`notes.failure`),
//! `agent inspect`, the live view and the metrics (`substrat_turns_total`'s
//! `reason` label) all use, and what the operator is shown with it: the
//! CLI's own errors and retries, the gateway's failed model requests of
//! the turn, the last events before a timeout.

use serde::Serialize;
use serde_json::{Value, json};
use substrat_gateway::{ErrorKind, ModelError};
use substrat_provider::{Transcript, TurnEnd};

use super::Ended;

/// Why a turn failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// The CLI's result said it failed.
    CliError,
    /// The CLI failed, and its model requests failed upstream (an error
    /// status, or the upstream out of reach).
    UpstreamError,
    /// The CLI failed, and a model budget refused its requests.
    ModelBudget,
    /// The CLI failed, and the role's model allowance refused its
    /// requests (a model outside `model.models`).
    ModelRefused,
    /// It ran longer than the daemon's turn timeout.
    Timeout,
    /// The CLI ended well but its answer could not be read (a line over
    /// the limit, malformed).
    UnreadableAnswer,
    /// The CLI ended without a result (it crashed, or was killed).
    NoResult,
    /// The turn's sandbox could not be made or started.
    LaunchFailed,
    /// The warm sandbox serving it went away.
    SandboxLost,
    /// The operator killed the agent.
    Killed,
}

impl FailReason {
    pub const ALL: [FailReason; 10] = [
        FailReason::CliError,
        FailReason::UpstreamError,
        FailReason::ModelBudget,
        FailReason::ModelRefused,
        FailReason::Timeout,
        FailReason::UnreadableAnswer,
        FailReason::NoResult,
        FailReason::LaunchFailed,
        FailReason::SandboxLost,
        FailReason::Killed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::CliError => "cli_error",
            FailReason::UpstreamError => "upstream_error",
            FailReason::ModelBudget => "model_budget",
            FailReason::ModelRefused => "model_refused",
            FailReason::Timeout => "timeout",
            FailReason::UnreadableAnswer => "unreadable_answer",
            FailReason::NoResult => "no_result",
            FailReason::LaunchFailed => "launch_failed",
            FailReason::SandboxLost => "sandbox_lost",
            FailReason::Killed => "killed",
        }
    }
}

/// A failed turn: why, in words and as a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: FailReason,
    pub message: String,
}

impl Failure {
    pub fn new(reason: FailReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// A failure of the CLI blamed on its model requests when the gateway
    /// saw them fail: a budget's refusal first, then the upstream.
    pub fn with_model_errors(self, errors: &[ModelError]) -> Self {
        if !matches!(self.reason, FailReason::CliError | FailReason::NoResult) {
            return self;
        }
        let any = |kinds: &[ErrorKind]| errors.iter().any(|e| kinds.contains(&e.kind));
        let reason = if any(&[ErrorKind::Model]) {
            FailReason::ModelRefused
        } else if any(&[ErrorKind::Budget]) {
            FailReason::ModelBudget
        } else if any(&[ErrorKind::Upstream, ErrorKind::Unreachable]) {
            FailReason::UpstreamError
        } else {
            self.reason
        };
        Self { reason, ..self }
    }

    /// What the turn's record keeps of it (`notes.failure`): the reason,
    /// the CLI's errors and retries, the gateway's failed requests, and
    /// the last events the CLI wrote.
    pub fn record(&self, transcript: &Transcript, errors: &[ModelError]) -> Value {
        json!({
            "reason": self.reason,
            "cli_errors": transcript.problems,
            "cli_errors_total": transcript.problems_total,
            "model_errors": errors,
            "last_events": transcript.last_events,
        })
    }
}

/// How the turn ended: the result event decides; without one, the exit
/// status and the end of stderr say why. An answer that could not be read
/// from a CLI that exited well fails the turn as unreadable (never done
/// with an empty result); from one that did not, it is a crash.
pub(super) fn ending(transcript: &Transcript, code: &str, stderr: &str) -> Ended {
    let stderr = if stderr.is_empty() {
        String::new()
    } else {
        format!("; stderr: {stderr}")
    };
    let unreadable = || {
        let why = transcript
            .last_events
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix("unreadable line "))
            .unwrap_or("(malformed)");
        format!("its answer could not be read: a line {why}")
    };
    let failure = match transcript.end() {
        TurnEnd::Success { text } => return Ended::Answer(text),
        TurnEnd::Error { message } => Failure::new(
            FailReason::CliError,
            format!("the agent reported an error: {message}"),
        ),
        TurnEnd::Unreadable if code == "0" => {
            Failure::new(FailReason::UnreadableAnswer, unreadable())
        }
        TurnEnd::Unreadable => Failure::new(
            FailReason::NoResult,
            format!(
                "the turn ended without a result (exit status {code}); {}{stderr}",
                unreadable()
            ),
        ),
        TurnEnd::NoResult => Failure::new(
            FailReason::NoResult,
            format!("the turn ended without a result (exit status {code}){stderr}"),
        ),
    };
    Ended::Failed(failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: ErrorKind, status: u16) -> ModelError {
        ModelError {
            kind,
            status,
            reason: "r".into(),
        }
    }

    #[test]
    fn a_cli_failure_is_blamed_on_its_model_requests_budget_first() {
        let cli = || Failure::new(FailReason::CliError, "the agent reported an error: x");
        let upstream = [error(ErrorKind::Upstream, 500)];
        assert_eq!(
            cli().with_model_errors(&upstream).reason,
            FailReason::UpstreamError
        );
        let both = [
            error(ErrorKind::Upstream, 500),
            error(ErrorKind::Budget, 429),
        ];
        assert_eq!(
            cli().with_model_errors(&both).reason,
            FailReason::ModelBudget
        );
        // The gateway's own refusals (a wrong path) are the CLI's doing.
        let refused = [error(ErrorKind::Refused, 404)];
        assert_eq!(
            cli().with_model_errors(&refused).reason,
            FailReason::CliError
        );
        // The role's model allowance: its own reason, before the rest.
        let model = [error(ErrorKind::Budget, 429), error(ErrorKind::Model, 403)];
        assert_eq!(
            cli().with_model_errors(&model).reason,
            FailReason::ModelRefused
        );
        // A timeout stays a timeout, whatever the model did.
        let timeout = Failure::new(FailReason::Timeout, "timed out after 1 s");
        assert_eq!(timeout.with_model_errors(&both).reason, FailReason::Timeout);
    }

    #[test]
    fn an_unreadable_answer_is_told_from_a_crash_by_the_exit_status() {
        let mut t = Transcript::default();
        let cut = r#"{"type":"result","subtype":"success","is_error":false,"result":"cu"#;
        t.push(substrat_provider::events::parse_line(cut));
        let failure = |code| match ending(&t, code, "") {
            Ended::Failed(f) => f,
            Ended::Answer(text) => panic!("an answer: {text:?}"),
        };
        let unreadable = failure("0");
        assert_eq!(unreadable.reason, FailReason::UnreadableAnswer);
        assert!(
            unreadable
                .message
                .starts_with("its answer could not be read: a line (EOF while parsing"),
            "{unreadable:?}"
        );
        assert_eq!(failure("3").reason, FailReason::NoResult);
        assert_eq!(failure("killed").reason, FailReason::NoResult);
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: std::collections::HashSet<&str> =
            FailReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), FailReason::ALL.len());
        for reason in FailReason::ALL {
            assert_eq!(json!(reason), json!(reason.as_str()));
        }
    }
}
