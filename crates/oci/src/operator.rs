//! The operator's side of a container: the runtime's configuration file,
//! the substrat policies it and the container name (loaded from the
//! operator's `policy_dir` or the built-ins, never from the bundle), and
//! the run report written where the operator said.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use substrat_oci::runtime_config::{
    self, DEFAULT_CONFIG, GrantedMode, MAX_CONFIG_BYTES, RuntimeConfig,
};
use substrat_policy::{LoadOptions, LoadedPolicy, load_builtin, load_file};
use substrat_sandbox::plan::{Access, AgentBind};
use substrat_sandbox::report::RunReport;

/// The configuration, and the file it came from (forwarded to the
/// launchers this program starts).
#[derive(Debug, Clone, Default)]
pub struct Operator {
    pub path: Option<PathBuf>,
    pub config: RuntimeConfig,
    /// Grants skipped as the configuration was read (a place that does
    /// not exist): logged by `create`.
    pub skipped: Vec<String>,
}

impl Operator {
    /// `explicit` (it must exist), else the default file when present.
    pub fn load(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(path) => path.to_path_buf(),
            None if Path::new(DEFAULT_CONFIG).exists() => PathBuf::from(DEFAULT_CONFIG),
            None => return Ok(Self::default()),
        };
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|file| {
                file.take(MAX_CONFIG_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
            })
            .with_context(|| format!("cannot read the configuration {}", path.display()))?;
        let mut config = RuntimeConfig::parse(&bytes)
            .with_context(|| format!("configuration {}", path.display()))?;
        let skipped = config
            .resolve()
            .with_context(|| format!("configuration {}", path.display()))?;
        Ok(Self {
            path: Some(path),
            config,
            skipped,
        })
    }

    /// Each named policy, loaded: `NAME.toml` in `policy_dir`, else the
    /// built-in policy of that name.
    pub fn policies(&self, names: &[String]) -> Result<Vec<LoadedPolicy>> {
        let options = LoadOptions {
            policy_dirs: self.config.policy_dir.iter().cloned().collect(),
            seccomp_dirs: Vec::new(),
        };
        names
            .iter()
            .map(|name| {
                runtime_config::check_policy_name(name).map_err(anyhow::Error::msg)?;
                let loaded = match substrat_policy::load::named_policy_file(
                    name,
                    &options.policy_dirs,
                ) {
                    Some(file) => load_file(&file, &options),
                    None => match load_builtin(name, &options) {
                        Some(loaded) => loaded,
                        None => bail!(
                            "policy `{name}`: not in the policy directory ({}) and not a built-in \
                             policy (worker, reviewer, strict, upstream)",
                            self.config
                                .policy_dir
                                .as_ref()
                                .map_or("none configured".into(), |d| d.display().to_string())
                        ),
                    },
                };
                loaded.map_err(|errors| anyhow::anyhow!("policy `{name}`: {errors}"))
            })
            .collect()
    }

    /// The configuration's `agent_binds`, as the plan's agent binds (the
    /// target stands for the source: only Landlock reads them).
    pub fn granted_binds(&self) -> Vec<AgentBind> {
        self.config
            .agent_binds
            .iter()
            .map(|bind| AgentBind {
                source: bind.target.clone(),
                target: bind.target.clone(),
                access: match bind.mode {
                    GrantedMode::Ro => Access::Ro,
                    GrantedMode::Rw => Access::Rw,
                },
            })
            .collect()
    }

    /// Writes the run report to `report_dir/ID.json`, when configured.
    pub fn write_report(&self, id: &str, report: &ContainerReport<'_>) -> Result<()> {
        let Some(dir) = &self.config.report_dir else {
            return Ok(());
        };
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot make the report directory {}", dir.display()))?;
        let path = dir.join(format!("{id}.json"));
        let partial = dir.join(format!(".{id}.json.partial"));
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(&partial, text + "\n")
            .and_then(|()| std::fs::rename(&partial, &path))
            .with_context(|| format!("cannot write the run report {}", path.display()))
    }
}

/// What `report_dir/ID.json` holds: the container, the policies on top of
/// its configuration, what was stricter or not applied, and the run
/// report `substrat-run --report` writes.
#[derive(Debug, Serialize)]
pub struct ContainerReport<'a> {
    pub container_id: &'a str,
    pub bundle: &'a Path,
    pub policies: &'a [String],
    pub notes: &'a [String],
    #[serde(flatten)]
    pub run: RunReport<'a>,
}
