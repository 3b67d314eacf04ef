//! Arbitrary bytes as a bundle's config.json (substrat-oci): parsed, then
//! translated into a launch plan. Invariants: neither step panics; a
//! refusal names a field; an accepted configuration never weakens the
//! walls: every namespace is new (user and cgroup included, nested ones
//! off) but the net, ipc and uts ones joined by clean paths, the one
//! id inside maps to the runtime's unprivileged id, a seccomp filter is
//! always there, Landlock is required, cgroup limits are required; the
//! root filesystem is the bundle's, bound first; every mount target is
//! absolute and clean; read-only root is the last step; the command is not
//! empty and the environment's names hold no `=`.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use substrat_oci::translate::{HostIds, translate};
use substrat_policy::model::{LandlockMode, LimitEnforcement};
use substrat_sandbox::plan::{JoinedKind, MountStep};

const IDS: HostIds = HostIds {
    uid: 231_072,
    gid: 231_072,
};

fn clean(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = substrat_oci::spec::parse(data) else { return };
    let bundle = Path::new("/bundle");
    let translated = match translate(&spec, bundle, IDS) {
        Ok(t) => t,
        Err(refused) => {
            assert!(!refused.field.is_empty() && !refused.reason.is_empty());
            return;
        }
    };
    let plan = &translated.plan;
    let ns = plan.namespaces;
    assert!(ns.user && ns.mount && ns.pid && ns.cgroup && !ns.nested_userns);
    // A namespace is the sandbox's own unless joined (only net, ipc, uts,
    // each by an absolute, clean path).
    let joins = |kind: JoinedKind| plan.joined.iter().any(|j| j.kind == kind);
    assert_eq!(ns.net, !joins(JoinedKind::Net));
    assert_eq!(ns.ipc, !joins(JoinedKind::Ipc));
    assert_eq!(ns.uts, !joins(JoinedKind::Uts));
    assert!(plan.joined.iter().all(|j| clean(&j.path)));
    // Always written (never the engine's own), never below 0.
    assert!(plan.oom_score_adj.is_some_and(|adj| adj <= 1000));
    assert_eq!((plan.uid_map.outside, plan.gid_map.outside), (IDS.uid, IDS.gid));
    assert!(plan.seccomp.is_some());
    assert_eq!(plan.landlock.mode, LandlockMode::Required);
    assert_eq!(plan.cgroup.enforcement, LimitEnforcement::Required);
    assert!(!plan.argv.is_empty());
    assert!(plan.env.iter().all(|(name, _)| !name.is_empty() && !name.contains('=')));
    assert!(clean(&plan.cwd));
    match plan.mounts.first() {
        Some(MountStep::Bind { source, target, .. }) => {
            assert!(source.starts_with(bundle), "{source:?}");
            assert_eq!(target, Path::new("/"));
        }
        other => panic!("the root filesystem is not first: {other:?}"),
    }
    for (index, step) in plan.mounts.iter().enumerate().skip(1) {
        match step {
            MountStep::Bind { source, target, .. } => {
                assert!(clean(source) && clean(target) && target != Path::new("/"));
            }
            MountStep::Tmpfs { target, size, .. } => {
                assert!(clean(target) && size.is_none_or(|s| s > 0));
            }
            MountStep::Dev { target }
            | MountStep::Proc { target }
            | MountStep::Sysfs { target }
            | MountStep::Mqueue { target }
            | MountStep::Mask { target }
            | MountStep::ReadOnly { target }
            | MountStep::Empty { target } => assert!(clean(target)),
            MountStep::RootReadOnly => assert_eq!(index + 1, plan.mounts.len()),
            MountStep::Protect { .. } => panic!("a configuration made a protected path"),
        }
    }
    assert!(plan.proxy.is_none() && plan.gateway.is_none() && plan.overlay.is_none() && !plan.terminal);
});
