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
    /// The probe that ran inside (one of this build: `check --prove`
    /// refuses any other).
    pub probe: String,
    /// With `--warm`: what one turn left and the next found, each kind
    /// beside a pair of cold launches' (docs/check.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lasts: Vec<Lasted>,
}

/// One kind of state (a file in /tmp, a System V segment, a process)
/// left by a first turn: what a second finds, cold and warm, against what
/// the docs say lasts.
#[derive(Debug, Clone, Serialize)]
pub struct Lasted {
    pub kind: String,
    /// What the first turn left, in words.
    pub left_as: String,
    /// What the docs say of it between warm turns (`lasts`, `gone`, ...);
    /// between cold launches nothing lasts.
    pub documented: String,
    pub cold: LastedPair,
    pub warm: LastedPair,
}

/// One pair of runs' answer for one kind.
#[derive(Debug, Clone, Serialize)]
pub struct LastedPair {
    /// `lasts (documented)`, `gone (documented)`, `not made (...)`,
    /// `not applicable (...)`, or a failure: `lasts (undocumented)`,
    /// `gone (documented to last)`, `error (...)`.
    pub verdict: String,
    /// The verdict says something the docs do not: a PRV028 finding.
    pub failed: bool,
    /// The probe's raw answers: what the first run left, what the second saw.
    pub left: String,
    pub seen: String,
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
