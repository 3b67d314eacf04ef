//! The walls an engine's own defaults cannot lower: its seccomp profile
//! never the only filter, the capabilities it asks giving nothing.

use crate::tests::{engine_config, translated};

/// An engine's profile (podman's allows what the default denies) is never
/// the only filter: the default one is loaded after it, alone in its
/// layer, and no Landlock ruleset comes with it.
#[test]
fn an_engines_profile_gets_the_default_one_stacked_on_it() {
    let t = translated(&engine_config()).expect("translates");
    assert_eq!(
        t.plan.seccomp.as_ref().map(|s| s.name.as_str()),
        Some("config.json")
    );
    let names: Vec<&str> = t.plan.seccomp_filters().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["config.json", "default"]);
    let layer = &t.plan.layers[0];
    assert_eq!(
        layer.landlock.mode,
        substrat_policy::model::LandlockMode::Off
    );
    assert!(t.plan.seccomp_spec_allow(), "both ask SPEC_ALLOW");
}

/// podman's default list and a `--cap-add SYS_ADMIN` on top: the plan is
/// the one of a configuration asking none (the container gets no
/// capability), and the notes say so.
#[test]
fn capabilities_asked_widen_nothing() {
    let podman = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SETFCAP",
        "CAP_SETGID",
        "CAP_SETPCAP",
        "CAP_SETUID",
        "CAP_SYS_CHROOT",
        "CAP_SYS_ADMIN",
    ];
    let mut asked = engine_config();
    asked["process"]["capabilities"] = serde_json::json!({
        "bounding": podman, "effective": podman, "permitted": podman,
        "inheritable": podman, "ambient": podman,
    });
    let mut none = engine_config();
    if let Some(process) = none["process"].as_object_mut() {
        process.remove("capabilities");
    }
    let asked = translated(&asked).expect("translates");
    let none = translated(&none).expect("translates");
    assert_eq!(asked.plan, none.plan);
    assert!(
        asked
            .notes
            .contains(&"process.capabilities: the container gets none".to_string())
    );
}
