//! What a turn's launch can carry. Text given to an agent (a spawn's first
//! message and role arguments, a message, a model's name) goes into its
//! turns' command lines, environment and files, through the launcher's
//! exec. A NUL byte ends a C string, so a command line or environment
//! holding one cannot be exec'd (std refuses the spawn: "nul byte found in
//! provided data"), and the turn would fail, at every retry, and every
//! later turn for what is kept (a persona resolved from the arguments).
//! Any other byte is carried: the text is UTF-8 (serde refuses less), an
//! argument or a variable's value may hold anything but NUL, and the
//! configuration files are written through serializers. Such text is
//! refused where it is given, naming the field.

use crate::roles::RoleArgs;

/// The refusals' error code.
pub const CODE: &str = "uncarried_text";

/// Why `text`, given as `field`, cannot reach a turn; none when it can.
pub fn refusal(field: &str, text: &str) -> Option<String> {
    text.contains('\0')
        .then(|| format!("{field}: contains a NUL byte, which a launch cannot carry"))
}

/// The first of a spawn's texts that cannot reach its turns: the first
/// message, the model's name, the role arguments (names and values).
pub fn spawn_refusal(
    instructions: Option<&str>,
    model: Option<&str>,
    args: &RoleArgs,
) -> Option<String> {
    let given = instructions
        .and_then(|text| refusal("the instructions", text))
        .or_else(|| model.and_then(|model| refusal("the model", model)));
    given.or_else(|| {
        args.iter().find_map(|(name, value)| {
            refusal("a role argument's name", name).or_else(|| {
                // The name is the caller's: written escaped.
                refusal(&format!("role argument `{}`", name.escape_debug()), value)
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_refused_with_the_field_named_and_anything_else_carried() {
        assert_eq!(
            refusal("the text", "tabs\t, escapes \u{1b}[31m, ünïcode"),
            None
        );
        let args: RoleArgs = [("topic".to_string(), "a\0b".to_string())].into();
        assert_eq!(
            spawn_refusal(Some("go"), None, &args).as_deref(),
            Some("role argument `topic`: contains a NUL byte, which a launch cannot carry")
        );
        let named: RoleArgs = [("to\0pic\u{1b}".to_string(), "x".to_string())].into();
        assert_eq!(
            spawn_refusal(None, None, &named).as_deref(),
            Some("a role argument's name: contains a NUL byte, which a launch cannot carry")
        );
        assert_eq!(
            spawn_refusal(Some("go\0"), Some("m"), &RoleArgs::new()).as_deref(),
            Some("the instructions: contains a NUL byte, which a launch cannot carry")
        );
        assert!(spawn_refusal(Some("go"), Some("m"), &RoleArgs::new()).is_none());
    }
}
