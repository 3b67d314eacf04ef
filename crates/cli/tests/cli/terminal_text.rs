//! Issue 40, section 2: no byte an agent chose reaches the owner's
//! terminal raw. A real overlay run leaves a layer whose file names, file
//! contents and link targets hold each class of control character; every
//! printer of it (diff, --stat, --json, apply, errors) is read back.

use super::*;
use std::io::Read as _;
use std::process::Stdio;

use substrat_policy::text::is_unsafe;

/// Each class, as bytes an agent writes: C0, the escape sequences (CSI,
/// OSC title and clipboard, DCS), DEL, C1, bidi controls, invisible
/// characters, newline and tab.
const CLASSES: &[&str] = &[
    "\u{1}\u{7}\u{8}\u{b}\u{c}\u{e}\u{f}\u{1f}",
    "\u{1b}[31m\u{1b}[2J",
    "\u{1b}]0;owned\u{7}",
    "\u{1b}]52;c;cGF5\u{1b}\\",
    "\u{1b}P+q\u{1b}\\",
    "\u{7f}",
    "\u{9b}31m\u{9d}0;t\u{9c}\u{85}",
    "\u{202e}\u{2066}\u{200f}\u{61c}",
    "\u{200b}\u{2028}\u{feff}\u{e0041}",
    "\n\t",
];

/// `\NNN` for every byte, for sh's printf.
fn octal(text: &str) -> String {
    text.bytes().map(|b| format!("\\{b:03o}")).collect()
}

fn name(i: usize) -> String {
    format!("f{i}-{}.txt", CLASSES[i])
}

/// A workspace, and a layer where the agent wrote a file per class (name
/// and content), a link per class, and a fifo (which apply skips).
fn layer_with_every_class() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    let mut script = String::new();
    for (i, class) in CLASSES.iter().enumerate() {
        // Name 1 is a fifo's (apply skips it); its file goes beside it.
        let file = if i == 1 {
            format!("g{}", name(i))
        } else {
            name(i)
        };
        let content = format!("text {class} end\n");
        script.push_str(&format!(
            "printf '{}' > \"$(printf '{}')\"; ln -s \"$(printf '{}')\" l{i}; ",
            octal(&content),
            octal(&file),
            octal(&format!("t{class}")),
        ));
    }
    script.push_str(&format!("mkfifo \"$(printf '{}')\"", octal(&name(1))));
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--backend", "native", "--policy"])
        .arg(dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(dir.path().join("l"))
        .arg("--git-state")
        .arg(dir.path().join("git"))
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert_shown_safe("run's stderr", &stderr);
    dir
}

/// No unsafe character but newline and tab, and (since every printer got
/// an ESC) the escape spelled where the text was shown at all.
fn assert_shown_safe(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|c| is_unsafe(*c) && *c != '\n' && *c != '\t')
        .collect();
    assert!(raw.is_empty(), "{what}: raw {raw:?} in:\n{text}");
}

/// `args` with stdout on a fresh pseudo-terminal; what it wrote there
/// (the terminal's CR before each newline taken out).
fn on_a_terminal(args: &[&str]) -> String {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().unwrap())
        .unwrap();
    let mut master = std::fs::File::from(master);
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        // EIO once every writer is gone.
        let _ = master.read_to_end(&mut all);
        all
    });
    let status = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(slave)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{args:?}: {status}");
    let all = reader.join().unwrap();
    String::from_utf8(all).unwrap().replace("\r\n", "\n")
}

fn layer_args<'a>(sub: &'a str, layer: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["workspace", sub, layer];
    all.extend(more);
    all
}

#[test]
fn every_printer_of_a_layer_shows_control_characters_escaped() {
    let dir = layer_with_every_class();
    let layer = dir.path().join("l");
    let layer = layer.to_str().unwrap();

    // A person at a terminal: every line of every file escaped.
    let patch = on_a_terminal(&layer_args("diff", layer, &[]));
    assert_shown_safe("diff on a terminal", &patch);
    assert!(patch.contains("+text \\x1b[31m\\x1b[2J end"), "{patch}");
    assert!(patch.contains("+text \\u{202e}\\u{2066}"), "{patch}");
    assert!(patch.contains("\"b/f2-\\033]0;owned\\007.txt\""), "{patch}");

    // --stat, to a pipe as to a terminal: human text, escaped.
    let stat = substrat(&layer_args("diff", layer, &["--stat"]));
    let stat = String::from_utf8(stat.stdout).unwrap();
    assert_shown_safe("diff --stat", &stat);
    assert!(
        stat.contains("symlink to \"t\\033]0;owned\\007\""),
        "{stat}"
    );
    assert_shown_safe(
        "diff --stat on a terminal",
        &on_a_terminal(&layer_args("diff", layer, &["--stat"])),
    );

    // --json: the same names, escaped by JSON only.
    let out = substrat(&layer_args("diff", layer, &["--json"]));
    let json = String::from_utf8(out.stdout.clone()).unwrap();
    assert_shown_safe("diff --json", &json);
    let paths: Vec<String> = stdout_json(&out)["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_string())
        .collect();
    for i in [0, 2, 6, 7, 8, 9] {
        assert!(paths.contains(&name(i)), "{:?} not in {paths:?}", name(i));
    }

    // apply: the fifo skipped by a quoted name, the rest taken.
    let out = substrat(&layer_args("apply", layer, &[]));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_shown_safe("apply's stdout", &stdout);
    assert_shown_safe("apply's stderr", &stderr);
    assert!(stderr.contains("skipped \"f1-\\033[31m"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ws").join(name(7))).unwrap(),
        format!("text {} end\n", CLASSES[7])
    );
}

#[test]
fn a_patch_to_a_program_keeps_the_bytes_and_applies() {
    let dir = layer_with_every_class();
    let layer = dir.path().join("l");
    let out = substrat(&layer_args("diff", layer.to_str().unwrap(), &[]));
    let patch = String::from_utf8(out.stdout).unwrap();
    // Names quoted as git does; contents as the agent wrote them.
    assert!(
        patch.contains("+text \u{1b}[31m\u{1b}[2J end\n"),
        "{patch:?}"
    );
    assert!(!patch.contains("diff --git a/f"), "{patch:?}");
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::write(dir.path().join("p.diff"), &patch).unwrap();
    let git = Command::new("git")
        .args(["apply"])
        .arg(dir.path().join("p.diff"))
        .current_dir(&copy)
        .output()
        .unwrap();
    assert!(
        git.status.success(),
        "{}",
        String::from_utf8_lossy(&git.stderr)
    );
    for i in [0, 2, 3, 4, 5, 6, 7, 8, 9] {
        let content = std::fs::read_to_string(copy.join(name(i))).unwrap();
        assert_eq!(content, format!("text {} end\n", CLASSES[i]));
    }
}

#[test]
fn an_error_naming_an_agent_path_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(format!("not-a-layer-{}", CLASSES[1]));
    std::fs::create_dir(&odd).unwrap();
    let out = substrat(&["workspace", "diff", odd.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code(&out), 0);
    assert_shown_safe("the error", &stderr);
    assert!(stderr.contains("not-a-layer-\\x1b[31m\\x1b[2J"), "{stderr}");
}
