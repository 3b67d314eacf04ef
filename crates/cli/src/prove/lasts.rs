//! `check --prove --warm`: what one turn leaves and the next finds, each
//! kind of substrat_battery::LASTS judged against what the docs say lasts
//! (that table; docs/check.md's is tested against it). Warm, the battery's
//! first turn leaves one of each (`leave=TOKEN`) and its second looks
//! (`look=TOKEN`); cold, a pair of launches does the same
//! (`substrat-probe lasts leave|look TOKEN`), where nothing may last.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use substrat_battery::{LASTS, Lasting};
use substrat_policy::check::proof::{Lasted, LastedPair};

/// A token no other run uses: the names of what is left.
pub fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", std::process::id())
}

/// The probe's `{"KEY":KIND,"outcome":O}` lines of `stdout`, by kind.
pub fn outcomes(stdout: &[u8], key: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
        .filter_map(|v| {
            Some((
                v[key].as_str()?.to_string(),
                v["outcome"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// What each run of a pair said: left by the first, seen by the second.
#[derive(Debug, Default)]
pub struct Pair {
    pub left: BTreeMap<String, String>,
    pub seen: BTreeMap<String, String>,
}

impl Pair {
    pub fn of(first: &[u8], second: &[u8]) -> Self {
        Self {
            left: outcomes(first, "left"),
            seen: outcomes(second, "seen"),
        }
    }
}

/// Every kind, cold beside warm, on `backend`. `binds`: the plan's bind
/// targets (a file place that is a host bind holds the host's files,
/// which last cold as well: not the sandbox's to keep or remove).
pub fn judge(backend: &str, cold: &Pair, warm: &Pair, binds: &[&Path]) -> Vec<Lasted> {
    LASTS
        .iter()
        .map(|l| {
            let bound = bound_place(l.kind).filter(|p| binds.contains(&Path::new(p)));
            let pair = |pair: &Pair, documented: bool| match bound {
                Some(place) => not_applicable(pair, l, place),
                None => judged(pair, l.kind, documented),
            };
            Lasted {
                kind: l.kind.to_string(),
                left_as: l.left_as.to_string(),
                documented: l.warm_text(),
                cold: pair(cold, false),
                warm: pair(warm, l.lasts_warm(backend)),
            }
        })
        .collect()
}

/// The file place a kind is left in, where the plan may bind a host path.
fn bound_place(kind: &str) -> Option<&'static str> {
    match kind {
        "tmp-file" => Some("/tmp"),
        "shm-file" => Some("/dev/shm"),
        _ => None,
    }
}

fn not_applicable(pair: &Pair, l: &Lasting, place: &str) -> LastedPair {
    let mut judged = judged(pair, l.kind, false);
    judged.verdict = format!("not applicable ({place} is a host bind)");
    judged.failed = false;
    judged
}

/// One kind of one pair: `documented` says whether it should last.
pub fn judged(pair: &Pair, kind: &str, documented: bool) -> LastedPair {
    let left = pair.left.get(kind).cloned().unwrap_or_default();
    let seen = pair.seen.get(kind).cloned().unwrap_or_default();
    let (verdict, failed) = verdict(&left, &seen, documented);
    LastedPair {
        verdict,
        failed,
        left,
        seen,
    }
}

fn verdict(left: &str, seen: &str, documented: bool) -> (String, bool) {
    if left.is_empty() || seen.is_empty() {
        return ("error (no answer from the probe)".into(), true);
    }
    if left == "not-tmpfs" {
        return (
            "not applicable (no tmpfs of the sandbox's own)".into(),
            false,
        );
    }
    if let Some(why) = left.strip_prefix("not-attempted:") {
        return (format!("not applicable ({why})"), false);
    }
    if let Some(errno) = left.strip_prefix("errno:") {
        return (format!("not made ({errno})"), false);
    }
    match (left, seen, documented) {
        ("ok", "seen", true) => ("lasts (documented)".into(), false),
        ("ok", "seen", false) => ("lasts (undocumented)".into(), true),
        ("ok", "gone", false) => ("gone (documented)".into(), false),
        ("ok", "gone", true) => ("gone (documented to last)".into(), true),
        _ => (format!("error (left {left}, then {seen})"), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/check.md's table of what lasts is the code's, row for row.
    #[test]
    fn docs_list_what_lasts_as_the_table_says() {
        let docs = include_str!("../../../../docs/check.md");
        let header =
            "| kind | the first turn leaves | between warm turns | between cold launches |";
        let rows: Vec<&str> = docs
            .lines()
            .skip_while(|l| *l != header)
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let want: Vec<String> = LASTS.iter().map(Lasting::docs_row).collect();
        assert_eq!(rows, want, "docs/check.md's table of what lasts");
    }

    #[test]
    fn a_kind_is_judged_by_what_the_docs_say() {
        let cases = [
            ("ok", "seen", true, "lasts (documented)", false),
            ("ok", "seen", false, "lasts (undocumented)", true),
            ("ok", "gone", false, "gone (documented)", false),
            ("ok", "gone", true, "gone (documented to last)", true),
            ("errno:EACCES", "gone", false, "not made (EACCES)", false),
            (
                "not-tmpfs",
                "gone",
                true,
                "not applicable (no tmpfs of the sandbox's own)",
                false,
            ),
            ("ok", "", false, "error (no answer from the probe)", true),
            (
                "ok",
                "errno:EPERM",
                false,
                "error (left ok, then errno:EPERM)",
                true,
            ),
        ];
        for (left, seen, documented, want, failed) in cases {
            let got = verdict(left, seen, documented);
            assert_eq!(
                got,
                (want.to_string(), failed),
                "{left} {seen} {documented}"
            );
        }
    }

    #[test]
    fn a_host_bind_of_tmp_is_not_the_sandbox_s_to_keep() {
        let mut pair = Pair::default();
        for l in LASTS {
            pair.left.insert(l.kind.into(), "ok".into());
            pair.seen.insert(l.kind.into(), "seen".into());
        }
        let judged = judge("native", &pair, &pair, &[Path::new("/tmp")]);
        let tmp = judged.iter().find(|l| l.kind == "tmp-file");
        assert!(tmp.is_some_and(|t| !t.cold.failed && t.cold.verdict.contains("host bind")));
        // Everything else that was seen cold lasted undocumented.
        let sysv = judged.iter().find(|l| l.kind == "sysv-shm");
        assert!(sysv.is_some_and(|s| s.cold.failed && s.warm.failed));
    }
}
