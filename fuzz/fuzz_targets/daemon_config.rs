//! Arbitrary bytes as the daemon's configuration file, its inline roles
//! (substrat_policy::inline). Invariants: parsing never panics; accepted
//! roles have valid, unique names in order; each one's generated policy is
//! TOML with version 1, an `extends`, and a persona holding exactly one of
//! `system_prompt` and `script` (a prompt never turns into other keys).
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_policy::inline::inline_roles;
use substrat_policy::valid_role_name;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
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
