//! What the benchmark examples share: where the binaries are, and the
//! daemon's control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The build's directory (`target/release`): the examples run from its
/// `examples/`, beside the binaries they start.
pub fn target_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One request on the daemon's control socket; its reply, which must be
/// `ok`.
pub fn control(state: &Path, request: Value) -> Value {
    let mut s = UnixStream::connect(state.join("control.sock")).unwrap();
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["ok"], true, "{request}: {reply}");
    reply
}
