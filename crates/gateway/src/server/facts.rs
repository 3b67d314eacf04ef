//! What the gateway decides from a request's body once it has come: the
//! facts read from it, and the most it may use or why it is refused.

use http::StatusCode;

use super::{Checked, Gateway, MAX_INPUT, MAX_OUTPUT, OUTPUT_RESERVE, Refused, refuser};
use crate::api::{Api, Call};
use crate::body::{BodyError, Spooled};
use crate::request::{self, RequestFacts};

impl Gateway {
    /// The tokens the request may use at most, or why it is refused: a
    /// provider-side tool the role does not allow (or one not known), more
    /// output asked for than the role's cap.
    pub(super) fn worst_case(
        &self,
        agent: &str,
        checked: &Checked<'_>,
        facts: &RequestFacts,
        spooled: &Spooled,
    ) -> Result<u64, Refused> {
        let access = &checked.entry.access;
        let refused = refuser(access.api);
        if let Some(reason) = model_refusal(access.models.as_deref(), checked, facts) {
            self.count_model_refusal(agent);
            return Err(Refused {
                kind: crate::problems::ErrorKind::Model,
                ..refused(StatusCode::FORBIDDEN, reason)
            });
        }
        if facts.unreadable_count {
            let reason = "the request's output limit is not a count of tokens".to_string();
            return Err(refused(StatusCode::BAD_REQUEST, reason));
        }
        if !facts.unbounded.is_empty() {
            let fields: Vec<&str> = facts.unbounded.iter().copied().collect();
            let reason = format!(
                "not forwarded: {} (the provider would use more than the request holds, \
                 or answer without saying what it used)",
                fields.join(", ")
            );
            return Err(refused(StatusCode::FORBIDDEN, reason));
        }
        if let Some(kind) = facts.unknown_tools.iter().next() {
            let reason = format!(
                "the tool kind {kind:?} is not one the gateway knows to run on the client; \
                 it may run on the provider's side and is refused"
            );
            return Err(refused(StatusCode::FORBIDDEN, reason));
        }
        let denied: Vec<&str> = facts
            .hosted
            .difference(&access.hosted_tools)
            .map(|t| t.as_str())
            .collect();
        if !denied.is_empty() {
            let reason = format!(
                "provider-side tools are off for this agent's role: {} (a role allows them \
                 with model.hosted_tools)",
                denied.join(", ")
            );
            return Err(refused(StatusCode::FORBIDDEN, reason));
        }
        let cap = access.budget.tokens_per_request.unwrap_or(MAX_OUTPUT);
        if let Some(asked) = facts.max_output_tokens
            && asked > cap
        {
            let reason = format!(
                "the request asks for up to {asked} output tokens; at most {cap} a request \
                 are allowed (the role's model.tokens_per_request, at most {MAX_OUTPUT})"
            );
            return Err(refused(StatusCode::BAD_REQUEST, reason));
        }
        if checked.route.call == Call::CountTokens {
            return Ok(0);
        }
        // A request that names no limit gets the provider's default, which
        // may be more than the role's cap: the most any model answers.
        let output = facts.max_output_tokens.unwrap_or(OUTPUT_RESERVE);
        // No more input tokens than bytes of input, nor than any context.
        Ok(spooled.len().min(MAX_INPUT).saturating_add(output))
    }
}

/// Why the request's models are not the agent's to use: every model
/// named (the path's, each copy in the body) must be a model name (the
/// rule `spawn_agent` applies); with the role's `model.models`, each must
/// be within them, and at least one must be named.
fn model_refusal(
    allowed: Option<&[String]>,
    checked: &Checked<'_>,
    facts: &RequestFacts,
) -> Option<String> {
    let not_a_name = checked
        .route
        .model
        .iter()
        .chain(facts.models.iter())
        .find_map(|m| substrat_policy::model::model_name_problem(m).map(|why| (m, why)));
    if let Some((name, why)) = not_a_name {
        let shown: String = name.escape_debug().take(120).collect();
        return Some(format!("the model \"{shown}\" is refused: {why}"));
    }
    let shown = |patterns: &[String]| {
        let list: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
        list.join(", ")
    };
    if facts.unreadable_model {
        let allows = allowed
            .map(|p| format!("; this agent's role allows the models {}", shown(p)))
            .unwrap_or_default();
        return Some(format!(
            "the request's model is not a name the gateway reads (one string of at most {} \
             characters, at most {} distinct){allows}",
            substrat_policy::model::MAX_MODEL_NAME,
            request::MAX_MODELS,
        ));
    }
    let patterns = allowed?;
    let shown = || shown(patterns);
    let mut named = checked
        .route
        .model
        .iter()
        .chain(facts.models.iter())
        .peekable();
    if named.peek().is_none() {
        return Some(format!(
            "the request names no model; this agent's role allows the models {}",
            shown()
        ));
    }
    let outside = named.find(|m| !substrat_policy::model::model_matches(patterns, m))?;
    Some(format!(
        "the model {outside:?} is not allowed for this agent's role (model.models: {})",
        shown()
    ))
}

pub(super) fn body_status(error: &BodyError) -> StatusCode {
    match error {
        BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        BodyError::Stalled(_) | BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
        BodyError::Cut(_) => StatusCode::BAD_REQUEST,
        BodyError::Spool { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The body read, off the runtime's threads (it can be 32 MiB).
pub(super) async fn read_facts(api: Api, spooled: &Spooled) -> Result<RequestFacts, Refused> {
    let refused = refuser(api);
    let reader = spooled.reader().map_err(|e| {
        refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the spooled body: {e}"),
        )
    })?;
    tokio::task::spawn_blocking(move || request::skim(api, reader))
        .await
        .map_err(|e| refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))
}
