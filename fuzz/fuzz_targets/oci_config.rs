//! Arbitrary bytes as a bundle's config.json (substrat-oci): parsed, then
//! translated into a launch plan. Invariants: neither step panics; a
//! refusal names a field; an accepted configuration never weakens the
//! walls: every namespace is new (user included, nested ones off), the one
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
use substrat_sandbox::plan::MountStep;

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
    assert!(ns.user && ns.mount && ns.pid && ns.ipc && ns.uts && ns.net && !ns.nested_userns);
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
            MountStep::Tmpfs { target, .. } | MountStep::Dev { target } | MountStep::Proc { target } => {
                assert!(clean(target))
            }
            MountStep::RootReadOnly => assert_eq!(index + 1, plan.mounts.len()),
            MountStep::Protect { .. } => panic!("a configuration made a protected path"),
        }
    }
    assert!(plan.proxy.is_none() && plan.gateway.is_none() && plan.overlay.is_none() && !plan.terminal);
});
