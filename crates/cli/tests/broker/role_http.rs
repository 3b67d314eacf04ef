//! `daemon --roles-http`: a flood of connections that never finish their
//! request head (some silent, some sending a byte at a time) takes no slot
//! of the operator's: the operator's request with the token answers at
//! once, and the slow ones are closed within the head's timeout.

use std::net::TcpStream;

use super::*;

const TOKEN: &str = "roles-http-token-of-this-test-0123";
/// More than the daemon lets wait for their head (64) or hold a slot (32).
const SLOW: usize = 100;

fn roles_http_daemon(port: u16) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin())
        .args(["daemon", "--provider", "none"])
        .args(["--roles-http", &format!("127.0.0.1:{port}")])
        .args(["--roles-http-token-env", "SUBSTRAT_TEST_ROLES_TOKEN"])
        .arg("--policies")
        .arg(repo().join("tests/broker/policies"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .env("SUBSTRAT_TEST_ROLES_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "no listener");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon { dir, child }
}

/// `GET /agents/list` with `auth` (a whole head): the status line and how
/// long the answer took.
fn request(port: u16, auth: &str) -> (String, Duration) {
    let start = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET /agents/list HTTP/1.1\r\nHost: x\r\n{auth}Connection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    let status = reply.lines().next().unwrap_or_default().to_string();
    (status, start.elapsed())
}

/// Whether the daemon closed `stream` (EOF or reset), waiting up to `until`.
fn closed_by(stream: &mut TcpStream, until: Instant) -> bool {
    let left = until.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .unwrap();
    let mut byte = [0u8; 64];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn a_flood_of_slow_heads_leaves_the_operator_its_slot_and_is_closed() {
    let port = free_port();
    let _daemon = roles_http_daemon(port);
    // Half silent, half sending their head a byte at a time, never ending.
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            if i % 2 == 1 {
                s.write_all(b"GET /agents/list HTTP/1.1\r\nX-Slow: ")
                    .unwrap();
            }
            s
        })
        .collect();
    let opened = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        let mut writers: Vec<TcpStream> = slow
            .iter()
            .skip(1)
            .step_by(2)
            .map(|s| s.try_clone().unwrap())
            .collect();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for w in &mut writers {
                    let _ = w.write_all(b"a");
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // A request without the token is answered, and takes nothing.
    let (status, _) = request(port, "");
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    // Nor does a head past 16 KiB, with the token at its end.
    let padding = format!("X-Pad: {}\r\n", "p".repeat(20 << 10));
    let (status, _) = request(port, &format!("{padding}Authorization: Bearer {TOKEN}\r\n"));
    assert!(status.starts_with("HTTP/1.1 431"), "{status}");
    let (status, took) = request(port, &format!("Authorization: Bearer {TOKEN}\r\n"));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        took < Duration::from_secs(2),
        "the operator waited {took:?} behind {SLOW} slow connections"
    );
    // Every slow one is closed within the head's 5 s (and a margin).
    let until = opened + Duration::from_secs(8);
    let open: Vec<usize> = (0..SLOW)
        .filter(|i| !closed_by(&mut slow[*i], until))
        .collect();
    assert!(
        open.is_empty(),
        "{} of {SLOW} slow connections still open after {:?}: {open:?}",
        open.len(),
        opened.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = trickle.join();
}
