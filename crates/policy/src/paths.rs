//! Path templates: absolute paths in which `${HOME}`, `${WORKSPACE}` and
//! `${AGENT_ID}` expand at launch. Validation is strict because these paths
//! decide what of the host an agent can see.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A variable a path may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathVar {
    Home,
    Workspace,
    AgentId,
}

impl PathVar {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "HOME" => Some(Self::Home),
            "WORKSPACE" => Some(Self::Workspace),
            "AGENT_ID" => Some(Self::AgentId),
            _ => None,
        }
    }
}

/// One `/`-separated component of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Var(PathVar),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(transparent)]
pub struct PathTemplate(String);

/// The values variables expand to for one agent.
#[derive(Debug, Clone)]
pub struct ExpandContext {
    pub home: PathBuf,
    pub workspace: PathBuf,
    pub agent_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path `{0}` is not absolute: start it with `/`, `${{HOME}}` or `${{WORKSPACE}}`")]
    NotAbsolute(String),
    #[error("path `{0}` contains a `.` or `..` component; write the path it means")]
    DotComponent(String),
    #[error("path `{0}` uses unknown variable `${{{1}}}` (known: HOME, WORKSPACE, AGENT_ID)")]
    UnknownVar(String, String),
    #[error("path `{0}` has an unterminated `${{`")]
    Unterminated(String),
    #[error("path `{0}` contains a NUL byte")]
    Nul(String),
    #[error(
        "`${{HOME}}` and `${{WORKSPACE}}` may only start a path, as in `${{HOME}}/.cache` (in `{0}`)"
    )]
    RootVarInside(String),
    #[error("value `{0}` for `${{{1}}}` is not usable in a path")]
    BadValue(String, &'static str),
}

impl PathTemplate {
    pub fn new(text: &str) -> Self {
        Self(text.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components, each a list of pieces (`agent-${AGENT_ID}` is two).
    /// The first component of an absolute template is empty (leading `/`) or
    /// a lone `${HOME}` / `${WORKSPACE}`.
    pub fn components(&self) -> Result<Vec<Vec<Piece>>, PathError> {
        let text = &self.0;
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        if text.contains('\0') {
            return Err(PathError::Nul(text.clone()));
        }
        let mut components = Vec::new();
        for (index, raw) in text.split('/').enumerate() {
            if raw == "." || raw == ".." {
                return Err(PathError::DotComponent(text.clone()));
            }
            if raw.is_empty() && index > 0 {
                continue; // `//` and a trailing `/` add nothing
            }
            let pieces = parse_pieces(text, raw)?;
            let starts_with_root_var = matches!(
                pieces.as_slice(),
                [Piece::Var(PathVar::Home | PathVar::Workspace)]
            );
            let has_root_var = pieces
                .iter()
                .any(|p| matches!(p, Piece::Var(PathVar::Home | PathVar::Workspace)));
            if has_root_var && !(index == 0 && starts_with_root_var) {
                return Err(PathError::RootVarInside(text.clone()));
            }
            components.push(pieces);
        }
        match components.first().map(Vec::as_slice) {
            Some([]) | Some([Piece::Var(PathVar::Home | PathVar::Workspace)]) => Ok(components),
            _ => Err(PathError::NotAbsolute(text.clone())),
        }
    }

    pub fn validate(&self) -> Result<(), PathError> {
        self.components().map(|_| ())
    }

    /// The template as `/`-separated components with variables kept, for
    /// comparing templates with each other (`${WORKSPACE}/.git/hooks`).
    pub fn normalized_components(&self) -> Vec<String> {
        self.0
            .split('/')
            .enumerate()
            .filter(|(i, c)| *i == 0 || !c.is_empty())
            .map(|(_, c)| c.to_string())
            .collect()
    }

    /// Whether this template is `other` or lies below it, comparing
    /// components with variables unexpanded.
    pub fn is_within(&self, other: &PathTemplate) -> bool {
        let mine = self.normalized_components();
        let theirs = other.normalized_components();
        mine.len() >= theirs.len() && mine[..theirs.len()] == theirs[..]
    }

    pub fn uses(&self, var: PathVar) -> bool {
        self.components()
            .map(|cs| cs.iter().flatten().any(|p| *p == Piece::Var(var)))
            .unwrap_or(false)
    }

    /// Expands variables for one agent. The agent id must be a single plain
    /// component so it cannot steer the path elsewhere.
    pub fn expand(&self, ctx: &ExpandContext) -> Result<PathBuf, PathError> {
        if ctx.agent_id.is_empty()
            || ctx.agent_id.contains(['/', '\0'])
            || ctx.agent_id == "."
            || ctx.agent_id == ".."
        {
            return Err(PathError::BadValue(ctx.agent_id.clone(), "AGENT_ID"));
        }
        let mut out = PathBuf::from("/");
        for (index, pieces) in self.components()?.into_iter().enumerate() {
            match pieces.as_slice() {
                [] if index == 0 => {}
                [Piece::Var(PathVar::Home)] if index == 0 => out = absolute(&ctx.home, "HOME")?,
                [Piece::Var(PathVar::Workspace)] if index == 0 => {
                    out = absolute(&ctx.workspace, "WORKSPACE")?
                }
                _ => {
                    let mut component = String::new();
                    for piece in pieces {
                        match piece {
                            Piece::Text(t) => component.push_str(&t),
                            Piece::Var(_) => component.push_str(&ctx.agent_id),
                        }
                    }
                    out.push(component);
                }
            }
        }
        Ok(out)
    }
}

fn absolute(path: &std::path::Path, var: &'static str) -> Result<PathBuf, PathError> {
    let ok = path.is_absolute()
        && path.components().all(|c| {
            !matches!(
                c,
                std::path::Component::ParentDir | std::path::Component::CurDir
            )
        });
    if ok {
        Ok(path.to_path_buf())
    } else {
        Err(PathError::BadValue(path.display().to_string(), var))
    }
}

fn parse_pieces(whole: &str, raw: &str) -> Result<Vec<Piece>, PathError> {
    let mut pieces = Vec::new();
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_string()));
        }
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| PathError::Unterminated(whole.to_string()))?;
        let name = &after[..end];
        let var = PathVar::parse(name)
            .ok_or_else(|| PathError::UnknownVar(whole.to_string(), name.to_string()))?;
        pieces.push(Piece::Var(var));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

impl fmt::Display for PathTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A path relative to a writable bind (the `protected` list): no leading `/`,
/// no `.` or `..`, no variables.
pub fn validate_relative(path: &str) -> Result<(), ProtectedPathError> {
    let refuse = |why| ProtectedPathError {
        path: path.to_string(),
        why,
    };
    if path.trim_end_matches('/').is_empty() {
        return Err(refuse("is empty"));
    }
    if path.starts_with('/') {
        return Err(refuse(
            "must be relative: it applies inside every writable bind",
        ));
    }
    if path.contains("${") || path.contains('\0') {
        return Err(refuse("may not contain variables or NUL"));
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(refuse("contains a `.` or `..` component"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ExpandContext {
        ExpandContext {
            home: "/home/ana".into(),
            workspace: "/srv/ws".into(),
            agent_id: "a1".into(),
        }
    }

    #[test]
    fn expands_variables() {
        let t = PathTemplate::new("${HOME}/.substrat/agents/${AGENT_ID}/chats");
        assert_eq!(
            t.expand(&ctx()).unwrap(),
            PathBuf::from("/home/ana/.substrat/agents/a1/chats")
        );
        let t = PathTemplate::new("/var/lib/agent-${AGENT_ID}//x/");
        assert_eq!(
            t.expand(&ctx()).unwrap(),
            PathBuf::from("/var/lib/agent-a1/x")
        );
        assert_eq!(
            PathTemplate::new("${WORKSPACE}").expand(&ctx()).unwrap(),
            PathBuf::from("/srv/ws")
        );
    }

    #[test]
    fn rejects_unsafe_templates() {
        let err = |s: &str| PathTemplate::new(s).validate().unwrap_err();
        assert_eq!(err(""), PathError::Empty);
        assert!(matches!(err("usr/lib"), PathError::NotAbsolute(_)));
        assert!(matches!(err("/srv/../etc"), PathError::DotComponent(_)));
        assert!(matches!(err("/srv/${USER}"), PathError::UnknownVar(_, _)));
        assert!(matches!(err("/srv/${HOME"), PathError::Unterminated(_)));
        assert!(matches!(err("/x/${HOME}"), PathError::RootVarInside(_)));
        assert!(matches!(err("${AGENT_ID}/x"), PathError::NotAbsolute(_)));
    }

    #[test]
    fn rejects_agent_ids_that_steer_paths() {
        let t = PathTemplate::new("/a/${AGENT_ID}");
        for bad in ["..", "a/b", "", "."] {
            let c = ExpandContext {
                agent_id: bad.into(),
                ..ctx()
            };
            assert!(t.expand(&c).is_err(), "{bad}");
        }
    }

    #[test]
    fn within_compares_components() {
        let ws = PathTemplate::new("${WORKSPACE}");
        assert!(PathTemplate::new("${WORKSPACE}/.git/hooks").is_within(&ws));
        assert!(!PathTemplate::new("${WORKSPACE}2/x").is_within(&ws));
        assert!(PathTemplate::new("/etc").is_within(&PathTemplate::new("/")));
        assert!(!PathTemplate::new("/etcx").is_within(&PathTemplate::new("/etc")));
    }

    #[test]
    fn relative_paths() {
        assert!(validate_relative(".cursor").is_ok());
        assert!(validate_relative(".git/hooks").is_ok());
        assert!(validate_relative("/etc").is_err());
        assert!(validate_relative("a/../b").is_err());
        assert!(validate_relative("").is_err());
    }
}

/// A `protected` entry that is not a plain relative path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protected path `{path}` {why}")]
pub struct ProtectedPathError {
    pub path: String,
    pub why: &'static str,
}
