//! What `check --prove` found when it ran a policy's sandbox on this host
//! and attacked it: per backend, each attack held, escaped, not applicable
//! (with why) or an error. Escapes and errors are findings as well (the
//! `PRV` rules); this is the whole record, for the text and JSON outputs.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Proof {
    pub backend: String,
    #[serde(flatten)]
    pub status: ProofStatus,
    pub attacks: Vec<ProvenAttack>,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "kebab-case")]
pub enum ProofStatus {
    /// The battery ran to its end.
    Ran,
    /// The launcher refused to build the sandbox (nothing ran).
    RefusedToLaunch(String),
    /// The battery did not run or did not finish.
    Failed(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct ProvenAttack {
    pub attack: String,
    /// What it tries, in words.
    pub tries: String,
    /// The `PRV` rule an escape of it is a finding of.
    pub rule: String,
    /// `held`, `escaped`, `not-applicable` or `error`.
    pub verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The probe's raw answer (`errno:EPERM`, `ok`, `value:...`).
    pub outcome: String,
}

impl Proof {
    /// How many attacks got `verdict`.
    pub fn count(&self, verdict: &str) -> usize {
        self.attacks.iter().filter(|a| a.verdict == verdict).count()
    }
}
