#![forbid(unsafe_code)]
//! One source for what the probe (crates/probe) runs and the prover
//! (`check --prove`, crates/cli) judges: the attack table, the list of
//! what lasts between warm turns, and their digest.
//!
//! The probe answers `substrat-probe battery-version` with
//! [`version_line`]; the prover runs a probe only when that line is its
//! own. The digest covers the tables (ids, rules, refusal errnos, kinds
//! and what the docs say of them) and the probe's source files as this
//! crate was built (build.rs), so a probe built from other source (a
//! static copy left from an older build) is never taken for this one.

mod attacks;
mod lasts;

pub use attacks::{ATTACKS, AttackInfo};
pub use lasts::{LASTS, Lasting};

/// The probe command that prints [`version_line`].
pub const VERSION_COMMAND: &str = "battery-version";

/// What a probe of this build answers to [`VERSION_COMMAND`].
pub fn version_line() -> String {
    format!("substrat-battery {:016x}", digest())
}

/// The battery's digest: the tables and the probe's source.
pub fn digest() -> u64 {
    let mut hash = Fnv::new();
    for a in ATTACKS {
        hash.text(a.id);
        hash.text(a.rule);
        for errno in a.refused {
            hash.text(errno);
        }
        hash.text(";");
    }
    for l in LASTS {
        hash.text(l.kind);
        for backend in l.lasts_warm_on {
            hash.text(backend);
        }
        hash.text(";");
    }
    hash.text(env!("SUBSTRAT_PROBE_SOURCE"));
    hash.0
}

/// FNV-1a, 64 bits: enough to tell two builds apart (no adversary here:
/// the probe is the prover's own program).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn text(&mut self, text: &str) {
        for byte in text.bytes().chain([0]) {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_digest() {
        let line = version_line();
        assert_eq!(line, format!("substrat-battery {:016x}", digest()));
        assert_eq!(line.len(), "substrat-battery ".len() + 16);
    }

    #[test]
    fn every_id_and_kind_is_named_once() {
        let mut ids: Vec<&str> = ATTACKS.iter().map(|a| a.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), ATTACKS.len());
        let mut kinds: Vec<&str> = LASTS.iter().map(|l| l.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), LASTS.len());
    }
}
