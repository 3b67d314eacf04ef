//! Host Unix sockets a bind would put in a sandbox's view: the bounded scan
//! lives with the policy crate, whose `check` uses it too.

pub use substrat_policy::sockets::{SCAN_DEPTH, SCAN_ENTRIES, SocketScan, unix_sockets_at};
