//! Exit 127 with a command that exists on this host but not in the
//! sandbox's view (a toolchain under `$HOME`: rustup, nvm, pyenv,
//! `~/.local/bin`): say which bind would make it visible.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use substrat_policy::workspace_risk::CREDENTIAL_PATHS;
use substrat_sandbox::plan::{Holding, LaunchPlan, MountStep, mount_holding};

/// The hint for `name` (the command as given), or none when the sandbox
/// can see a program of that name (then the 127 was the command's own).
pub fn hint(
    plan: &LaunchPlan,
    name: &str,
    host_path: Option<&OsStr>,
    home: &Path,
) -> Option<String> {
    let inside_path: Vec<PathBuf> = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::env::split_paths(v).collect())
        .unwrap_or_default();
    let on_host = if name.contains('/') {
        let path = PathBuf::from(name);
        path.is_file().then_some(path)
    } else {
        if inside_path
            .iter()
            .any(|dir| visible_file(plan, &dir.join(name)))
        {
            return None;
        }
        std::env::split_paths(host_path?)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    }?;
    if visible_file(plan, &on_host) && !name.contains('/') {
        // Visible, but not on the sandbox's PATH.
        let dir = on_host.parent()?;
        return Some(format!(
            "`{name}` is at {} inside too, but {} is not on the sandbox's PATH: add it to the policy's \
             `env.set` PATH, or run it by its full path",
            on_host.display(),
            dir.display()
        ));
    }
    if visible_file(plan, &on_host) {
        return None;
    }
    let (bind, as_template) = bind_for(&on_host, home);
    let bin_dir = on_host.parent()?.display().to_string();
    Some(format!(
        "`{name}` is not in the sandbox, but this host has {}. To see it, bind its tree read-only \
         and put it on PATH, e.g. in a policy that extends this one:\n  \
         [filesystem]\n  binds_add = [{{ source = \"{as_template}\", mode = \"ro\" }}]\n  \
         [env]\n  set = {{ PATH = \"{}:/usr/local/bin:/usr/bin:/bin\", HOME = \"${{HOME}}\" }}\n\
         ({} on the host; toolchain managers keep more there: rustup also needs ~/.rustup, nvm ~/.nvm, pyenv ~/.pyenv)",
        on_host.display(),
        bin_dir.replacen(&home.display().to_string(), "${HOME}", 1),
        bind.display()
    ))
}

/// The tree to bind for a program at `path`: below the home, the home's
/// entry holding it (`~/.local`, `~/.nvm`), or only the program's own
/// directory where that entry also holds credentials (`~/.cargo` has the
/// registry token: `~/.cargo/bin`); elsewhere the directory above its
/// `bin/` (or its own directory). With its policy spelling.
fn bind_for(path: &Path, home: &Path) -> (PathBuf, String) {
    if home != Path::new("/")
        && let Ok(relative) = path.strip_prefix(home)
        && let Some(first) = relative.components().next()
    {
        let first = first.as_os_str().to_string_lossy();
        let holds_credentials = CREDENTIAL_PATHS
            .iter()
            .any(|c| c.starts_with(&format!("{first}/")));
        let inside = match (holds_credentials, relative.parent()) {
            (true, Some(dir)) => dir.to_path_buf(),
            _ => PathBuf::from(first.as_ref()),
        };
        let template = format!("${{HOME}}/{}", inside.display());
        return (home.join(inside), template);
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tree = match dir.file_name() {
        Some(n) if n == "bin" => dir.parent().unwrap_or(dir),
        _ => dir,
    };
    (tree.to_path_buf(), tree.display().to_string())
}

/// Whether `inside` is a file the sandbox sees: the mount holding it is a
/// bind whose host counterpart is a file.
fn visible_file(plan: &LaunchPlan, inside: &Path) -> bool {
    match mount_holding(plan, inside, Holding::ItselfOrBelow) {
        Some((MountStep::Bind { source, .. }, relative)) => source.join(relative).is_file(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_tree_never_holds_credentials() {
        let home = Path::new("/home/ana");
        let cases = [
            (
                "/home/ana/.cargo/bin/cargo",
                "/home/ana/.cargo/bin",
                "${HOME}/.cargo/bin",
            ),
            // ~/.local holds keyrings (share/keyrings): only its bin.
            (
                "/home/ana/.local/bin/black",
                "/home/ana/.local/bin",
                "${HOME}/.local/bin",
            ),
            (
                "/home/ana/.nvm/versions/node/v20/bin/node",
                "/home/ana/.nvm",
                "${HOME}/.nvm",
            ),
            ("/opt/node/bin/node", "/opt/node", "/opt/node"),
            ("/srv/tools/run-it", "/srv/tools", "/srv/tools"),
        ];
        for (program, tree, template) in cases {
            assert_eq!(
                bind_for(Path::new(program), home),
                (PathBuf::from(tree), template.to_string()),
                "{program}"
            );
        }
    }
}
