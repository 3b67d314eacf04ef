//! Rules on what the policy binds: writable system and home trees, host
//! sockets and secrets, shared chats, protected paths.

use super::Emit;
use crate::load::LoadedPolicy;
use crate::model::Bind;
use crate::paths::{PathTemplate, PathVar};

/// Every bind as written, then, for each that `check` resolved on this
/// host to another path, the same bind with the resolved source: rules
/// judge what the kernel will enforce, not only the text (a finding for
/// either is reported once, at the bind).
pub(super) fn binds(p: &LoadedPolicy, e: &Emit<'_>) -> std::vec::IntoIter<(usize, Bind)> {
    let written = p.policy.filesystem.binds.iter().cloned().enumerate();
    let resolved: Vec<(usize, Bind)> = p
        .policy
        .filesystem
        .binds
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let r = e.resolved(i)?;
            let text = r.to_str()?;
            (text != b.source.as_str()).then(|| {
                let mut b = b.clone();
                b.source = PathTemplate::new(text);
                (i, b)
            })
        })
        .collect();
    written.chain(resolved).collect::<Vec<_>>().into_iter()
}

pub(super) fn bind_key(i: usize) -> String {
    format!("filesystem.binds[{i}]")
}

pub(super) fn t(s: &str) -> PathTemplate {
    PathTemplate::new(s)
}

pub(super) fn components(path: &PathTemplate) -> Vec<String> {
    path.normalized_components()
}

/// The source is `prefix` or lies below it.
pub(super) fn source_within(bind: &Bind, prefix: &str) -> bool {
    bind.source.is_within(&t(prefix))
}

/// The source is `prefix`, lies below it, or contains it (binding a parent
/// exposes the child too).
pub(super) fn source_exposes(bind: &Bind, path: &str) -> bool {
    source_within(bind, path) || t(path).is_within(&bind.source)
}

pub(super) fn source_is_root(bind: &Bind) -> bool {
    components(&bind.source) == [""]
}

/// `${HOME}`, `/root`, `/home` or `/home/<user>`: a whole home directory.
pub(super) fn is_home_dir(path: &PathTemplate) -> bool {
    let c = components(path);
    let c: Vec<&str> = c.iter().map(String::as_str).collect();
    matches!(
        c.as_slice(),
        ["${HOME}"] | ["", "root"] | ["", "home"] | ["", "home", _]
    )
}

pub(super) fn writable_root(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| b.writable() && source_is_root(b)) {
        e.at(
            &bind_key(i),
            format!("`/` is bound read-write at `{}`", b.target()),
        );
    }
}

pub(super) fn writable_home(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| b.writable() && is_home_dir(&b.source)) {
        e.at(
            &bind_key(i),
            format!("home directory `{}` is bound read-write", b.source),
        );
    }
}

pub(super) const SYSTEM_DIRS: [&str; 12] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/opt",
    "/var", "/snap",
];

pub(super) fn writable_system_dir(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| b.writable() && !source_is_root(b)) {
        if let Some(dir) = SYSTEM_DIRS.iter().find(|d| source_exposes(b, d)) {
            e.at(
                &bind_key(i),
                format!(
                    "`{}` is bound read-write and exposes system directory `{dir}`",
                    b.source
                ),
            );
        }
    }
}

pub(super) fn source_text_matches(b: &Bind, needles: &[&str]) -> Option<String> {
    let s = b.source.as_str();
    needles
        .iter()
        .find(|n| s.contains(*n))
        .map(|n| n.to_string())
}

/// Text in a path that names a container runtime's socket or state (SBX005).
pub(crate) const CONTAINER_NEEDLES: [&str; 7] = [
    "docker.sock",
    "/containerd",
    "podman",
    "crio",
    "buildkit",
    "/run/docker",
    "/var/lib/docker",
];

/// Text in a path that names SSH or GPG keys or agents (SBX006).
pub(crate) const SSH_GPG_NEEDLES: [&str; 6] = [
    "ssh-agent",
    "/tmp/ssh-",
    "/.ssh",
    "/.gnupg",
    "gpg-agent",
    "keyring",
];

pub(super) fn container_socket(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e) {
        if let Some(what) = source_text_matches(b, &CONTAINER_NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` is a container runtime socket or directory ({what})",
                    b.source
                ),
            );
        }
    }
}

pub(super) fn ssh_or_gpg(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e) {
        if let Some(what) = source_text_matches(b, &SSH_GPG_NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` exposes SSH/GPG keys or agents ({what})",
                    b.source
                ),
            );
        }
    }
}

pub(super) fn display_server(p: &LoadedPolicy, e: &mut Emit<'_>) {
    const NEEDLES: [&str; 4] = [".X11-unix", ".Xauthority", "wayland-", "/.ICEauthority"];
    for (i, ref b) in binds(p, e) {
        if let Some(what) = source_text_matches(b, &NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` exposes the display server ({what})",
                    b.source
                ),
            );
        }
    }
}

pub(super) fn dbus(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e) {
        let c = components(&b.source);
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        let hit = b.source.as_str().contains("dbus")
            || matches!(
                c.as_slice(),
                ["", "run", "user", _, "bus"] | ["", "var", "run", "user", _, "bus"]
            );
        if hit {
            e.at(
                &bind_key(i),
                format!("bind source `{}` is a D-Bus socket or directory", b.source),
            );
        }
    }
}

pub(super) fn shared_chats(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e) {
        let per_agent = b.source.uses(PathVar::AgentId);
        let touches_chats = source_exposes(b, "${HOME}/.cursor/chats")
            || b.target().is_within(&t("${HOME}/.cursor"))
            || b.source.as_str().contains("/.cursor/chats");
        if touches_chats && !per_agent && !is_home_dir(&b.source) {
            e.at(
                &bind_key(i),
                format!(
                    "bind `{}` -> `{}` shares cursor-agent chats between agents",
                    b.source,
                    b.target()
                ),
            );
        }
    }
}

pub(super) fn has_writable_bind(p: &LoadedPolicy) -> bool {
    p.policy.filesystem.binds.iter().any(Bind::writable)
}

pub(super) fn protected_covers(p: &LoadedPolicy, wanted: &str) -> bool {
    p.policy.filesystem.protected_paths().iter().any(|entry| {
        t(&format!("/{wanted}")).is_within(&t(&format!("/{}", entry.trim_end_matches('/'))))
    })
}

pub(super) fn mcp_config_writable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if has_writable_bind(p) && !protected_covers(p, ".cursor") {
        e.at(
            "filesystem.protected",
            "`.cursor` is not protected: the agent can rewrite .cursor/mcp.json in its workspace",
        );
    }
    for (i, ref b) in binds(p, e).filter(|(_, b)| b.writable()) {
        if b.target().as_str().contains("/.cursor")
            && !b.target().is_within(&t("${HOME}/.cursor/chats"))
        {
            e.at(
                &bind_key(i),
                format!(
                    "`{}` is bound read-write inside a .cursor directory",
                    b.target()
                ),
            );
        }
    }
}

pub(super) fn missing_protected(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if !has_writable_bind(p) {
        return;
    }
    for wanted in [".git/hooks", ".git/config"] {
        if !protected_covers(p, wanted) {
            e.at(
                "filesystem.protected",
                format!("`{wanted}` is not protected in writable binds"),
            );
        }
    }
}

pub(super) fn host_kernel_interfaces(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| !source_is_root(b)) {
        if let Some(dir) = ["/proc", "/sys", "/dev"]
            .iter()
            .find(|d| source_exposes(b, d))
        {
            e.at(
                &bind_key(i),
                format!("bind source `{}` exposes the host's {dir}", b.source),
            );
        }
    }
}

pub(super) fn host_runtime_dir(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| !source_is_root(b)) {
        let c = components(&b.source);
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        let hit = matches!(
            c.as_slice(),
            ["", "run"]
                | ["", "var", "run"]
                | ["", "var"]
                | ["", "run", "user"]
                | ["", "run", "user", _]
        );
        let below = ["/run", "/var/run"].iter().any(|d| source_within(b, d))
            && e.resolved(i).is_some_and(|r| r.is_dir());
        if hit || below {
            e.at(
                &bind_key(i),
                format!("bind source `{}` holds host service sockets", b.source),
            );
        }
    }
}

pub(super) fn home_readable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| !b.writable() && is_home_dir(&b.source)) {
        e.at(
            &bind_key(i),
            format!(
                "home directory `{}` is bound (read-only still exposes its secrets)",
                b.source
            ),
        );
    }
}

pub(super) fn host_root_readable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, ref b) in binds(p, e).filter(|(_, b)| !b.writable() && source_is_root(b)) {
        e.at(
            &bind_key(i),
            format!("`/` is bound read-only at `{}`", b.target()),
        );
    }
}

pub(super) fn workspace_risk_allowed(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.filesystem.allow_workspace_risk {
        e.at(
            "filesystem.allow_workspace_risk",
            "the launcher runs in workspaces such as `/`, a home directory or one holding credentials",
        );
    }
}

/// Credential stores (SSH and GPG have SBX006) in any mode, shell startup
/// files writable: by the bind's source, or a source that holds them.
pub(super) fn credentials_or_startup_files(p: &LoadedPolicy, e: &mut Emit<'_>) {
    use crate::workspace_risk::{CREDENTIAL_PATHS, HOME_TOKEN_PATHS, STARTUP_FILES};
    let under_home = |entry: &str| t(&format!("${{HOME}}/{entry}"));
    for (i, ref b) in binds(p, e) {
        if is_home_dir(&b.source) || source_is_root(b) {
            continue; // SBX002/SBX003 and the workspace check speak for these
        }
        let credential = CREDENTIAL_PATHS
            .iter()
            .chain(HOME_TOKEN_PATHS.iter())
            .filter(|entry| !matches!(**entry, ".ssh" | ".gnupg"))
            .find(|entry| {
                source_exposes(b, &format!("${{HOME}}/{entry}"))
                    || names_entry(b.source.as_str(), entry)
            });
        if let Some(entry) = credential {
            e.at(
                &bind_key(i),
                format!("bind source `{}` exposes credentials ({entry})", b.source),
            );
            continue;
        }
        let startup = STARTUP_FILES.iter().find(|entry| {
            b.writable()
                && (under_home(entry).is_within(&b.source)
                    || b.source.as_str().ends_with(&format!("/{entry}")))
        });
        if let Some(entry) = startup {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` lets the agent write a shell startup file ({entry})",
                    b.source
                ),
            );
        }
    }
}

/// `source` holds `entry` as whole components (`/x/.aws`, `/x/.aws/y`; not
/// `/opt/.aws-sdk`).
fn names_entry(source: &str, entry: &str) -> bool {
    source.ends_with(&format!("/{entry}")) || source.contains(&format!("/{entry}/"))
}
