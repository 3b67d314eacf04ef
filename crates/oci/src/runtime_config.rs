//! The operator's configuration of the runtime (`--config`, by default
//! /etc/substrat/oci.toml): which substrat policy every container
//! gets on top of its own configuration, where named policies are found,
//! and where run reports go. A container's author cannot change it; what
//! a container may add (`io.substrat.policy`) only adds restrictions.

use std::path::PathBuf;

use serde::Deserialize;

/// Where the configuration is read when `--config` is not given. Missing
/// is fine there (no policy, no reports); a `--config` that is missing is
/// an error.
pub const DEFAULT_CONFIG: &str = "/etc/substrat/oci.toml";

/// The annotation naming a policy to apply on top of the configuration.
pub const POLICY_ANNOTATION: &str = "io.substrat.policy";
/// The annotation naming the workspace inside (`${WORKSPACE}` of the
/// policy); the process's working directory when absent.
pub const WORKSPACE_ANNOTATION: &str = "io.substrat.workspace";

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// A policy every container gets on top of its configuration (a name:
    /// `NAME.toml` in `policy_dir`, else a built-in policy).
    pub policy: Option<String>,
    /// Where policy names (this file's and `io.substrat.policy`'s) are
    /// looked up before the built-ins.
    pub policy_dir: Option<PathBuf>,
    /// A run report per container, `DIR/ID.json`, written when it ends.
    pub report_dir: Option<PathBuf>,
    /// Paths the engine binds for an agent (`substrat-sandbox daemon
    /// --engine` writes them: its socket, relay, home, chats): the
    /// policies' Landlock rules allow them as `substrat-run` allows its
    /// agent binds. The operator's, never a container's.
    #[serde(default)]
    pub agent_binds: Vec<GrantedBind>,
    /// Protected host places (a system directory, a home, a credential
    /// store) containers may bind all the same, e.g. a `hostPath` volume
    /// the node's pods need: the place and everything below it.
    #[serde(default)]
    pub allow_host_paths: Vec<PathBuf>,
    /// Host paths shown to containers through an idmapped mount, where
    /// container root acts as host root (owns root's files, connects to
    /// root's sockets): the place and everything below it. Any other host
    /// path (the container's own engine files aside) is shown as it is,
    /// the container an unprivileged stranger there.
    #[serde(default)]
    pub idmap_host_paths: Vec<PathBuf>,
    /// The most pseudo-terminals each container may open (its devpts's
    /// `max=`; `substrat_sandbox::plan::DEFAULT_MAX_PTYS` when absent).
    pub max_ptys: Option<u32>,
}

/// The largest `max_ptys`: the kernel's own bound on a devpts instance.
pub const MAX_PTYS_LIMIT: u32 = 1 << 20;

/// A path inside the container a policy's Landlock rules allow.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantedBind {
    pub target: PathBuf,
    pub mode: GrantedMode,
    /// The bind is a Unix socket the command may connect to (the agent's
    /// broker socket): a socket source is refused otherwise.
    #[serde(default)]
    pub socket: bool,
    /// The socket granted at `target` (required with `socket = true`): a
    /// bind there of any other socket is refused, judged on the opened
    /// descriptor (its device and inode, `source_inode`).
    #[serde(default)]
    pub source: Option<PathBuf>,
    /// `source`'s device and inode, resolved once when the configuration
    /// is read (`RuntimeConfig::resolve`).
    #[serde(skip)]
    pub source_inode: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantedMode {
    Ro,
    Rw,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("not UTF-8")]
    NotText,
    #[error("{0}")]
    Toml(String),
    #[error("{key}: {reason}")]
    Value { key: &'static str, reason: String },
}

impl RuntimeConfig {
    /// Checks the host paths once, as the configuration is read, and says
    /// which entries were skipped. An `allow_host_paths` or
    /// `idmap_host_paths` entry is taken as written, never through a link
    /// (a link planted at or above it would make it `/`): one with a link
    /// in its path, one in a group- or world-writable directory (a sticky
    /// one aside, when the entry in it is root's), and an
    /// idmap entry that is `/` or a system root (`host_paths`) are refused;
    /// one that does not exist is skipped, said in the returned notes (a
    /// place made later does not fail every create). Each granted
    /// socket's source is resolved to its device and inode.
    pub fn resolve(&mut self) -> Result<Vec<String>, ConfigError> {
        let mut skipped = Vec::new();
        for (key, paths) in [
            ("allow_host_paths", &mut self.allow_host_paths),
            ("idmap_host_paths", &mut self.idmap_host_paths),
        ] {
            let mut kept = Vec::new();
            for path in paths.drain(..) {
                if key == "idmap_host_paths"
                    && let Some(place) = crate::host_paths::system_root(&path)
                {
                    return Err(ConfigError::Value {
                        key,
                        reason: format!(
                            "{} is or holds the system place {}: container root would act as \
                             host root on it",
                            path.display(),
                            place.display()
                        ),
                    });
                }
                match crate::grant_paths::check(&path) {
                    Ok(true) => {}
                    Ok(false) => {
                        skipped.push(format!("{key}: {} does not exist; skipped", path.display()));
                        continue;
                    }
                    Err(reason) => return Err(ConfigError::Value { key, reason }),
                }
                kept.push(path);
            }
            *paths = kept;
        }
        for bind in &mut self.agent_binds {
            let Some(source) = &bind.source else { continue };
            let meta = std::fs::metadata(source).map_err(|e| ConfigError::Value {
                key: "agent_binds",
                reason: format!("source {} does not resolve: {e}", source.display()),
            })?;
            if bind.socket && !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                return Err(ConfigError::Value {
                    key: "agent_binds",
                    reason: format!("source {} is not a Unix socket", source.display()),
                });
            }
            bind.source_inode = Some((
                std::os::unix::fs::MetadataExt::dev(&meta),
                std::os::unix::fs::MetadataExt::ino(&meta),
            ));
        }
        Ok(skipped)
    }

    /// Parses and checks the configuration's text.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError::NotText)?;
        let config: Self = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        if let Some(name) = &config.policy {
            check_policy_name(name).map_err(|reason| ConfigError::Value {
                key: "policy",
                reason,
            })?;
        }
        if config
            .max_ptys
            .is_some_and(|n| n == 0 || n > MAX_PTYS_LIMIT)
        {
            return Err(ConfigError::Value {
                key: "max_ptys",
                reason: format!("must be 1 to {MAX_PTYS_LIMIT}"),
            });
        }
        for (key, paths) in [
            ("allow_host_paths", &config.allow_host_paths),
            ("idmap_host_paths", &config.idmap_host_paths),
        ] {
            if paths.iter().any(|p| !clean_absolute(p)) {
                return Err(ConfigError::Value {
                    key,
                    reason: "must be absolute paths without `.` or `..`".into(),
                });
            }
        }
        if let Some(bind) = config
            .agent_binds
            .iter()
            .find(|b| b.socket && b.source.is_none())
        {
            return Err(ConfigError::Value {
                key: "agent_binds",
                reason: format!(
                    "the socket granted at {} needs its source (the socket on the host)",
                    bind.target.display()
                ),
            });
        }
        let granted = config
            .agent_binds
            .iter()
            .flat_map(|b| [Some(&b.target), b.source.as_ref()]);
        let dirs = [&config.policy_dir, &config.report_dir].map(Option::as_ref);
        let keys = ["policy_dir", "report_dir"]
            .into_iter()
            .chain(std::iter::repeat("agent_binds"));
        for (key, dir) in keys.zip(dirs.into_iter().chain(granted)) {
            if dir.is_some_and(|d| !clean_absolute(d)) {
                return Err(ConfigError::Value {
                    key,
                    reason: "must be an absolute path without `.` or `..`".into(),
                });
            }
        }
        Ok(config)
    }
}

fn clean_absolute(path: &std::path::Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// A policy is named, never given as a path: letters, digits, `-`, `_`.
/// A container's annotation must not reach a file the operator did not
/// put in `policy_dir`.
pub fn check_policy_name(name: &str) -> Result<(), String> {
    if substrat_policy::valid_role_name(name) && name.len() <= 64 {
        Ok(())
    } else {
        Err(format!(
            "policy `{}`: a policy name (letters, digits, `-`, `_`, at most 64), not a path",
            name.escape_debug()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<RuntimeConfig, ConfigError> {
        let mut config = RuntimeConfig::parse(text.as_bytes())?;
        config.resolve()?;
        Ok(config)
    }

    /// Issue 44: a grant was canonicalised at each read, so a link planted
    /// at it (grant_link.sh: nobody's `/var/tmp/shared -> /`) made it `/`.
    /// A grant is taken as written: a link in it is refused, a missing
    /// entry skipped and said, `/` and system roots never idmapped.
    #[test]
    fn atk_host_path_grants_are_taken_as_written() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: the grants' directories are root's, as the node's");
            return;
        }
        let dir = tempfile::tempdir().expect("dir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("real");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).expect("link");
        for key in ["allow_host_paths", "idmap_host_paths"] {
            let config = parsed(&format!("{key} = [\"{}\"]\n", real.display())).expect("parses");
            let paths = match key {
                "allow_host_paths" => &config.allow_host_paths,
                _ => &config.idmap_host_paths,
            };
            assert_eq!(paths, std::slice::from_ref(&real));
            let err = parsed(&format!("{key} = [\"{}\"]\n", link.display()))
                .expect_err("a link to / passed");
            assert!(err.to_string().contains("holds a link"), "{err}");
            let missing = format!("{key} = [\"{}/nowhere\"]\n", dir.path().display());
            let mut config = RuntimeConfig::parse(missing.as_bytes()).expect("parses");
            let skipped = config.resolve().expect("a missing entry is skipped");
            assert!(
                skipped[0].contains("does not exist; skipped"),
                "{skipped:?}"
            );
            assert!(config.allow_host_paths.is_empty() && config.idmap_host_paths.is_empty());
            let dotted = format!("{key} = [\"{}/real/..\"]\n", dir.path().display());
            assert!(parsed(&dotted).is_err(), "`..` passed");
        }
        for root in [
            "/",
            "/etc",
            "/var",
            "/var/lib",
            "/etc/ssh/x",
            "/run/containerd",
            "/home",
        ] {
            let err = parsed(&format!("idmap_host_paths = [\"{root}\"]\n"))
                .expect_err(&format!("{root} idmapped"));
            assert!(err.to_string().contains("system place"), "{root}: {err}");
        }
        assert!(parsed("allow_host_paths = [\"/etc\"]\n").is_ok());
    }

    /// Issue 44: `socket = true` was keyed on the target alone. A grant now
    /// names its source, a socket, resolved to its device and inode.
    #[test]
    fn a_socket_grant_names_its_source_socket() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("broker.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("socket");
        let grant = |source: &str| {
            format!(
                "agent_binds = [{{ target = \"/run/b.sock\", mode = \"ro\", socket = true{source} }}]\n"
            )
        };
        let err = parsed(&grant("")).expect_err("a grant without its source passed");
        assert!(err.to_string().contains("needs its source"), "{err}");
        let config = parsed(&grant(&format!(", source = \"{}\"", socket.display()))).expect("ok");
        let meta = std::fs::metadata(&socket).expect("meta");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            config.agent_binds[0].source_inode,
            Some((meta.dev(), meta.ino()))
        );
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("file");
        let err = parsed(&grant(&format!(", source = \"{}\"", file.display())))
            .expect_err("a file granted as a socket passed");
        assert!(err.to_string().contains("is not a Unix socket"), "{err}");
    }

    #[test]
    fn max_ptys_is_between_one_and_the_kernels_bound() {
        let parse = |n: u64| RuntimeConfig::parse(format!("max_ptys = {n}\n").as_bytes());
        assert_eq!(parse(16).ok().and_then(|c| c.max_ptys), Some(16));
        let limit = u64::from(MAX_PTYS_LIMIT);
        assert_eq!(
            parse(limit).ok().and_then(|c| c.max_ptys),
            Some(MAX_PTYS_LIMIT)
        );
        for refused in [0, limit + 1] {
            assert!(
                matches!(
                    parse(refused),
                    Err(ConfigError::Value {
                        key: "max_ptys",
                        ..
                    })
                ),
                "{refused}"
            );
        }
        assert_eq!(
            RuntimeConfig::parse(b"").ok().map(|c| c.max_ptys),
            Some(None)
        );
    }
}
