//! `podman kube play` with substrat-oci as the runtime (issue 44, the
//! attacker's review of hostsock): a pod's members bind its infra
//! container's files (`userdata/hosts`, `userdata/shm`), and a kube yaml's
//! annotations are copied into each member's spec.

use std::process::Command;

use super::podman::image;
use super::{OCI, text};

/// An infra image with a command (the node has no catatonit for
/// podman's own pause image), made from the test image.
fn pause_image(image: &str) -> Result<&'static str, String> {
    const PAUSE: &str = "localhost/substrat-oci-test:pause";
    let script = format!(
        "podman image exists {PAUSE} && exit 0; \
         c=$(podman create {image} /bin/true) && \
         podman export $c | podman import --change 'CMD [\"/bin/sleep\", \"100000\"]' - {PAUSE} \
         >/dev/null; s=$?; podman rm $c >/dev/null; exit $s"
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(PAUSE)
    } else {
        Err(text(&out.stderr))
    }
}

/// `podman kube play` (or `kube down`) of `yaml` with the infra image of
/// `conf`.
fn kube(conf: &std::path::Path, verb: &str, yaml: &std::path::Path) -> std::process::Output {
    let mut command = Command::new("podman");
    command
        .env("CONTAINERS_CONF", conf)
        .arg("--runtime")
        .arg(OCI);
    command.args(["kube", verb]);
    if verb == "play" {
        command.args(["--network", "none"]);
    }
    command.arg(yaml).output().expect("podman kube")
}

fn logs(name: &str) -> String {
    let out = Command::new("podman")
        .args(["logs", name])
        .output()
        .expect("podman logs");
    text(&out.stdout) + &text(&out.stderr)
}

/// Finding 4: a plain podman pod could not run: its member's /etc/hosts
/// (the infra container's `userdata/hosts`) was refused as another
/// container's, and its /dev/shm (the infra's `userdata/shm`), which the
/// runtime's own /dev replaces, was judged all the same. Finding 2 through
/// kube play: a yaml's `io.kubernetes.cri.sandbox-id: overlay-containers`
/// made podman's whole state directory the pod's own, idmapped.
#[test]
fn a_podman_kube_pod_runs_and_its_annotations_make_nothing_own() {
    let test = "a_podman_kube_pod_runs_and_its_annotations_make_nothing_own";
    let Some(image) = image(test) else {
        return;
    };
    let help = Command::new("podman")
        .args(["kube", "play", "--help"])
        .output();
    if !help.is_ok_and(|h| h.status.success()) {
        println!("SKIPPED {test}: this podman has no `kube play`");
        return;
    }
    let pause = match pause_image(image) {
        Ok(pause) => pause,
        Err(e) => {
            println!("SKIPPED {test}: cannot make an infra image: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("dir");
    let conf = dir.path().join("containers.conf");
    std::fs::write(&conf, format!("[engine]\ninfra_image = \"{pause}\"\n")).expect("conf");
    let pod = format!("substratkp{}", std::process::id());
    let plain = dir.path().join("plain.yaml");
    std::fs::write(
        &plain,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\nspec:\n  restartPolicy: Never\n  \
             containers:\n  - name: c\n    image: {image}\n    command: [\"/bin/sh\", \"-c\", \
             \"echo ran; grep -c {pod} /etc/hosts; echo x > /dev/shm/x && echo shm-written\"]\n"
        ),
    )
    .expect("yaml");
    let played = kube(&conf, "play", &plain);
    let member = format!("{pod}-c");
    let mut seen = String::new();
    for _ in 0..50 {
        seen = logs(&member);
        if seen.contains("shm-written") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = kube(&conf, "down", &plain);
    assert!(
        played.status.success(),
        "kube play: {}{}",
        text(&played.stdout),
        text(&played.stderr)
    );
    assert!(
        seen.contains("ran\n1\n") && seen.contains("shm-written"),
        "{seen}"
    );

    let forged = dir.path().join("forged.yaml");
    let attacker = format!("{pod}f");
    std::fs::write(
        &forged,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {attacker}\n  annotations:\n    \
             io.kubernetes.cri.sandbox-id: overlay-containers\nspec:\n  restartPolicy: Never\n  \
             containers:\n  - name: c\n    image: {image}\n    command: [\"/bin/sh\", \"-c\", \
             \"ls /hx >/dev/null && echo listed\"]\n    volumeMounts:\n    - name: v\n      \
             mountPath: /hx\n  volumes:\n  - name: v\n    hostPath:\n      \
             path: /var/lib/containers/storage/overlay-containers\n      type: Directory\n"
        ),
    )
    .expect("yaml");
    let played = kube(&conf, "play", &forged);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let seen = logs(&format!("{attacker}-c"));
    let _ = kube(&conf, "down", &forged);
    let said = text(&played.stdout) + &text(&played.stderr);
    assert!(!seen.contains("listed"), "podman's state was bound: {seen}");
    assert!(
        said.contains("overlay-containers") && said.contains("refused"),
        "{said}"
    );
}
