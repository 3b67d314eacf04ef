//! cursor-agent's headless command line, hand-parsed so that every usage
//! error exits 2 with a message, as cursor-agent does.

use std::path::PathBuf;

/// A parsed headless invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub model: String,
    pub workspace: Option<PathBuf>,
    pub resume: Option<String>,
    pub stream_partial_output: bool,
    pub prompt: String,
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Run(Args),
    Version,
}

/// The model name when `--model` is absent.
pub const DEFAULT_MODEL: &str = "stand-in";

#[derive(Debug, Default)]
struct Seen {
    print: bool,
    trust: bool,
    approve_mcps: bool,
    output_format: Option<String>,
    model: Option<String>,
    workspace: Option<PathBuf>,
    resume: Option<String>,
    stream_partial_output: bool,
    version: bool,
    prompt: Vec<String>,
}

/// Parses the arguments after the program name. `Err` is the usage message.
pub fn parse<I: IntoIterator<Item = String>>(argv: I) -> Result<Command, String> {
    let mut seen = Seen::default();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            seen.prompt.extend(it.by_ref());
            break;
        }
        if arg.starts_with('-') && arg != "-" {
            flag(&mut seen, &arg, &mut it)?;
        } else {
            seen.prompt.push(arg);
        }
    }
    finish(seen)
}

fn flag(seen: &mut Seen, arg: &str, it: &mut impl Iterator<Item = String>) -> Result<(), String> {
    let (name, inline) = match arg.split_once('=') {
        Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
        _ => (arg, None),
    };
    let mut value = || {
        inline
            .clone()
            .or_else(|| it.next())
            .ok_or_else(|| format!("{name} needs a value"))
    };
    match name {
        "-p" | "--print" => seen.print = true,
        "--trust" => seen.trust = true,
        "--approve-mcps" => seen.approve_mcps = true,
        "--stream-partial-output" => seen.stream_partial_output = true,
        // Accepted: the stand-in never asks before running a command.
        "-f" | "--force" => {}
        "-v" | "--version" => seen.version = true,
        "--output-format" => seen.output_format = Some(value()?),
        "--model" | "-m" => seen.model = Some(value()?),
        "--workspace" => seen.workspace = Some(PathBuf::from(value()?)),
        "--resume" => seen.resume = Some(value()?),
        _ => return Err(format!("unknown option {arg}")),
    }
    if inline.is_some() && !takes_value(name) {
        return Err(format!("{name} takes no value"));
    }
    Ok(())
}

fn takes_value(name: &str) -> bool {
    matches!(
        name,
        "--output-format" | "--model" | "-m" | "--workspace" | "--resume"
    )
}

fn finish(seen: Seen) -> Result<Command, String> {
    if seen.version {
        return Ok(Command::Version);
    }
    let missing: Vec<&str> = [
        (!seen.print, "--print"),
        (!seen.trust, "--trust"),
        (!seen.approve_mcps, "--approve-mcps"),
        (seen.output_format.is_none(), "--output-format stream-json"),
    ]
    .into_iter()
    .filter_map(|(absent, name)| absent.then_some(name))
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "headless mode needs {} (missing: {})",
            "--print --output-format stream-json --trust --approve-mcps",
            missing.join(", ")
        ));
    }
    if let Some(format) = seen
        .output_format
        .as_deref()
        .filter(|f| *f != "stream-json")
    {
        return Err(format!(
            "--output-format {format}: only stream-json is supported"
        ));
    }
    if seen.prompt.is_empty() {
        return Err("a prompt is required".into());
    }
    Ok(Command::Run(Args {
        model: seen.model.unwrap_or_else(|| DEFAULT_MODEL.to_string()),
        workspace: seen.workspace,
        resume: seen.resume,
        stream_partial_output: seen.stream_partial_output,
        prompt: seen.prompt.join(" "),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    const HEADLESS: [&str; 5] = [
        "--print",
        "--output-format",
        "stream-json",
        "--trust",
        "--approve-mcps",
    ];

    #[test]
    fn parses_the_headless_form() {
        let mut a = argv(&HEADLESS);
        a.extend(argv(&[
            "--model=m1",
            "--workspace",
            "/w",
            "--resume",
            "S",
            "--stream-partial-output",
            "--force",
            "do",
            "it",
        ]));
        assert_eq!(
            parse(a),
            Ok(Command::Run(Args {
                model: "m1".into(),
                workspace: Some("/w".into()),
                resume: Some("S".into()),
                stream_partial_output: true,
                prompt: "do it".into(),
            }))
        );
    }

    #[test]
    fn defaults() {
        let mut a = argv(&HEADLESS);
        a.extend(argv(&["--", "--not-a-flag"]));
        assert_eq!(
            parse(a),
            Ok(Command::Run(Args {
                model: "stand-in".into(),
                workspace: None,
                resume: None,
                stream_partial_output: false,
                prompt: "--not-a-flag".into(),
            }))
        );
    }

    #[test]
    fn usage_errors() {
        assert_eq!(
            parse(argv(&["--print", "--output-format", "stream-json", "--approve-mcps", "x"])),
            Err("headless mode needs --print --output-format stream-json --trust --approve-mcps (missing: --trust)".into())
        );
        let mut a = argv(&HEADLESS);
        a.push("--bogus".into());
        assert_eq!(parse(a), Err("unknown option --bogus".into()));
        let mut a = argv(&HEADLESS);
        a.push("--model".into());
        assert_eq!(parse(a), Err("--model needs a value".into()));
        let mut a = argv(&HEADLESS);
        a[2] = "json".into();
        a.push("x".into());
        assert_eq!(
            parse(a),
            Err("--output-format json: only stream-json is supported".into())
        );
        assert_eq!(parse(argv(&HEADLESS)), Err("a prompt is required".into()));
        assert_eq!(
            parse(argv(&["--trust=yes"])),
            Err("--trust takes no value".into())
        );
    }

    #[test]
    fn version() {
        assert_eq!(parse(argv(&["--version"])), Ok(Command::Version));
    }
}
