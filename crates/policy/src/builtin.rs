//! Policies and seccomp profiles shipped inside the binary, so `extends =
//! "worker"` and `profile = "default"` work wherever the binary is installed.
//! They are the files under policies/ and seccomp/, compiled in.

pub const POLICIES: &[(&str, &str)] = &[
    ("worker", include_str!("../../../policies/worker.toml")),
    ("reviewer", include_str!("../../../policies/reviewer.toml")),
    ("strict", include_str!("../../../policies/strict.toml")),
    ("upstream", include_str!("../../../policies/upstream.toml")),
];

pub const SECCOMP_PROFILES: &[(&str, &str)] =
    &[("default", include_str!("../../../seccomp/default.json"))];

/// The label built-in files carry in messages and reports.
pub fn policy_label(name: &str) -> String {
    format!("builtin:policies/{name}.toml")
}

pub fn seccomp_label(name: &str) -> String {
    format!("builtin:seccomp/{name}.json")
}

pub fn policy(name: &str) -> Option<&'static str> {
    POLICIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

pub fn seccomp_profile(name: &str) -> Option<&'static str> {
    SECCOMP_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

pub fn is_builtin_label(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(|p| p.starts_with("builtin:"))
}
