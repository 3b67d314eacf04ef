//! The engine a daemon's turns ran on, recorded in its state directory
//! (`engine.json`): a daemon started again without `--engine`, or with
//! another engine, still finds and removes the containers its last run
//! left (a turn's workspace stays bound in one until it is removed).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ContainerEngine, EngineKind};

const FILE: &str = "engine.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Recorded {
    /// `podman` or `containerd`.
    engine: String,
    program: PathBuf,
    runtime: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    address: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
}

impl Recorded {
    fn of(engine: &ContainerEngine) -> Self {
        let (address, namespace) = match &engine.kind {
            EngineKind::Podman => (None, None),
            EngineKind::Containerd { address, namespace } => {
                (Some(address.clone()), Some(namespace.clone()))
            }
        };
        Self {
            engine: engine.name().to_string(),
            program: engine.program.clone(),
            runtime: engine.runtime.clone(),
            address,
            namespace,
        }
    }

    fn engine(self) -> Option<ContainerEngine> {
        let kind = match (self.engine.as_str(), self.address, self.namespace) {
            ("podman", _, _) => EngineKind::Podman,
            ("containerd", Some(address), Some(namespace)) => {
                EngineKind::Containerd { address, namespace }
            }
            _ => return None,
        };
        Some(ContainerEngine::new(kind, self.program, self.runtime))
    }
}

/// The engine the state directory records, when it is not `current`
/// (whose own sweep covers it): its containers are this daemon's too.
pub fn recorded_other(
    state_dir: &Path,
    current: Option<&ContainerEngine>,
) -> Option<ContainerEngine> {
    let bytes = std::fs::read(state_dir.join(FILE)).ok()?;
    let recorded: Recorded = match serde_json::from_slice(&bytes) {
        Ok(recorded) => recorded,
        Err(e) => {
            tracing::error!(error = %e, "{FILE} in the state directory cannot be read");
            return None;
        }
    };
    if current.is_some_and(|c| Recorded::of(c) == recorded) {
        return None;
    }
    let engine = recorded.clone().engine();
    if engine.is_none() {
        tracing::error!(?recorded, "{FILE} names no engine this daemon knows");
    }
    engine
}

/// Records `engine` as the one this daemon's turns run on (none: the
/// record removed, nothing of an engine left to sweep).
pub fn record(state_dir: &Path, engine: Option<&ContainerEngine>) -> std::io::Result<()> {
    let path = state_dir.join(FILE);
    let Some(engine) = engine else {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let text = serde_json::to_string(&Recorded::of(engine)).map_err(std::io::Error::other)?;
    super::write_private(&path, &text, 0o600).map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_engine_is_found_again_unless_it_is_the_current_one() {
        let dir = tempfile::tempdir().unwrap();
        let ctrd = ContainerEngine::new(
            EngineKind::Containerd {
                address: "/run/c.sock".into(),
                namespace: "ns".into(),
            },
            "ctr".into(),
            "/usr/bin/substrat-oci".into(),
        );
        assert!(recorded_other(dir.path(), None).is_none());
        record(dir.path(), Some(&ctrd)).unwrap();
        assert!(recorded_other(dir.path(), Some(&ctrd)).is_none());
        let found = recorded_other(dir.path(), None).unwrap();
        assert_eq!(found.kind, ctrd.kind);
        assert_eq!(found.program, ctrd.program);
        let podman = ContainerEngine::new(EngineKind::Podman, "podman".into(), "oci".into());
        assert_eq!(
            recorded_other(dir.path(), Some(&podman)).unwrap().kind,
            ctrd.kind
        );
        record(dir.path(), None).unwrap();
        assert!(recorded_other(dir.path(), None).is_none());
    }
}
