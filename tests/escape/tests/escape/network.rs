//! The network: socket families, host loopback and abstract sockets, and
//! `network = "proxy"` (egress only through the proxy, to allowed hosts).

use super::*;

// ---------------------------------------------------------------- network

attack!(socket_families, |case| {
    for family in ["netlink", "packet", "vsock"] {
        assert_eq!(case.probe(&["socket", family]), "errno:EPERM", "{family}");
    }
    assert_eq!(case.probe(&["socket", "inet", "garbage"]), "errno:EPERM");
    for family in ["unix", "inet", "inet6"] {
        assert_eq!(case.probe(&["socket", family]), "ok", "{family}");
    }
});

attack!(host_loopback_and_abstract_sockets, |case| {
    // The sandbox's own loopback works (a test suite's server on
    // 127.0.0.1 or ::1)...
    assert_eq!(case.probe(&["loopback-echo", "127.0.0.1"]), "ok");
    assert_eq!(case.probe(&["loopback-echo", "::1"]), "ok");
    // ...but it is not the host's: a host server listening on 127.0.0.1
    // is not there, and nothing outside is routed.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    assert_eq!(case.probe(&["connect-tcp", &port]), "errno:ECONNREFUSED");
    assert_eq!(
        case.probe(&["connect-ip", "1.1.1.1", "443"]),
        "errno:ENETUNREACH"
    );
    use std::os::linux::net::SocketAddrExt;
    let name = unique("substrat-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    // The host's abstract socket is reachable from the host...
    assert!(std::os::unix::net::UnixStream::connect_addr(&addr).is_ok());
    // ...but not from a sandbox with its own network namespace,
    assert_eq!(
        case.probe(&["connect-abstract", &name]),
        "errno:ECONNREFUSED"
    );
    // nor, through Landlock's scoping, from one sharing the host's network.
    assert_eq!(
        case.probe_with("host-network", &["connect-abstract", &name]),
        "errno:EPERM"
    );
});

// ---------------------------------------------------------------- network = "proxy"

/// A host-side TCP server on loopback: answers each connection's first
/// line with `pong:<line>`. The proxy (outside the sandbox) can reach it;
/// the sandbox itself cannot.
fn pong_server() -> u16 {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let _ = reader.read_line(&mut line);
                let mut stream = stream;
                let _ = writeln!(stream, "pong:{}", line.trim());
            });
        }
    });
    port
}

/// A proxy policy in the case's workspace (the port is the test server's).
pub(crate) fn proxy_policy(case: &Case, name: &str, body: &str) -> String {
    let path = case.path().join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\n{body}\n"),
    )
    .unwrap();
    path.display().to_string()
}

/// The launcher's switches for tests (never a policy's): names resolved
/// to fixed addresses, and with `allow_private` the private-range refusal
/// off.
fn test_switches(hosts: &[(&str, &str)], allow_private: bool) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    if allow_private {
        args.push("--proxy-test-allow-private".into());
    }
    for (name, addr) in hosts {
        args.push("--proxy-test-host".into());
        args.push(format!("{name}={addr}").into());
    }
    args
}

/// The proxy's audit lines of one kind of event (`decision`, `closed`).
fn audit_lines(path: &Path, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event"] == event)
        .collect()
}

attack!(proxy_egress_only_to_allowed_hosts, |case| {
    let port = pong_server();
    let p = port.to_string();
    // The launcher's switches for tests: a resolver mapping names to
    // loopback, and the private-range refusal switched off.
    let open = proxy_policy(
        &case,
        "open",
        &format!(
            "allow = [\"allowed.test:{p}\", \"denied.test:{p}\"]\ndeny = [\"denied.test:{p}\"]"
        ),
    );
    let loopback = "127.0.0.1";
    let switches = test_switches(
        &[
            ("allowed.test", loopback),
            ("denied.test", loopback),
            ("other.test", loopback),
        ],
        true,
    );
    let audit = case.path().join("audit.log");
    let probe = |args: &[&str]| {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(args);
        let mut extra = vec![std::ffi::OsStr::new("--proxy-audit"), audit.as_os_str()];
        extra.extend(switches.iter().map(|s| s.as_os_str()));
        outcome_of(&mut case.command_with(&open, &extra, &argv))
    };
    // Through the proxy to the allowed name: a tunnel and a forward request.
    assert_eq!(
        probe(&["proxy-connect", "allowed.test", &p]),
        "value:200 pong:ping"
    );
    assert_eq!(
        probe(&["proxy-get", "allowed.test", &p, "/x"]),
        "value:pong:GET /x HTTP/1.1"
    );
    // Denied (deny wins over allow) and not allowed.
    assert_eq!(probe(&["proxy-connect", "denied.test", &p]), "value:403");
    assert_eq!(probe(&["proxy-connect", "other.test", &p]), "value:403");
    assert_eq!(probe(&["proxy-connect", "127.0.0.1", &p]), "value:403");
    // Around the proxy: nothing but loopback in the sandbox's network
    // namespace, and its loopback is not the host's.
    assert_eq!(
        probe(&["connect-ip", "1.1.1.1", "443"]),
        "errno:ENETUNREACH"
    );
    assert_eq!(
        probe(&["connect-ip", "127.0.0.1", &p]),
        "errno:ECONNREFUSED"
    );
    let lines = audit_lines(&audit, "decision");
    let decisions: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["host"].as_str().unwrap().to_string(),
                l["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("allowed.test", "allowed"),
            ("allowed.test", "allowed"),
            ("denied.test", "denied"),
            ("other.test", "denied"),
            ("127.0.0.1", "denied"),
        ]
        .map(|(h, d)| (h.to_string(), d.to_string()))
    );
    let closed = audit_lines(&audit, "closed");
    assert_eq!(closed.len(), 2, "the two allowed connections closed");
    assert!(
        closed[0]["bytes_up"].as_u64().unwrap() >= 5
            && closed[0]["bytes_down"].as_u64().unwrap() >= 10,
        "{}",
        closed[0]
    );
    assert!(
        lines[2]["reason"]
            .as_str()
            .unwrap()
            .contains("is denied by"),
        "{}",
        lines[2]
    );

    // With the private-range refusal on (the default), names that resolve
    // to loopback, private, link-local (cloud metadata) or IPv4-mapped
    // addresses are refused even when allowed.
    let strict = proxy_policy(
        &case,
        "strict",
        &format!(
            "allow = [\"loop.test:{p}\", \"ten.test:{p}\", \"meta.test:{p}\", \"mapped.test:{p}\"]"
        ),
    );
    let strict_hosts = test_switches(
        &[
            ("loop.test", "127.0.0.1"),
            ("ten.test", "10.0.0.1"),
            ("meta.test", "169.254.169.254"),
            ("mapped.test", "::ffff:127.0.0.1"),
        ],
        false,
    );
    // The system's resolver, not the test map: `localhost` resolves to
    // loopback and is refused though allowed.
    let real_dns = proxy_policy(&case, "real-dns", &format!("allow = [\"localhost:{p}\"]"));
    let audit_dns = case.path().join("audit-dns.log");
    let extra = [std::ffi::OsStr::new("--proxy-audit"), audit_dns.as_os_str()];
    let argv = ["./substrat-probe", "proxy-connect", "localhost", &p];
    assert_eq!(
        outcome_of(&mut case.command_with(&real_dns, &extra, &argv)),
        "value:403"
    );
    let dns = audit_lines(&audit_dns, "decision");
    let reason = dns[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("localhost resolves to ") && reason.ends_with("(loopback)"),
        "{reason}"
    );
    let audit_strict = case.path().join("audit-strict.log");
    for host in ["loop.test", "ten.test", "meta.test", "mapped.test"] {
        let mut extra = vec![
            std::ffi::OsStr::new("--proxy-audit"),
            audit_strict.as_os_str(),
        ];
        extra.extend(strict_hosts.iter().map(|s| s.as_os_str()));
        let argv = ["./substrat-probe", "proxy-connect", host, &p];
        assert_eq!(
            outcome_of(&mut case.command_with(&strict, &extra, &argv)),
            "value:403",
            "{host}"
        );
    }
    let reasons: Vec<String> = audit_lines(&audit_strict, "decision")
        .iter()
        .map(|l| l["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "loop.test resolves to 127.0.0.1, which is not a public address (loopback)",
            "ten.test resolves to 10.0.0.1, which is not a public address (private)",
            "meta.test resolves to 169.254.169.254, which is not a public address (link-local, cloud metadata)",
            "mapped.test resolves to ::ffff:127.0.0.1, which is not a public address (IPv4-mapped or -compatible)",
        ]
    );
});

// An operator's destination (`--destinations FILE`, never a policy) lets
// a name reach the private networks it lists, and nothing else: another
// name resolving there, or the named one resolving elsewhere, is refused.
attack!(
    proxy_reaches_private_endpoints_only_an_operator_named,
    |case| {
        let port = pong_server();
        let p = port.to_string();
        let policy = proxy_policy(
            &case,
            "mirror",
            &format!("allow = [\"mirror.test:{p}\", \"loop.test:{p}\", \"far.test:{p}\"]"),
        );
        let hosts = test_switches(
            &[
                ("mirror.test", "127.0.0.1"),
                ("loop.test", "127.0.0.1"),
                ("far.test", "127.0.0.1"),
            ],
            false,
        );
        let destinations = case.path().join("destinations.toml");
        std::fs::write(
        &destinations,
        format!(
            "[[destination]]\nname = \"host-mirror\"\nhost = \"mirror.test:{p}\"\nnetworks = [\"127.0.0.0/8\"]\n\n[[destination]]\nname = \"far\"\nhost = \"far.test:{p}\"\nnetworks = [\"10.0.0.0/8\"]\n"
        ),
    )
    .unwrap();
        let audit = case.path().join("audit-mirror.log");
        let connect = |host: &str, with_destinations: bool| {
            let mut extra = vec![std::ffi::OsStr::new("--proxy-audit"), audit.as_os_str()];
            extra.extend(hosts.iter().map(|s| s.as_os_str()));
            if with_destinations {
                extra.extend([
                    std::ffi::OsStr::new("--destinations"),
                    destinations.as_os_str(),
                ]);
            }
            let argv = ["./substrat-probe", "proxy-connect", host, &p];
            outcome_of(&mut case.command_with(&policy, &extra, &argv))
        };
        assert_eq!(connect("mirror.test", false), "value:403");
        assert_eq!(connect("mirror.test", true), "value:200 pong:ping");
        assert_eq!(connect("loop.test", true), "value:403");
        assert_eq!(connect("far.test", true), "value:403");
        let decisions: Vec<(String, String)> = audit_lines(&audit, "decision")
            .iter()
            .map(|l| {
                (
                    l["decision"].as_str().unwrap_or("").to_string(),
                    l["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let refused = |host: &str| {
            (
                "denied".to_string(),
                format!("{host} resolves to 127.0.0.1, which is not a public address (loopback)"),
            )
        };
        assert_eq!(
            decisions,
            [
                refused("mirror.test"),
                (
                    "allowed".to_string(),
                    "operator destination `host-mirror`".to_string()
                ),
                refused("loop.test"),
                refused("far.test"),
            ]
        );
        // A destinations file the launcher cannot read whole stops the launch.
        std::fs::write(
            &destinations,
            "[[destination]]\nname = \"all\"\nhost = \"mirror.test\"\nnetworks = [\"0.0.0.0/0\"]\n",
        )
        .unwrap();
        let extra = [
            std::ffi::OsStr::new("--destinations"),
            destinations.as_os_str(),
        ];
        let out = case
            .command_with(
                &policy,
                &extra,
                &["./substrat-probe", "proxy-connect", "mirror.test", &p],
            )
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("destination `all`: `0.0.0.0/0` is every address"),
            "{stderr}"
        );
    }
);

// ---------------------------------------------------------------- the model gateway's bridge

/// A host-side Unix socket standing for an agent's gateway socket: answers
/// each connection with `gw:<request line>`. Writable by all, as the
/// daemon's socket is by the sandbox's user (here nobody too).
fn gateway_socket(case: &Case) -> PathBuf {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    let path = case.path().join("gateway.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(stream.try_clone().unwrap()).read_line(&mut line);
            let mut stream = stream;
            let _ = write!(stream, "gw:{}", line.trim());
        }
    });
    path
}

attack!(
    the_gateway_is_reached_on_its_port_and_nothing_else_is,
    |case| {
        let socket = gateway_socket(&case);
        let extra = [
            std::ffi::OsStr::new("--agent-bind"),
            std::ffi::OsStr::new("ro"),
            socket.as_os_str(),
            std::ffi::OsStr::new("/run/substrat/gateway.sock"),
        ];
        let probe = |args: &[&str]| {
            let mut argv = vec!["./substrat-probe"];
            argv.extend_from_slice(args);
            outcome_of(&mut case.command_with("worker", &extra, &argv))
        };
        // network = "none" plus the gateway: its port answers, through the bridge.
        assert_eq!(
            probe(&["gateway-get", "/v1/messages"]),
            "value:gw:GET /v1/messages HTTP/1.1"
        );
        // Nothing else: not the host's loopback, not the outside, not the
        // proxy's port (no proxy here).
        let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = host.local_addr().unwrap().port().to_string();
        let refused = "errno:ECONNREFUSED";
        assert_eq!(probe(&["connect-ip", "127.0.0.1", &port]), refused);
        assert_eq!(
            probe(&["connect-ip", "1.1.1.1", "443"]),
            "errno:ENETUNREACH"
        );
        assert_eq!(probe(&["connect-ip", "127.0.0.1", "3128"]), refused);
        // The gateway on the host's network would be the host's loopback: refused.
        let mut refused = case.command_with("host-network", &extra, &["/bin/true"]);
        let out = refused.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no loopback of its own"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
);
