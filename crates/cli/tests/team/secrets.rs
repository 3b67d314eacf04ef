//! The daemon's secrets never enter a sandbox: a daemon holding every kind
//! of credential (model keys, the roles' HTTP token, an upstream server's
//! token and header, the state database's address, libpq's variables, its
//! TLS authority's key), distinctive random values each, runs a role and an
//! upstream server whose policies allow the whole environment
//! (`env.allow = ["*"]`) and name every secret again. A shell inside
//! searches the environment, every visible process's environment and
//! command line, and every readable file for each value, by value: none is
//! found, while two controls (an allowed variable, a file) are.

use super::*;

/// The secrets by the variable the daemon reads them from. The variables
/// the test itself makes up (roles' token, upstream credentials) are named
/// to the daemon by flag or configuration, as an operator would.
const SECRET_VARS: [&str; 14] = [
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "CODEX_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "SUBSTRAT_TEST_ROLES_TOKEN",
    "SUBSTRAT_TEST_UPSTREAM_TOKEN",
    "SUBSTRAT_TEST_UPSTREAM_HEADER",
    "PGPASSWORD",
    "PGHOST",
    "PGUSER",
    "PGPASSFILE",
    "PGSSLKEY",
];

/// An allowed variable: the search must find it (proof that it searched
/// the environment, and that `*` did let the daemon's variables in).
const CONTROL_VAR: &str = "SUBSTRAT_TEST_CONTROL";

fn random_hex() -> String {
    let mut bytes = [0u8; 12];
    let mut urandom = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut urandom, &mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The search as one shell command: collect everything first (the values
/// travel base64-encoded, so the command in /proc is not what is found),
/// then count each value's hits, in order, into found.txt in the working
/// directory (written whole by a rename).
fn search_all(needles: &[String]) -> String {
    let encoded = base64(&(needles.join("\n") + "\n"));
    format!(
        "(env; cat /proc/*/environ /proc/*/cmdline; find / -type f -size -2M \
         -not -path '/proc/*' -not -path '/sys/*' -not -path '/dev/*' -not -path '/usr/*' \
         -not -path '/lib*' -not -path '/bin/*' -not -path '/sbin/*' \
         -not -path /tmp/seen -print0 2>/dev/null | xargs -0 -r cat 2>/dev/null) | tr '\\0' '\\n' > /tmp/seen; \
         echo {encoded} | base64 -d > /tmp/needles; \
         while read -r k; do printf '%s ' \"$(grep -c -F -- \"$k\" /tmp/seen)\"; done < /tmp/needles > found.tmp; \
         mv found.tmp found.txt; echo searched"
    )
}

/// What a daemon holds, and the needles searched for (secrets first, then
/// the controls).
struct Held {
    env: Vec<(String, String)>,
    secrets: Vec<(String, String)>,
    controls: Vec<(String, String)>,
}

fn held(root: &Path) -> Held {
    let mut env = Vec::new();
    let mut secrets = Vec::new();
    for var in SECRET_VARS {
        let value = format!("s3cr3t{}", random_hex());
        env.push((var.to_string(), value.clone()));
        secrets.push((var.to_string(), value));
    }
    // The state database's address, the default file's, named by value.
    let state = format!("sqlite:{}", root.join("state/state.db").display());
    env.push(("SUBSTRAT_STATE".into(), state.clone()));
    secrets.push(("SUBSTRAT_STATE".into(), state));
    let control = format!("control{}", random_hex());
    env.push((CONTROL_VAR.into(), control.clone()));
    let file_control = format!("filecontrol{}", random_hex());
    Held {
        env,
        secrets,
        controls: vec![
            (CONTROL_VAR.into(), control),
            ("marker.txt".into(), file_control),
        ],
    }
}

/// The role and the upstream policy: everything the daemon has, allowed.
fn leaky_policies(root: &Path) -> PathBuf {
    let policies = root.join("policies");
    std::fs::create_dir(&policies).unwrap();
    let named: Vec<String> = SECRET_VARS
        .iter()
        .chain(&["SUBSTRAT_STATE"])
        .map(|v| format!("\"{v}\""))
        .collect();
    let allow = format!("allow = [\"*\", \"PG*\", {}]", named.join(", "));
    std::fs::write(
        policies.join("leaky.toml"),
        format!("version = 1\nextends = \"worker\"\n[env]\n{allow}\n"),
    )
    .unwrap();
    std::fs::write(
        policies.join("leaky-upstream.toml"),
        format!("version = 1\nextends = \"upstream\"\n[env]\n{allow}\n"),
    )
    .unwrap();
    policies
}

/// A remote server (never reached: its port is closed) that names the
/// upstream credentials, and with `search` a local one that is the search
/// itself.
fn upstreams(root: &Path, search: Option<&str>) -> PathBuf {
    let file = root.join("upstreams.json");
    let mut servers = json!({"mcpServers": {
        "far": {
            "url": format!("http://127.0.0.1:{}/mcp", free_port()),
            "bearer_token_env": "SUBSTRAT_TEST_UPSTREAM_TOKEN",
            "header_env": {"X-Key": "SUBSTRAT_TEST_UPSTREAM_HEADER"},
        },
    }});
    if let Some(search) = search {
        servers["mcpServers"]["snoop"] = json!({
            "command": "/bin/sh",
            "args": ["-c", format!("cd \"$HOME\" && {search}")],
            "env_allow": SECRET_VARS.iter().chain(&["SUBSTRAT_STATE"]).collect::<Vec<_>>(),
            "policy": "leaky-upstream",
        });
    }
    std::fs::write(&file, servers.to_string()).unwrap();
    file
}

/// The counts in a found.txt, each with its needle's name.
fn counts(found: &str, names: &[String]) -> Vec<(String, u64)> {
    let numbers: Vec<u64> = found
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(numbers.len(), names.len(), "the search's output: {found}");
    names.iter().cloned().zip(numbers).collect()
}

fn judge(found: &str, held: &Held, place: &str) {
    let names: Vec<String> = held
        .secrets
        .iter()
        .chain(&held.controls)
        .map(|(n, _)| n.clone())
        .collect();
    let counts = counts(found, &names);
    let (secrets, controls) = counts.split_at(held.secrets.len());
    let leaked: Vec<&(String, u64)> = secrets.iter().filter(|(_, n)| *n > 0).collect();
    assert!(leaked.is_empty(), "{place}: secrets found: {leaked:?}");
    for (name, n) in controls {
        assert!(*n > 0, "{place}: the search did not see its control {name}");
    }
}

impl Held {
    /// The values searched for: secrets first, then the controls.
    fn needles(&self) -> Vec<String> {
        self.secrets
            .iter()
            .chain(&self.controls)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// The daemon holding every secret (and credentials' variables named by
/// flag and upstream configuration), with `extra` flags; with `upstream`,
/// a local server whose command is the search.
fn daemon_holding(root: tempfile::TempDir, held: &Held, extra: &[&str], upstream: bool) -> Team {
    let policies = leaky_policies(root.path());
    // The local server's search cannot know the authority's key (made at
    // the daemon's start): it looks for the others. Its workspace holds
    // the file control.
    let search = upstream.then(|| search_all(&held.needles()));
    if upstream {
        let snoop = root.path().join("state/upstreams/snoop");
        std::fs::create_dir_all(&snoop).unwrap();
        std::fs::write(snoop.join("marker.txt"), &held.controls[1].1).unwrap();
    }
    let child = Command::new(bin())
        .args(["daemon", "--provider", "stand-in", "--backend", "native"])
        .args(extra)
        .arg("--policies")
        .arg(&policies)
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .args(["--roles-http", &format!("127.0.0.1:{}", free_port())])
        .args(["--roles-http-token-env", "SUBSTRAT_TEST_ROLES_TOKEN"])
        .args(["--listen-tls", &format!("127.0.0.1:{}", free_port())])
        .args(["--tls-name", "localhost"])
        .arg("--upstreams")
        .arg(upstreams(root.path(), search.as_deref()))
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .envs(held.env.iter().cloned())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    wait_until("the daemon listens", 30, || {
        UnixStream::connect(team.state().join("control.sock")).is_ok()
    });
    team
}

/// One line of the body of the daemon's TLS authority's key.
fn tls_key_line(team: &Team) -> String {
    let key = std::fs::read_to_string(team.state().join("tls/ca.key")).unwrap();
    key.lines()
        .find(|l| l.len() >= 40 && !l.starts_with("-----"))
        .unwrap()
        .to_string()
}

/// The daemon with every secret, `extra` flags, the leaky role; one turn
/// of an agent that searches; with `upstream`, the local server's search
/// too.
fn no_secret_reaches(test: &str, extra: &[&str], upstream: bool) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let held = held(root.path());
    let team = daemon_holding(root, &held, extra, upstream);
    let mut all = Held {
        env: Vec::new(),
        secrets: held.secrets.clone(),
        controls: held.controls.clone(),
    };
    all.secrets.push(("tls/ca.key".into(), tls_key_line(&team)));
    let plan = json!({"turns": [{"steps": [
        {"write": "marker.txt", "text": held.controls[1].1},
        {"shell": search_all(&all.needles())},
        {"reply": "{results}"},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "s",
        "--role",
        "leaky",
        "--workspace",
        &ws,
        &with_plan("go", &plan),
    ]);
    wait_until("the turn ends", 120, || {
        team.settled() && team.turns("s").len() == 1
    });
    let turn = &team.turns("s")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    let found = std::fs::read_to_string(team.ws().join("found.txt")).unwrap_or_else(|e| {
        panic!("{test}: the search did not run ({e}): {turn:?}");
    });
    judge(&found, &all, "the agent's sandbox");
    if upstream {
        let found_at = team.state().join("upstreams/snoop/found.txt");
        wait_until("the upstream server searched", 60, || found_at.exists());
        let found = std::fs::read_to_string(&found_at).unwrap();
        judge(&found, &held, "the upstream server's sandbox");
    }
}

#[test]
fn no_daemon_secret_reaches_a_cold_turn_or_an_upstream_server() {
    let test = "no_daemon_secret_reaches_a_cold_turn_or_an_upstream_server";
    if !sandbox_works(test, "native") {
        return;
    }
    no_secret_reaches(test, &[], true);
}

#[test]
fn no_daemon_secret_reaches_a_warm_turn() {
    let test = "no_daemon_secret_reaches_a_warm_turn";
    if !sandbox_works(test, "native") {
        return;
    }
    no_secret_reaches(test, &["--warm"], false);
}

#[test]
fn no_daemon_secret_reaches_a_container_turn() {
    let test = "no_daemon_secret_reaches_a_container_turn";
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED {test}: containers through substrat-oci need root");
        return;
    }
    if Command::new("podman").arg("--version").output().is_err() {
        println!("SKIPPED {test}: podman is not installed (scripts/setup installs it)");
        return;
    }
    if !sandbox_works(test, "native") {
        return;
    }
    no_secret_reaches(test, &["--engine", "podman"], false);
}

#[test]
fn no_daemon_secret_reaches_a_containerd_turn() {
    let test = "no_daemon_secret_reaches_a_containerd_turn";
    let Some(ctrd) = super::containerd::Containerd::start(test) else {
        return;
    };
    no_secret_reaches(test, &ctrd.daemon_args(), false);
}
