//! The daemon with its state in PostgreSQL (`--state postgres://...`),
//! where SUBSTRAT_TEST_POSTGRES names a database (CI: scripts/postgres).
//! Each test has a schema of its own in it.

use super::*;

/// How the state database's address reaches a daemon.
#[derive(Clone, Copy)]
enum Given {
    Flag,
    Environment,
}

/// `daemon --state-dir STATE_DIR` given `state`, which must refuse to
/// start (exit 2): what it printed.
fn refused_start(state_dir: &Path, state: &str, given: Given) -> String {
    let mut command = Command::new(bin());
    command.arg("daemon").arg("--state-dir").arg(state_dir);
    match given {
        Given::Flag => command.args(["--state", state]),
        Given::Environment => command.env("SUBSTRAT_STATE", state),
    };
    let out = command.stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}

/// A second daemon on `url` (another state directory) serves the team of
/// `first`: it lists the agents and where they run, leaves to their daemon
/// what changes them, and sends to them.
fn a_second_daemon_shares_the_team(first: &Daemon, url: &str) {
    let second = Daemon::start_with(tempfile::tempdir().unwrap(), &["--state", url]);
    let listed = second.agent(&["list"]).unwrap();
    let first_name = format!(":{}", first.state().canonicalize().unwrap().display());
    for agent in listed["agents"].as_array().unwrap() {
        let daemon = &agent["daemon"];
        assert_eq!(daemon["here"], false, "{agent}");
        assert!(
            daemon["daemon"].as_str().unwrap().ends_with(&first_name),
            "{agent}"
        );
    }
    let refused = second.agent(&["suspend", "w"]).unwrap_err();
    assert!(refused.contains("`w` runs on daemon"), "{refused}");
    let sent = second.agent(&["send", "w", "from the second"]).unwrap();
    assert!(sent["message_id"].is_string(), "{sent}");
}

#[test]
fn daemons_on_postgres_share_the_team_and_lose_nothing_on_kill_9() {
    let test = "daemons_on_postgres_share_the_team_and_lose_nothing_on_kill_9";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let d = Daemon::start_with(tempfile::tempdir().unwrap(), &["--state", &url]);
    let lead = d.create("lead", "bulk", None);
    d.create("w", "bulk", Some("lead"));
    let mut c = d.connect(&lead).init();
    let mut acknowledged = Vec::new();
    for i in 0..50 {
        let (r, _) = c.call(
            "send_message",
            json!({"recipient": "w", "text": format!("m{i}"), "sync": false}),
        );
        acknowledged.push(r["message_id"].as_str().unwrap().to_string());
    }
    // The state is in the database, and nowhere else.
    assert!(!d.state().join("state.db").exists());
    assert_eq!(schema.query("SELECT count(*) FROM agents"), "2");
    assert_eq!(
        schema.query("SELECT count(*) FROM messages WHERE status = 'queued'"),
        "50"
    );
    assert_eq!(
        schema.query("SELECT max(version) FROM schema_migrations"),
        substrat_broker::store::latest_version().to_string()
    );

    a_second_daemon_shares_the_team(&d, &url);

    // A copy of the first's state directory (its daemon id), the address
    // from the environment, is refused while the first runs: the same
    // agents' turns would run twice.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir(copy.path().join("state")).unwrap();
    std::fs::copy(
        d.state().join("daemon.id"),
        copy.path().join("state/daemon.id"),
    )
    .unwrap();
    let err = refused_start(&copy.path().join("state"), &url, Given::Environment);
    assert!(
        err.contains("the state database is in use: another process runs daemon"),
        "{err}"
    );

    // Killed: a new daemon on the same database loses nothing it acknowledged.
    let dir = d.kill9();
    let d = Daemon::start_with(dir, &["--state", &url]);
    let w = d.agent(&["inspect", "w"]).unwrap();
    let mut wc = d.connect(&w["agent"]).init();
    let (inbox, _) = wc.call("check_inbox", json!({}));
    let ids: Vec<String> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, acknowledged);
    // The operator's message through the second daemon waits as w's next
    // turn (no provider here runs it).
    assert_eq!(
        schema.query("SELECT count(*) FROM turns t JOIN messages m ON m.id = t.message_id WHERE t.status = 'queued' AND m.text = 'from the second'"),
        "1"
    );
}

#[test]
fn a_bad_state_address_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let start = |state: &str| refused_start(&dir.path().join("state"), state, Given::Flag);
    let err = start("/var/lib/state.db");
    assert!(
        err.contains("is neither sqlite:PATH nor a postgres://"),
        "{err}"
    );
    // Nothing listens at this port: refused, the password never shown.
    let err = start("postgres://u:hunter2@127.0.0.1:9/db?connect_timeout=2");
    assert!(err.contains("the state database is unavailable"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // TLS nobody could verify is refused, not served unverified.
    let err = start("postgres://u@127.0.0.1:9/db?sslmode=require");
    assert!(
        err.contains("give the CA that signed the server's certificate"),
        "{err}"
    );
    assert!(!dir.path().join("state/control.sock").exists());
}

/// A TCP proxy to PostgreSQL's unix socket that can be cut (every
/// connection closed, new ones dropped at once) and restored: an outage of
/// the database, as the daemon behind it sees one.
struct Outage {
    port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Outage {
    fn start(socket: PathBuf) -> Self {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (up2, open2) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !up2.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = UnixStream::connect(&socket) else {
                    continue;
                };
                open2.lock().unwrap().push(client.try_clone().unwrap());
                let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
                let (mut s_in, mut s_out) = (server.try_clone().unwrap(), server);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_in, &mut c_out);
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Outage { port, up, open }
    }

    fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for conn in self.open.lock().unwrap().drain(..) {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The unix socket of the tests' database, from scripts/postgres's URL
/// (`...?host=DIR&port=N`).
fn unix_socket(base: &str) -> Option<PathBuf> {
    let query = base.split_once('?')?.1;
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{name}=")).map(str::to_string))
    };
    let dir = param("host").filter(|h| h.starts_with('/'))?;
    let port = param("port").unwrap_or_else(|| "5432".into());
    Some(Path::new(&dir).join(format!(".s.PGSQL.{port}")))
}

#[test]
fn an_unreachable_database_gives_retryable_errors_and_the_daemon_recovers() {
    let test = "an_unreachable_database_gives_retryable_errors_and_the_daemon_recovers";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let Some(socket) = unix_socket(&schema.base) else {
        println!(
            "SKIPPED {test}: SUBSTRAT_TEST_POSTGRES is not scripts/postgres's unix-socket URL"
        );
        return;
    };
    let outage = Outage::start(socket);
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
    let database = schema
        .base
        .split_once(":///")
        .unwrap()
        .1
        .split('?')
        .next()
        .unwrap()
        .to_string();
    let url = format!(
        "postgres://{}@127.0.0.1:{}/{database}?options=-csearch_path%3D{}",
        user.trim(),
        outage.port,
        schema.name
    );
    let d = Daemon::start_with(tempfile::tempdir().unwrap(), &["--state", &url]);
    let lead = d.create("lead", "bulk", None);
    d.create("w", "bulk", Some("lead"));
    let mut c = d.connect(&lead).init();
    let send = |c: &mut Conn, text: &str| {
        c.call(
            "send_message",
            json!({"recipient": "w", "text": text, "sync": false}),
        )
    };
    let (before, failed) = send(&mut c, "before");
    assert!(!failed, "{before}");

    outage.cut();
    for attempt in ["during 1", "during 2"] {
        let (body, failed) = send(&mut c, attempt);
        assert!(failed, "{body}");
        assert_eq!(body["error"], "unavailable", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("retry later"),
            "{body}"
        );
    }
    let listed = d.agent(&["list"]).unwrap_err();
    assert!(
        listed.contains("the state database is unavailable"),
        "{listed}"
    );

    outage.restore();
    let (after, failed) = send(&mut c, "after");
    assert!(!failed, "{after}");
    let w = d.agent(&["inspect", "w"]).unwrap();
    let mut wc = d.connect(&w["agent"]).init();
    let (inbox, _) = wc.call("check_inbox", json!({}));
    let texts: Vec<&str> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["before", "after"], "{inbox}");
}

/// The first DNS name of a PEM certificate's subjectAltName (openssl).
fn certificate_name(file: &str) -> Option<String> {
    let out = Command::new("openssl")
        .args(["x509", "-in", file, "-noout", "-ext", "subjectAltName"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split([',', '\n', ' '])
        .find_map(|part| part.trim().strip_prefix("DNS:").map(str::to_string))
}

#[test]
fn the_daemon_reaches_postgres_over_verified_tls_only() {
    let test = "the_daemon_reaches_postgres_over_verified_tls_only";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let Ok(password) = std::env::var("SUBSTRAT_TEST_POSTGRES_PASSWORD") else {
        println!(
            "SKIPPED {test}: SUBSTRAT_TEST_POSTGRES_PASSWORD is not set (scripts/test sets it)"
        );
        return;
    };
    if schema.query("SHOW ssl") != "on" {
        println!("SKIPPED {test}: the test database's server has ssl off");
        return;
    }
    let cert = schema.query("SHOW ssl_cert_file");
    let Some(name) = certificate_name(&cert) else {
        println!("SKIPPED {test}: no DNS name in {cert}'s subjectAltName");
        return;
    };
    let port = schema.query("SHOW port");
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
    let database = schema.query("SELECT current_database()");
    let url = |host: &str, root: &str| {
        format!(
            "postgres://{}:{password}@{host}:{port}/{database}?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={root}&options=-csearch_path%3D{}",
            user.trim(),
            schema.name
        )
    };
    let d = Daemon::start_with(
        tempfile::tempdir().unwrap(),
        &["--state", &url(&name, &cert)],
    );
    d.create("a", "bulk", None);
    // Its connections over TCP are TLS, every one.
    let tcp = |ssl: bool| {
        schema.query(&format!(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name = 'substrat-sandbox' AND a.client_addr IS NOT NULL AND s.ssl = {ssl}"
        ))
    };
    assert_ne!(tcp(true), "0");
    assert_eq!(tcp(false), "0");
    assert_eq!(schema.query("SELECT count(*) FROM agents"), "1");
    drop(d);

    // Another CA, or another name than the certificate's: refused at start.
    let dir = tempfile::tempdir().unwrap();
    let other_ca = dir.path().join("other.pem");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-subj", "/CN=other", "-days", "1", "-keyout"])
        .arg(dir.path().join("other.key"))
        .arg("-out")
        .arg(&other_ca)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    for (state, why) in [
        (url(&name, &other_ca.display().to_string()), "UnknownIssuer"),
        (url("wrong.invalid", &cert), "not valid for name"),
    ] {
        let err = refused_start(&dir.path().join("state"), &state, Given::Flag);
        assert!(
            err.contains("cannot use the state database") && err.contains(why),
            "{err}"
        );
        assert!(!err.contains(&password), "{err}");
    }
}
