//! Usability: ordinary tools work under every shipped policy.

use super::*;

// ---------------------------------------------------------------- usability under every shipped policy

const SHIPPED: [&str; 3] = ["worker", "reviewer", "strict"];

/// Runs `script` with sh under every shipped policy and returns stdout.
fn under_every_policy(case: &Case, script: &str, expected: &str) {
    for policy_name in SHIPPED {
        let out = case.run(policy_name, &["/bin/sh", "-c", script]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(expected),
            "{policy_name}: exit {:?}\nstdout: {stdout}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

attack!(usable_sh_and_coreutils, |case| {
    under_every_policy(
        &case,
        "mkdir -p /tmp/a && printf 'b\\na\\n' > /tmp/a/f && sort /tmp/a/f | head -1 && ls / | wc -l && cat /dev/null && date +%Y >/dev/null && echo coreutils-ok",
        "coreutils-ok",
    );
});

attack!(usable_python3_threads_and_subprocess, |case| {
    let script = r#"python3 -c 'import threading, subprocess
t = threading.Thread(target=print, args=("thread-ok",)); t.start(); t.join()
print(subprocess.run(["echo", "subprocess-ok"], capture_output=True, text=True).stdout.strip())'"#;
    under_every_policy(&case, script, "thread-ok\nsubprocess-ok");
});

attack!(usable_node, |case| {
    under_every_policy(
        &case,
        r#"node -e 'require("child_process").execFileSync("true"); console.log("node-ok")'"#,
        "node-ok",
    );
});

attack!(usable_git_init_and_commit, |case| {
    // In a subdirectory of the workspace where it is writable; the reviewer's
    // workspace is read-only, so there (and only there) in /tmp.
    let script = "base=$PWD; [ -w \"$base\" ] || base=/tmp; repo=$(mktemp -d \"$base/sub-XXXXXX\") && cd \"$repo\" && git init -q && echo a > a && git add a && git -c user.name=t -c user.email=t@example.com commit -qm first && git log --oneline | wc -l | sed 's/^/commits=/'";
    under_every_policy(&case, script, "commits=1");
});
