//! Arbitrary bytes as a bundle's config.json (substrat-oci): parsed, then
//! translated into a launch plan. Invariants: neither step panics; a
//! refusal names a field; an accepted configuration never weakens the
//! walls: every namespace is new (user and cgroup included, nested ones
//! off) but the net, ipc and uts ones joined by clean paths, the one
//! id inside maps to the runtime's unprivileged id, a seccomp filter is
//! always there, Landlock is required, cgroup limits are required; the
//! root filesystem is the bundle's, bound first; every mount target is
//! absolute and clean; read-only root is the last step; the command is not
//! empty and the environment's names hold no `=`. Then `worker` on top
//! (`layer`): it is refused with a field, or it only adds: the network is
//! the container's own, one layer with a filter and required Landlock,
//! every limit at most what it was, the mounts unchanged but for
//! protected paths, each after the writable bind it is in, every writable
//! volume keeping all of worker's.
//!
//! The same JSON is also read as `update --resources` (`linux.resources`):
//! no panic; a limit taken is above 0; one that passes a policy's ceiling
//! check is at most that ceiling, never "no limit".
//!
//! Input not starting with `{` is the operator's runtime configuration
//! (TOML): a parsed one names a policy by a plain name, absolute
//! directories and clean absolute agent binds.
#![no_main]

use std::path::{Component, Path};

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use substrat_oci::layer::{PolicyPaths, apply_policy};
use substrat_oci::runtime_config::{RuntimeConfig, check_policy_name};
use substrat_oci::spec::Spec;
use substrat_oci::translate::{HostIds, Translated, translate};
use substrat_policy::model::{LandlockMode, LimitEnforcement};
use substrat_sandbox::plan::{Access, JoinedKind, MountStep};

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
    if data.first() != Some(&b'{') {
        runtime_config(data);
        return;
    }
    update_resources(data);
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
    // The default profile is always one of the filters: alone, or in the
    // one layer after the configuration's own.
    assert!(plan.seccomp_filters().any(|s| s.name == "default"));
    assert!(plan.layers.len() <= 1);
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
    assert!(plan.proxy.is_none() && plan.gateway.is_none() && plan.overlay.is_none());
    assert_eq!(plan.terminal, spec.process.as_ref().is_some_and(|p| p.terminal));
    worker_on_top(&spec, &translated);
});

fn runtime_config(data: &[u8]) {
    let Ok(config) = RuntimeConfig::parse(data) else { return };
    assert!(config.policy.as_deref().is_none_or(|name| check_policy_name(name).is_ok()));
    assert!(config.policy_dir.as_ref().is_none_or(|d| d.is_absolute()));
    assert!(config.report_dir.as_ref().is_none_or(|d| d.is_absolute()));
    assert!(config.agent_binds.iter().all(|b| clean(&b.target)));
}

fn worker_on_top(spec: &Spec, before: &Translated) {
    static WORKER: OnceLock<substrat_policy::LoadedPolicy> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        match substrat_policy::load_builtin("worker", &Default::default()) {
            Some(Ok(policy)) => policy,
            _ => panic!("worker does not load"),
        }
    });
    let mut after = before.clone();
    let applied = PolicyPaths::of(spec).and_then(|paths| apply_policy(&mut after, worker, &paths));
    if let Err(refused) = applied {
        assert!(!refused.field.is_empty() && !refused.reason.is_empty());
        return;
    }
    let (old, new) = (&before.plan, &after.plan);
    assert!(new.namespaces.net && !new.joined.iter().any(|j| j.kind == JoinedKind::Net));
    assert_eq!(new.layers.len(), old.layers.len() + 1);
    assert_eq!(new.layers[..old.layers.len()], old.layers[..]);
    let worker_layer = new.layers.last().expect("the policy's layer");
    assert!(worker_layer.seccomp.is_some());
    assert_eq!(worker_layer.landlock.mode, LandlockMode::Required);
    assert_eq!((new.seccomp.as_ref(), &new.landlock), (old.seccomp.as_ref(), &old.landlock));
    let at_most = |a: Option<u64>, b: Option<u64>| b.is_none_or(|b| a.is_some_and(|a| a <= b));
    assert!(at_most(new.cgroup.pids_max, old.cgroup.pids_max));
    assert!(at_most(new.cgroup.memory_max, old.cgroup.memory_max));
    for limit in &old.rlimits {
        let kept = new.rlimits.iter().find(|l| l.kind == limit.kind);
        assert!(kept.is_some_and(|l| l.value <= limit.value));
    }
    // The mounts as they were, with protected paths added, each after the
    // writable bind (not the root) it is in.
    let kept: Vec<&MountStep> = new
        .mounts
        .iter()
        .filter(|m| !matches!(m, MountStep::Protect { .. }))
        .collect();
    assert_eq!(kept, old.mounts.iter().collect::<Vec<_>>());
    for (index, step) in new.mounts.iter().enumerate() {
        let MountStep::Protect { source, target, .. } = step else { continue };
        let writable = new.mounts[..index].iter().any(|m| {
            matches!(m, MountStep::Bind { source: s, target: t, access: Access::Rw, .. }
                if s == source && t == target && t != Path::new("/"))
        });
        assert!(writable, "a protected path outside a writable bind: {step:?}");
    }
    // Nothing is granted here: every writable volume keeps all of worker's
    // protected paths.
    let wanted = worker.policy.filesystem.protected_paths().len();
    for step in &old.mounts {
        let MountStep::Bind { target, access: Access::Rw, .. } = step else { continue };
        if target == Path::new("/") {
            continue;
        }
        let kept = new
            .mounts
            .iter()
            .filter(|m| matches!(m, MountStep::Protect { target: t, .. } if t == target))
            .count();
        assert!(kept >= wanted, "{target:?} keeps {kept} of {wanted} protected paths");
    }
}

/// `update --resources`: a parsed update passes a policy's ceilings only
/// when every limit it sets is within them.
fn update_resources(data: &[u8]) {
    use substrat_oci::update::{Setting, check_policies, parse};
    let Ok(asked) = parse(data) else { return };
    for setting in [asked.pids, asked.memory, asked.cpu_quota].into_iter().flatten() {
        assert!(setting != Setting::Limit(0));
    }
    let ceiling = substrat_sandbox::plan::CgroupLimits {
        pids_max: Some(128),
        memory_max: Some(1 << 30),
        cpu_max: Some(1.0),
        enforcement: LimitEnforcement::Required,
    };
    if check_policies(&asked, &[("strict".into(), ceiling)]).is_ok() {
        let within = |s: Option<Setting>, max: u64| match s {
            None => true,
            Some(Setting::Limit(n)) => n <= max,
            Some(Setting::Unlimited) => false,
        };
        assert!(within(asked.pids, 128) && within(asked.memory, 1 << 30));
        if let Some(quota) = asked.cpu_quota {
            let period = asked.cpu_period.unwrap_or(100_000);
            assert!(within(Some(quota), period.saturating_add(1)));
        }
    }
}
