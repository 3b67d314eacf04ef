//! Landlock rules that mirror the mount view.

use substrat_policy::model::LandlockMode;

use super::{Access, LandlockAccess, LandlockPlan, LandlockRule, MountStep, SocketUse};

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
        unix_connect: false,
    }
}

/// The first Landlock ABI with a right for connect(2) to a pathname socket.
pub const LANDLOCK_UNIX_CONNECT_ABI: u32 = 9;

/// On a kernel whose Landlock has the right (`abi` 9 and later), connect
/// to a pathname Unix socket is handled and granted only on the binds
/// that are sockets the command may reach (`SocketUse::Connect`: the
/// policy's marked binds, the launcher's broker, proxy and gateway
/// sockets). Below, `plan` is returned as it is: Landlock cannot stop a
/// connect there, which is why unmarked socket binds are refused.
pub fn with_unix_connect(mut plan: LandlockPlan, mounts: &[MountStep], abi: u32) -> LandlockPlan {
    if abi < LANDLOCK_UNIX_CONNECT_ABI || plan.mode == LandlockMode::Off {
        return plan;
    }
    plan.unix_connect = true;
    for step in mounts {
        if let MountStep::Bind {
            target,
            socket: SocketUse::Connect,
            ..
        } = step
        {
            plan.rules.push(LandlockRule {
                path: target.clone(),
                access: LandlockAccess::Connect,
            });
        }
    }
    plan
}
