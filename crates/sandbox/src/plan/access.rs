//! Landlock rules that mirror the mount view.

use substrat_policy::model::LandlockMode;

use super::{Access, LandlockAccess, LandlockPlan, LandlockRule, MountStep};

/// Landlock mirrors the mount view: what is mounted read-only may be read
/// and executed, what is writable may be written; nothing else exists.
/// TCP is not handled: a sandbox with its own network namespace has only
/// its own loopback (test servers on 127.0.0.1 work, nothing outside is
/// reachable), and one on the host's network was asked for.
pub fn landlock_plan(mode: LandlockMode, fs_mounts: &[MountStep]) -> LandlockPlan {
    let mut rules = Vec::new();
    for step in fs_mounts {
        match step {
            MountStep::Bind { target, access, .. } => rules.push(LandlockRule {
                path: target.clone(),
                access: match access {
                    Access::Ro => LandlockAccess::ReadExec,
                    Access::Rw => LandlockAccess::ReadWriteExec,
                },
            }),
            MountStep::Tmpfs { target, .. } => rules.push(LandlockRule {
                path: target.clone(),
                access: LandlockAccess::ReadWriteExec,
            }),
            _ => {}
        }
    }
    rules.push(LandlockRule {
        path: "/".into(),
        access: LandlockAccess::ListDirs,
    });
    rules.push(LandlockRule {
        path: "/dev".into(),
        access: LandlockAccess::Device,
    });
    rules.push(LandlockRule {
        path: "/proc".into(),
        access: LandlockAccess::Proc,
    });
    LandlockPlan {
        mode,
        rules,
        scope: true,
    }
}
