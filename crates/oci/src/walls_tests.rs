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

/// podman's default list: the plan is the one of a configuration asking
/// none (the container gets no capability), and the notes say so. A
/// `--cap-add SYS_ADMIN` on top (a pod's `capabilities.add`), in any set,
/// is refused naming the capability: it was quietly dropped.
#[test]
fn default_capabilities_widen_nothing_and_added_ones_are_refused_by_name() {
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
    let defaults = translated(&asked).expect("translates");
    let none = translated(&none).expect("translates");
    assert_eq!(defaults.plan, none.plan);
    assert!(
        defaults
            .notes
            .contains(&"process.capabilities: the container gets none".to_string())
    );
    for set in [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ] {
        for added in ["CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_BPF"] {
            let mut config = asked.clone();
            let list = config["process"]["capabilities"][set]
                .as_array_mut()
                .expect("set");
            list.push(serde_json::json!(added));
            let refused = translated(&config).expect_err(&format!("{added} in {set} ran"));
            assert_eq!(refused.field, format!("process.capabilities.{set}"));
            assert!(
                refused.reason.starts_with(&format!("{added} is added")),
                "{}",
                refused.reason
            );
        }
    }
}

/// A privileged container as containerd writes it with
/// `privileged_without_host_devices = true` (no `linux.devices`): every
/// capability the engine holds and no masked or read-only path. It was quietly reduced to
/// an ordinary container; now it is refused by name. One capability less,
/// or one masked path, and it is an ordinary container again.
#[test]
fn a_privileged_container_without_host_devices_is_refused_by_name() {
    // What containerd lists: its own capabilities, 40 here (without
    // CAP_SYS_RESOURCE, which this machine's engine does not hold).
    let all: Vec<String> = (0..41)
        .filter(|n| *n != 24)
        .map(|n| match n {
            21 => "CAP_SYS_ADMIN".to_string(),
            n => format!("CAP_{n}"),
        })
        .collect();
    let caps = serde_json::json!({"bounding": all, "effective": all, "permitted": all});
    let privileged = |masked: bool, caps: &serde_json::Value| {
        let mut config = engine_config();
        config["process"]["capabilities"] = caps.clone();
        let linux = config["linux"].as_object_mut().expect("linux");
        if !masked {
            linux.insert("maskedPaths".into(), serde_json::json!([]));
            linux.insert("readonlyPaths".into(), serde_json::json!([]));
        }
        translated(&config)
    };
    let refused = privileged(false, &caps).expect_err("a privileged container ran");
    assert_eq!(refused.field, "process.capabilities");
    assert!(
        refused.reason.contains("a privileged container"),
        "{}",
        refused.reason
    );
    // With masked paths, or without CAP_SYS_ADMIN, it is not privileged:
    // refused for the capabilities it adds, by name.
    let fewer: Vec<&String> = all.iter().filter(|c| *c != "CAP_SYS_ADMIN").collect();
    let fewer = serde_json::json!({"bounding": fewer});
    for (masked, caps) in [(true, &caps), (false, &fewer)] {
        let refused = privileged(masked, caps).expect_err("added capabilities ran");
        assert_eq!(refused.field, "process.capabilities.bounding");
        assert!(refused.reason.contains(" is added"), "{}", refused.reason);
    }
    // A hand-written bundle asking CAP_SYS_ADMIN alone, no masked path.
    let admin = serde_json::json!({"bounding": ["CAP_SYS_ADMIN"]});
    let refused = privileged(false, &admin).expect_err("CAP_SYS_ADMIN alone ran");
    assert!(
        refused.reason.starts_with("CAP_SYS_ADMIN is added"),
        "{}",
        refused.reason
    );
}
