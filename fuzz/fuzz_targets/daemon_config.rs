//! Arbitrary bytes as the daemon's configuration file, its inline roles
//! (substrat_policy::inline). Invariants: parsing never panics; accepted
//! roles have valid, unique names in order; each one's generated policy is
//! TOML with version 1, an `extends`, and a persona holding exactly one of
//! `system_prompt` and `script` (a prompt never turns into other keys).
//! Its `state` (the state database's address): parsing never panics, and
//! an accepted PostgreSQL address is never shown with its password.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::store::StateDatabase;
use substrat_policy::inline::{daemon_state_str, inline_roles};
use substrat_policy::valid_role_name;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(Some(state)) = daemon_state_str(text) {
        state_address(&state);
    }
    // The address alone, as --state or SUBSTRAT_STATE gives it.
    state_address(text);
    let Ok(roles) = inline_roles(text) else { return };
    for pair in roles.windows(2) {
        assert!(pair[0].name < pair[1].name, "sorted and unique");
    }
    for role in &roles {
        assert!(valid_role_name(&role.name));
        let policy: toml::Table = toml::from_str(&role.policy_text).expect("generated TOML parses");
        assert_eq!(policy["version"].as_integer(), Some(1));
        assert!(policy["extends"].is_str());
        let persona = policy["persona"].as_table().expect("a persona");
        assert!(persona.contains_key("system_prompt") != persona.contains_key("script"));
        let keys = ["description", "system_prompt", "script", "timeout_ms", "memory_mb", "config"];
        assert!(persona.keys().all(|k| keys.contains(&k.as_str())), "{persona:?}");
        assert!(policy.keys().all(|k| ["version", "extends", "tools", "persona"].contains(&k.as_str())));
    }
});

fn state_address(text: &str) {
    let Ok(parsed) = StateDatabase::parse(text) else { return };
    let shown = format!("{parsed} {parsed:?}");
    if let StateDatabase::Postgres(_) = parsed
        && let Ok(url) = url::Url::parse(text)
        && let Some(password) = url.password()
    {
        let mut without = url.clone();
        let _ = without.set_password(None);
        // A password that is also the user, the host or the path would
        // be shown as them.
        if password.len() >= 6 && !without.as_str().contains(password) {
            assert!(!shown.contains(password), "{shown}");
        }
    }
}
