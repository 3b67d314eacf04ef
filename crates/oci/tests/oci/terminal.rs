//! `podman exec -t`: a terminal for an exec, made in the container's own
//! devpts and sent over the engine's console socket, as for `run -t`.
//! podman is run under `script` so that it has a terminal of its own, whose
//! size it gives the exec's.

use std::process::Command;

use super::escape::{assert_probe_current, sibling};
use super::podman::{RUN, Removed, image, podman};
use super::text;

#[test]
fn podman_exec_gets_a_terminal_of_the_containers_own() {
    let test = "podman_exec_gets_a_terminal_of_the_containers_own";
    let Some(image) = image(test) else {
        return;
    };
    let probe = sibling("substrat-probe-static");
    if !probe.exists() || Command::new("script").arg("--version").output().is_err() {
        println!(
            "SKIPPED {test}: needs substrat-probe-static beside substrat-oci (scripts/static-probe) and script (util-linux)"
        );
        return;
    }
    assert_probe_current(&probe);
    let bind = format!("{}:/run/substrat-probe:ro", probe.display());
    let mut args = RUN.to_vec();
    args.extend(["-d", "-v", &bind, image, "sleep", "1000"]);
    let out = podman(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let _removed = Removed(id.clone());
    // The exec's own terminal: its stdin, its controlling terminal (only
    // then /dev/tty opens), podman's size; TIOCSTI and TIOCSETD on it
    // denied by seccomp, as on the container's own.
    let script = "tty; [ -t 0 ] && echo stdin-is-a-terminal; stty size; \
                  (printf x > /dev/tty) && echo; /run/substrat-probe tiocsti; \
                  /run/substrat-probe tiocsetd; exit 5";
    let line = format!(
        "stty rows 33 cols 111; podman --runtime {} exec -t {id} /bin/sh -c '{script}'",
        super::OCI
    );
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.split("\r\n").collect();
    assert!(
        lines.iter().any(|l| l.starts_with("/dev/pts/")),
        "{stdout:?}"
    );
    assert!(lines.contains(&"stdin-is-a-terminal"), "{stdout:?}");
    assert!(lines.contains(&"33 111"), "{stdout:?}");
    assert!(lines.contains(&"x"), "{stdout:?}");
    let outcomes: Vec<&&str> = lines.iter().filter(|l| l.starts_with("OUTCOME")).collect();
    assert_eq!(
        outcomes,
        [&"OUTCOME errno:EPERM", &"OUTCOME errno:EPERM"],
        "{stdout:?}"
    );
    // The container's own process has no terminal: the exec's is not it.
    let out = podman(&["exec", &id, "/bin/sh", "-c", "[ -t 0 ] || echo no-terminal"]);
    assert_eq!(text(&out.stdout), "no-terminal\n", "{}", text(&out.stderr));
}
