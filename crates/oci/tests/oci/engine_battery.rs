//! The escape battery in a container podman starts with its own defaults
//! (its seccomp profile, its capability list, its bridge network, its
//! mounts), substrat-oci the runtime: every attack ends as under
//! `substrat-run --policy worker`, but those different by design. Before
//! the default profile was stacked on the engine's, podman's profile
//! alone let netlink sockets, ptrace and more through.

use std::collections::BTreeMap;

use super::escape::{Fixtures, PROBE_INSIDE, differences, outcomes, sibling, under_substrat_run};
use super::podman::image;
use super::{OCI, text};

/// Where podman's default container differs from a policy's view by the
/// engine's choice, not by a wall: the outcome each must have.
const ENGINE_DEFAULTS: [(&str, &str, &str); 2] = [
    (
        "write-system",
        "the root filesystem is the container's own copy of the image (podman runs it writable); \
         the host's /usr is not in the view (checked on the host below)",
        "",
    ),
    (
        "limit-pids",
        "podman's limits (its nproc ulimit) in place of the worker policy's pids.max",
        "value:EAGAIN:",
    ),
];

/// The battery in podman's default container: the workspace and the probe
/// as volumes, nothing else asked.
fn in_podman(image: &str, fixtures: &Fixtures, secret: &str) -> BTreeMap<String, String> {
    let ws = fixtures.ws().display().to_string();
    let probe = sibling("substrat-probe-static").display().to_string();
    let volume = format!("{ws}:{ws}");
    let probe_volume = format!("{probe}:{PROBE_INSIDE}:ro");
    let mut args = vec![
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "-v",
        &volume,
        "-v",
        &probe_volume,
        "-w",
        &ws,
        image,
    ];
    let battery = fixtures.battery();
    args.extend(battery.iter().map(String::as_str));
    // The secret in the engine's environment, which never reaches the
    // container.
    let out = std::process::Command::new("podman")
        .arg("--runtime")
        .arg(OCI)
        .args(&args)
        .env("SUBSTRAT_OCI_ESCAPE_SECRET", secret)
        .output()
        .expect("podman");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("\"done\":true"),
        "podman: {stdout}\n{}",
        text(&out.stderr)
    );
    outcomes(&stdout, "podman")
}

#[test]
fn an_engines_default_container_ends_the_battery_as_substrat_run_worker() {
    let test = "an_engines_default_container_ends_the_battery_as_substrat_run_worker";
    let Some(image) = image(test) else {
        return;
    };
    let (run, probe) = (sibling("substrat-run"), sibling("substrat-probe-static"));
    if !run.exists() || !probe.exists() {
        println!(
            "SKIPPED {test}: needs substrat-run and substrat-probe-static beside substrat-oci (cargo build --workspace; scripts/static-probe)"
        );
        return;
    }
    super::escape::assert_probe_current(&probe);
    let secret = format!("substrat-oci-engine-secret-{}", std::process::id());
    let fixtures = Fixtures::new(&secret);
    let under_run = under_substrat_run(&fixtures, &run, &probe, &secret);
    let in_container = in_podman(image, &fixtures, &secret);
    assert_eq!(
        under_run.keys().collect::<Vec<_>>(),
        in_container.keys().collect::<Vec<_>>(),
        "the same attacks ran"
    );
    assert!(under_run.len() >= 30, "{under_run:?}");
    let mut differ = differences(&under_run, &in_container);
    differ.retain(|line| {
        !ENGINE_DEFAULTS
            .iter()
            .any(|(attack, _, _)| line.starts_with(&format!("{attack}:")))
    });
    assert!(differ.is_empty(), "outcomes differ:\n{}", differ.join("\n"));
    for (attack, why, starts) in ENGINE_DEFAULTS {
        assert!(
            in_container[attack].starts_with(starts),
            "{attack} ({why}): {}",
            in_container[attack]
        );
    }
    assert!(
        !std::path::Path::new("/usr/substrat-prove").exists(),
        "written on the host's /usr"
    );
    assert!(
        !fixtures
            .ws()
            .parent()
            .is_some_and(|d| d.join("outside/written-from-inside").exists()),
        "a file was written outside"
    );
}
