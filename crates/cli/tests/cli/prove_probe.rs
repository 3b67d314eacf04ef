//! `check --prove` judges only with a probe of its own build: a probe that
//! speaks another battery (an old static copy, a probe named in
//! `SUBSTRAT_PROBE`) is refused or passed over with a message, never run.

use super::*;

/// A probe of another build: it names another battery, and if it were
/// ever run it would report every attack held (the lie a stale battery
/// tells: its old answers read by the new table).
const STALE: &str = r#"#!/bin/sh
case "$1" in
battery-version) echo "substrat-battery 0123456789abcdef" ;;
battery) echo '{"attack":"read-outside","outcome":"errno:ENOENT"}'; echo '{"done":true}' ;;
esac
"#;

/// A probe from before probes named their battery.
const ANCIENT: &str = "#!/bin/sh\necho \"OUTCOME value:unknown probe $1\"\n";

fn script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
fn a_probe_named_in_substrat_probe_that_speaks_another_battery_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, says) in [
        ("stale", STALE, "it speaks battery 0123456789abcdef"),
        ("ancient", ANCIENT, "no battery version"),
    ] {
        let probe = dir.path().join(name);
        script(&probe, text);
        let out = substrat_command(&["check", "--prove", "--format", "json", "worker"])
            .env("SUBSTRAT_PROBE", &probe)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{name}: {stderr}");
        assert!(
            stderr.contains("refusing to prove with"),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert!(stderr.contains("nothing was judged"), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: a report was printed");
    }
}

/// The installed layout (the probes beside the program): a stale
/// `substrat-probe-static` is passed over for the `substrat-probe` beside
/// it, saying so; with only stale probes nothing is judged.
#[test]
fn a_stale_static_probe_beside_the_program_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("substrat-sandbox");
    std::fs::copy(bin(), &exe).unwrap();
    let static_probe = dir.path().join("substrat-probe-static");
    script(&static_probe, STALE);
    let prove = || {
        output_of_copied(
            Command::new(&exe)
                .args([
                    "check",
                    "--prove",
                    "--backend",
                    "native",
                    "--format",
                    "json",
                ])
                .arg("worker")
                .current_dir(repo())
                .env_remove("SUBSTRAT_PROBE")
                .env_remove("SUBSTRAT_POLICY_DIR")
                .env_remove("SUBSTRAT_SECCOMP_DIR"),
        )
    };
    // Only the stale probe: refused.
    let out = prove();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("refusing to prove"), "{stderr}");
    assert!(
        stderr.contains("rebuild it with scripts/static-probe"),
        "{stderr}"
    );
    // With the current probe beside it: that one is used, and said so.
    std::fs::copy(current_probe(), dir.path().join("substrat-probe")).unwrap();
    let out = prove();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "using {}: {} passed over: it speaks battery 0123456789abcdef",
            dir.path().join("substrat-probe").display(),
            static_probe.display()
        )),
        "{stderr}"
    );
    let report = stdout_json(&out);
    let proof = &report["policies"][0]["proofs"][0];
    assert_eq!(proof["status"], "ran", "{proof}");
    let held = proof["attacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["verdict"] == "held")
        .count();
    // The stale probe would have reported one attack; the current one all.
    assert!(held >= 33, "{proof}");
}
