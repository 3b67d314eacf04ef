//! What the prover sets up on the host for one run of the battery, and
//! looks at after it: a workspace with protected paths, a secret file and a
//! directory outside every bind, a Unix and an abstract socket, a TCP
//! server on every address, a marked process, and a secret in the
//! launcher's environment. Everything is removed when dropped.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

#[derive(Debug)]
pub struct Fixtures {
    pub root: PathBuf,
    pub ws: PathBuf,
    pub outside: PathBuf,
    pub outside_dir: PathBuf,
    pub socket: PathBuf,
    pub abstract_name: String,
    pub port: u16,
    pub host_ip: Option<std::net::IpAddr>,
    pub marker: String,
    pub marker_pid: u32,
    pub secret: String,
    /// Kept alive for the run.
    _unix: UnixListener,
    _abstract: UnixListener,
    _tcp: std::net::TcpListener,
    marked: Child,
}

/// The protected paths' contents before the run, to compare after it.
const GIT_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";
const MCP_JSON: &str = "{\"mcpServers\":{}}\n";

impl Fixtures {
    pub fn new() -> Result<Self> {
        let token = unique();
        let root = std::env::temp_dir().join(format!("substrat-prove-{token}"));
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        // Canonical, as the binds' resolved sources it is compared with
        // (a temporary directory reached through a symlink).
        let root = root
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", root.display()))?;
        let ws = root.join("ws");
        std::fs::create_dir_all(ws.join(".git/hooks"))?;
        std::fs::create_dir_all(ws.join(".cursor"))?;
        std::fs::write(ws.join(".git/config"), GIT_CONFIG)?;
        std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n")?;
        std::fs::create_dir_all(ws.join(".git/objects"))?;
        std::fs::create_dir_all(ws.join(".git/refs"))?;
        std::fs::write(ws.join(".cursor/mcp.json"), MCP_JSON)?;
        let outside_dir = root.join("outside");
        std::fs::create_dir(&outside_dir)?;
        let outside = outside_dir.join("secret.txt");
        let secret = format!("substrat-prove-secret-{token}");
        std::fs::write(&outside, &secret)?;
        let socket = outside_dir.join("host.sock");
        let unix = UnixListener::bind(&socket).context("cannot listen on a host Unix socket")?;
        let abstract_name = format!("substrat-prove-{token}");
        let abstract_socket =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes())?)
                .context("cannot listen on a host abstract socket")?;
        let tcp = std::net::TcpListener::bind("0.0.0.0:0").context("cannot listen on TCP")?;
        let port = tcp.local_addr()?.port();
        let host_ip = substrat_proxy::own_addresses()
            .unwrap_or_default()
            .into_iter()
            .find(|ip| ip.is_ipv4() && !ip.is_loopback());
        let marker = format!("substrat-prove-marker-{token}");
        // The marker is the process's argv[0]: sleep takes no other words
        // (`sleep 600 MARKER` exits at once, leaving nothing to find).
        let mut marked = Command::new("sleep");
        std::os::unix::process::CommandExt::arg0(&mut marked, &marker);
        let marked = marked
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the marked host process (sleep)")?;
        wait_for_marker(marked.id(), &marker)?;
        Ok(Self {
            marker_pid: marked.id(),
            root,
            ws,
            outside,
            outside_dir,
            socket,
            abstract_name,
            port,
            host_ip,
            marker,
            secret,
            _unix: unix,
            _abstract: abstract_socket,
            _tcp: tcp,
            marked,
        })
    }

    /// The battery's KEY=VALUE arguments (marker and secret reversed, so
    /// no command line holds them as they are).
    /// `outside`: where the host file and its directory would be inside.
    pub fn battery_args(
        &self,
        outside: (PathBuf, PathBuf),
        memory_mib: Option<u64>,
        fsize: Option<u64>,
    ) -> Vec<String> {
        let reversed = |s: &str| s.chars().rev().collect::<String>();
        let mut args = vec![
            format!("ws={}", self.ws.display()),
            format!("outside={}", outside.0.display()),
            format!("outside_dir={}", outside.1.display()),
            format!("socket={}", self.socket.display()),
            format!("abstract={}", self.abstract_name),
            format!("port={}", self.port),
            format!(
                "host_ip={}",
                self.host_ip.map(|ip| ip.to_string()).unwrap_or_default()
            ),
            format!("marker={}", reversed(&self.marker)),
            format!("marker_pid={}", self.marker_pid),
            format!("secret={}", reversed(&self.secret)),
        ];
        if let Some(mib) = memory_mib {
            args.push(format!("memory_mib={mib}"));
        }
        if let Some(size) = fsize {
            args.push(format!("fsize={size}"));
        }
        args
    }

    /// The protected host paths the run changed.
    pub fn protected_changed(&self) -> Vec<String> {
        let mut changed = Vec::new();
        let differs = |rel: &str, before: &str| {
            std::fs::read_to_string(self.ws.join(rel)).ok().as_deref() != Some(before)
        };
        if differs(".git/config", GIT_CONFIG) {
            changed.push(".git/config".to_string());
        }
        if self
            .ws
            .join(".git/hooks/pre-commit")
            .symlink_metadata()
            .is_ok()
        {
            changed.push(".git/hooks/pre-commit".into());
        }
        let hooks_dir = self.ws.join(".git/hooks").symlink_metadata();
        if !hooks_dir.is_ok_and(|m| m.is_dir()) {
            changed.push(".git/hooks".into());
        }
        if differs(".cursor/mcp.json", MCP_JSON) {
            changed.push(".cursor/mcp.json".into());
        }
        changed
    }

    /// The file the battery tried to create outside every bind exists.
    pub fn outside_written(&self) -> bool {
        self.outside_dir.join("written-from-inside").exists()
    }

    pub fn git_state(&self) -> PathBuf {
        self.root.join("git-state")
    }

    pub fn report(&self) -> PathBuf {
        self.root.join("report.json")
    }

    /// Where the prover's own files go (outside every bind).
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        let _ = self.marked.kill();
        let _ = self.marked.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", std::process::id())
}

/// The marked process must be there to hide and to signal: the attacks on
/// it prove nothing against a process that has ended.
fn wait_for_marker(pid: u32, marker: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("the marked host process (sleep, pid {pid}) is not running");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
