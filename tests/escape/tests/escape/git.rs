//! Host git runs nothing the agent wrote (issue 17, parts 1 and 2): inside,
//! the workspace's `.git` is a git dir of the agent's own; the host's is
//! never visible. Host git here runs as the test's user with
//! `safe.directory=*`, so that a repository owned by nobody is not simply
//! refused (which would hide an attack instead of stopping it).

use super::*;

/// Host git with a global config of its own: `safe.directory = *` and an
/// identity. (A file, not `-c`: git does not pass `-c` settings on to the
/// upload-pack it starts for a fetch from a local path.)
fn host_git(dir: &Path, args: &[&str]) -> Output {
    static GLOBAL: std::sync::OnceLock<tempfile::NamedTempFile> = std::sync::OnceLock::new();
    let global = GLOBAL.get_or_init(|| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            "[safe]\n\tdirectory = *\n[user]\n\tname = host\n\temail = h@h\n",
        )
        .unwrap();
        file
    });
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", global.path())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn host_git_ok(dir: &Path, args: &[&str]) -> String {
    let out = host_git(dir, args);
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository at `dir` with one commit (`host commit`) on `main`.
fn host_repo(dir: &Path) {
    host_git_ok(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("file.txt"), "host\n").unwrap();
    host_git_ok(dir, &["add", "file.txt"]);
    host_git_ok(dir, &["commit", "-qm", "host commit"]);
}

/// Runs `script` in the sandbox (sh, in the workspace) and returns stdout.
fn inside(case: &Case, script: &str) -> String {
    let out = case.run("worker", &["/bin/sh", "-c", script]);
    assert!(out.status.success(), "{script}\n{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const AGENT_GIT: &str = "git -c user.name=agent -c user.email=a@a";

attack!(host_git_runs_nothing_the_agent_wrote, |case| {
    let ws = case.path();
    host_repo(ws);
    // A host remote, so that fetch and pull have somewhere to go.
    let remote = tempfile::tempdir().unwrap();
    host_git_ok(remote.path(), &["init", "-q", "--bare"]);
    host_git_ok(
        ws,
        &["remote", "add", "origin", remote.path().to_str().unwrap()],
    );
    host_git_ok(ws, &["push", "-q", "origin", "main"]);
    case.fix_ownership();
    let config_before = std::fs::read(ws.join(".git/config")).unwrap();
    // The agent writes every kind of git metadata that makes host git run
    // a program: config (fsmonitor, hooksPath, sshCommand, a filter),
    // hooks, commondir, config.worktree, worktrees/, modules/, alternates.
    let script = r#"set -e
marker="$PWD/PWNED"
printf '#!/bin/sh\ntouch %s\ncat\n' "$marker" > evil.sh
chmod +x evil.sh
evil="$PWD/evil.sh"
mkdir -p evil-hooks .git/hooks evil-git/hooks
for h in pre-commit post-commit post-checkout post-merge pre-push reference-transaction; do
  cp evil.sh evil-hooks/$h; cp evil.sh .git/hooks/$h; cp evil.sh evil-git/hooks/$h
done
cfg="[core]\n\tfsmonitor = $evil\n\thooksPath = $PWD/evil-hooks\n\tsshCommand = $evil\n[filter \"x\"]\n\tclean = $evil\n\tsmudge = $evil\n\trequired = true\n[extensions]\n\tworktreeConfig = true\n"
printf "$cfg" >> .git/config
printf "$cfg" > .git/config.worktree
printf "$cfg" > evil-git/config
echo '* filter=x' > .gitattributes
mkdir -p .git/worktrees/x .git/modules/m .git/objects/info
printf "$cfg" > .git/worktrees/x/config.worktree
printf "$cfg" > .git/modules/m/config
echo "$PWD/evil-git/objects" > .git/objects/info/alternates
echo "$PWD/evil-git" > .git/commondir
grep -c fsmonitor .git/config
"#;
    // The writes were real (the agent read its config back: "1")...
    assert_eq!(inside(&case, script).trim(), "1");
    // ...into the agent's git dir, which is left plain after the run: its
    // config minimal, its redirections renamed aside...
    let repo = case.git_state.path().join("repo");
    let agent_config = std::fs::read_to_string(repo.join("config")).unwrap();
    assert!(!agent_config.contains("fsmonitor"), "{agent_config}");
    assert!(repo.join("commondir.substrat-quarantine").exists());
    assert!(!repo.join("commondir").exists() && !repo.join("config.worktree").exists());
    // ...and nowhere in the host's.
    assert_eq!(
        std::fs::read(ws.join(".git/config")).unwrap(),
        config_before
    );
    for planted in [
        "commondir",
        "config.worktree",
        "worktrees",
        "modules",
        "hooks/pre-commit",
    ] {
        assert!(
            !ws.join(".git").join(planted).exists(),
            "{planted} reached the host"
        );
    }
    assert!(!ws.join(".git/objects/info/alternates").exists());
    // What a person does next in the workspace runs none of it.
    host_git_ok(ws, &["status"]);
    host_git_ok(ws, &["diff"]);
    host_git_ok(ws, &["log", "--oneline"]);
    host_git_ok(ws, &["add", "-A"]);
    host_git_ok(ws, &["commit", "-qm", "take the agent's files"]);
    host_git_ok(ws, &["fetch", "-q", "origin"]);
    host_git_ok(ws, &["pull", "-q", "--no-rebase", "origin", "main"]);
    host_git_ok(ws, &["push", "-q", "origin", "main"]);
    host_git_ok(ws, &["checkout", "-q", "-b", "other"]);
    assert!(
        !ws.join("PWNED").exists(),
        "host git ran the agent's program"
    );
    // The same config and hooks written into a host repository do run
    // (without the commondir and alternates redirections, which need a
    // whole second repository): the attack is real.
    let control = tempfile::tempdir().unwrap();
    host_repo(control.path());
    let direct = script
        .replace(
            "echo \"$PWD/evil-git/objects\" > .git/objects/info/alternates\n",
            "",
        )
        .replace("echo \"$PWD/evil-git\" > .git/commondir\n", "");
    assert!(!direct.contains("commondir"));
    let probe = Command::new("/bin/sh")
        .args(["-c", &direct])
        .current_dir(control.path())
        .output()
        .unwrap();
    assert!(probe.status.success(), "{probe:?}");
    host_git(control.path(), &["status"]);
    assert!(control.path().join("PWNED").exists());
});

attack!(the_agent_uses_git_and_the_host_fetches_its_work, |case| {
    let ws = case.path();
    host_repo(ws);
    case.fix_ownership();
    let script = format!(
        r#"set -e
{g} log --format=%s
echo agent >> file.txt
{g} commit -qam "agent commit"
{g} checkout -qb feature
echo more >> file.txt
{g} stash -q
{g} stash pop -q
{g} commit -qam "feature commit"
{g} checkout -q main
{g} rebase -q feature
mkdir sub && cd sub && {g} init -q && {g} commit -q --allow-empty -m "sub commit" && cd ..
{g} log --format=%s main
"#,
        g = AGENT_GIT
    );
    assert_eq!(
        inside(&case, &script),
        "host commit\nfeature commit\nagent commit\nhost commit\n"
    );
    // The host's branch is where it was; the agent's work is fetched.
    assert_eq!(
        host_git_ok(ws, &["log", "--format=%s", "main"]),
        "host commit\n"
    );
    let repo = case.git_state.path().join("repo");
    host_git_ok(
        ws,
        &["fetch", "-q", repo.to_str().unwrap(), "main:agent-main"],
    );
    assert_eq!(
        host_git_ok(ws, &["log", "--format=%s", "agent-main"]),
        "feature commit\nagent commit\nhost commit\n"
    );
    // The alternates name the host's objects between runs (fetch needs
    // them), the place they are bound inside during one.
    let alternates = std::fs::read_to_string(repo.join("objects/info/alternates")).unwrap();
    assert_eq!(alternates.trim(), ws.join(".git/objects").to_str().unwrap());
    assert_eq!(
        inside(&case, "cat .git/objects/info/alternates"),
        "/run/substrat/host-objects\n"
    );
});

attack!(git_init_at_the_root_stays_the_agents, |case| {
    let ws = case.path();
    let script = format!(
        "set -e\n{AGENT_GIT} init -q\n{AGENT_GIT} commit -q --allow-empty -m first\n{AGENT_GIT} log --format=%s"
    );
    assert_eq!(inside(&case, &script), "first\n");
    // The host has no repository there: at most the empty mount point.
    assert!(!ws.join(".git/HEAD").exists() && !ws.join(".git/config").exists());
    assert!(case.git_state.path().join("repo/HEAD").exists());
    // The next run continues the agent's repository.
    let script = format!("{AGENT_GIT} log --format=%s");
    assert_eq!(inside(&case, &script), "first\n");
});

attack!(
    worktree_workspace_launches_and_its_git_dir_stays_the_hosts,
    |case| {
        // The workspace is a worktree of a repository elsewhere: its `.git` is
        // a file naming main/.git/worktrees/<name>.
        let main = tempfile::tempdir().unwrap();
        host_repo(main.path());
        let staging = tempfile::tempdir().unwrap();
        let wt = staging.path().join("wt");
        host_git_ok(
            main.path(),
            &["worktree", "add", "-q", "-b", "wt", wt.to_str().unwrap()],
        );
        std::fs::rename(wt.join(".git"), case.path().join(".git")).unwrap();
        std::fs::rename(wt.join("file.txt"), case.path().join("file.txt")).unwrap();
        // Where the main repository looks for this worktree now.
        std::fs::write(
            main.path().join(".git/worktrees/wt/gitdir"),
            format!("{}\n", case.path().join(".git").display()),
        )
        .unwrap();
        for entry in walk(main.path()) {
            if case.who == Who::Nobody {
                std::os::unix::fs::lchown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
            }
        }
        std::fs::set_permissions(main.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        case.fix_ownership();
        let gitfile = std::fs::read(case.path().join(".git")).unwrap();
        let main_config = std::fs::read(main.path().join(".git/config")).unwrap();
        let script = format!(
            "set -e\n{AGENT_GIT} log --format=%s\necho x >> file.txt\n{AGENT_GIT} commit -qam agent\n\
         printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> \"$(git rev-parse --git-dir)/config\"\n\
         git rev-parse --git-dir"
        );
        assert_eq!(inside(&case, &script), "host commit\n/run/substrat/git\n");
        // The host's gitfile, worktree dir and main repository are untouched.
        assert_eq!(std::fs::read(case.path().join(".git")).unwrap(), gitfile);
        assert_eq!(
            std::fs::read(main.path().join(".git/config")).unwrap(),
            main_config
        );
        assert_eq!(
            host_git_ok(case.path(), &["log", "--format=%s"]),
            "host commit\n"
        );
        host_git_ok(case.path(), &["status"]);
        assert!(!case.path().join("PWNED").exists());
    }
);

attack!(
    repositories_below_the_root_are_read_only_or_made_inert,
    |case| {
        let ws = case.path();
        host_repo(ws);
        // Repositories already there: a nested one, a bare one.
        std::fs::create_dir(ws.join("vendored")).unwrap();
        host_repo(&ws.join("vendored"));
        host_git_ok(ws, &["init", "-q", "--bare", "bare.git"]);
        case.fix_ownership();
        let vendored_config = std::fs::read(ws.join("vendored/.git/config")).unwrap();
        // They are read-only inside.
        assert_eq!(
            case.probe(&["append", "vendored/.git/config"]),
            "errno:EROFS"
        );
        assert_eq!(case.probe(&["append", "bare.git/config"]), "errno:EROFS");
        assert_eq!(
            case.probe(&["rename", "vendored/.git", "moved"]),
            "errno:EBUSY"
        );
        // Ones the command makes (each with a config that runs a program):
        // nested, bare, a worktree-style git dir, a gitfile, a `.git` symlink,
        // one inside a directory it then makes unreadable.
        let script = format!(
            r#"set -e
cfg='[core]\n\tfsmonitor = touch {ws}/PWNED\n\tpager = touch {ws}/PWNED; cat\n'
{g} init -q made && printf "$cfg" >> made/.git/config
{g} init -q --bare made-bare.git && printf "$cfg" >> made-bare.git/config
mkdir wt && echo ref: refs/heads/main > wt/HEAD && echo ../made-bare.git > wt/commondir
mkdir gitfile && echo "gitdir: ../made/.git" > gitfile/.git
mkdir link && ln -s ../made-bare.git link/.git
mkdir -p hidden/deep && {g} init -q hidden/deep && printf "$cfg" >> hidden/deep/.git/config && chmod 000 hidden
echo made
"#,
            ws = ws.display(),
            g = AGENT_GIT
        );
        let out = case.run("worker", &["/bin/sh", "-c", &script]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "made\n", "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Each was renamed aside, and said so.
        for (from, to) in [
            ("made/.git", "made/.git.substrat-quarantine"),
            (
                "made-bare.git/HEAD",
                "made-bare.git/HEAD.substrat-quarantine",
            ),
            ("wt/HEAD", "wt/HEAD.substrat-quarantine"),
            ("gitfile/.git", "gitfile/.git.substrat-quarantine"),
            ("link/.git", "link/.git.substrat-quarantine"),
            ("hidden/deep/.git", "hidden/deep/.git.substrat-quarantine"),
        ] {
            assert!(
                stderr.contains(&format!("renamed {}", ws.join(from).display())),
                "{from}: {stderr}"
            );
            assert!(
                !ws.join(from).exists() && !ws.join(from).is_symlink(),
                "{from}"
            );
            assert!(ws.join(to).exists() || ws.join(to).is_symlink(), "{to}");
        }
        // A `.git` renamed aside is no git dir either (its HEAD went aside).
        assert!(
            ws.join("made/.git.substrat-quarantine/HEAD.substrat-quarantine")
                .exists()
        );
        // Host git anywhere in the workspace runs none of it.
        for dir in [
            "",
            "made",
            "made-bare.git",
            "wt",
            "gitfile",
            "link",
            "hidden/deep",
            "made/.git.substrat-quarantine",
        ] {
            host_git(&ws.join(dir), &["status"]);
            host_git(&ws.join(dir), &["log", "-1"]);
        }
        assert!(
            !ws.join("PWNED").exists(),
            "host git ran the agent's program"
        );
        // The repositories that were there are as they were.
        assert_eq!(
            std::fs::read(ws.join("vendored/.git/config")).unwrap(),
            vendored_config
        );
        assert!(ws.join("bare.git/HEAD").exists());
        // The command's files are all still there.
        assert!(ws.join("made/.git.substrat-quarantine/config").exists());
    }
);

attack!(planted_git_metadata_binds_and_copies_no_host_file, |case| {
    // Another agent (the parent, whose workspace holds this one) can write
    // this workspace's `.git` before the launch. The launcher must not
    // follow it to host files: someone's repository, a secret.
    let elsewhere = tempfile::tempdir().unwrap();
    host_repo(elsewhere.path());
    let secret = elsewhere.path().join("secret");
    std::fs::write(&secret, "s3cret").unwrap();
    let refused = |why: &str| {
        case.fix_ownership();
        let out = case.run("worker", &["./substrat-probe", "status"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(why), "{why}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("OUTCOME"));
    };
    // A gitfile naming a repository that does not name this workspace back.
    let gitfile = case.path().join(".git");
    std::fs::write(
        &gitfile,
        format!("gitdir: {}\n", elsewhere.path().join(".git").display()),
    )
    .unwrap();
    refused("does not name this workspace back");
    std::fs::remove_file(&gitfile).unwrap();
    // A `.git` directory whose objects, or common dir, are elsewhere.
    std::fs::create_dir_all(gitfile.join("refs")).unwrap();
    std::fs::write(gitfile.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::os::unix::fs::symlink(
        elsewhere.path().join(".git/objects"),
        gitfile.join("objects"),
    )
    .unwrap();
    refused(".git/objects is a symlink");
    std::fs::remove_file(gitfile.join("objects")).unwrap();
    std::fs::create_dir(gitfile.join("objects")).unwrap();
    std::fs::write(
        gitfile.join("commondir"),
        elsewhere.path().join(".git").display().to_string(),
    )
    .unwrap();
    refused("naming a common dir");
    std::fs::remove_file(gitfile.join("commondir")).unwrap();
    // An index that is a link to a secret is not copied.
    std::os::unix::fs::symlink(&secret, gitfile.join("index")).unwrap();
    refused(".git/index");
    assert!(!case.git_state.path().join("repo/index").exists());
    // With all of that gone, the same workspace launches.
    std::fs::remove_file(gitfile.join("index")).unwrap();
    case.fix_ownership();
    assert_eq!(case.probe(&["read", ".git/HEAD"]), "ok");
});

attack!(repositories_the_walk_could_miss_are_made_inert, |case| {
    let ws = case.path();
    // A host repository, so that the launcher writes the agent repo's
    // alternates after the run (made a FIFO below).
    host_repo(ws);
    case.fix_ownership();
    // Each with a config that runs a program; none may survive the run.
    let script = format!(
        r#"set -e
cfg='[core]\n\tfsmonitor = touch {ws}/PWNED\n'
repo() {{ {g} init -q "$1" && printf "$cfg" >> "$1/.git/config"; }}
# A repository inside a directory that is itself a git dir.
mkdir -p gd/objects gd/refs && echo ref: refs/heads/main > gd/HEAD && repo gd/app
# The workspace root itself made a git dir.
mkdir -p objects refs && echo ref: refs/heads/main > HEAD && printf "$cfg" > config
# A git dir whose HEAD and objects are symlinks.
mkdir -p sym/refs sym/o && ln -s refs/heads/main sym/HEAD && ln -s o sym/objects && printf "$cfg" > sym/config
# More sibling directories than the launcher has descriptors, one last.
mkdir many && cd many && seq 1 1100 | xargs mkdir && cd .. && repo many/1100
# A directory that can be read but not searched.
repo noexec/r && chmod 600 noexec
# Its own repository's alternates made a FIFO (the launcher writes them).
rm -f .git/objects/info/alternates && mkfifo .git/objects/info/alternates
echo made
"#,
        ws = ws.display(),
        g = AGENT_GIT
    );
    let out = case.run("worker", &["/bin/sh", "-c", &script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "made\n", "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for renamed in [
        "gd/HEAD",
        "gd/app/.git",
        "HEAD",
        "sym/HEAD",
        "many/1100/.git",
        "noexec/r/.git",
    ] {
        assert!(
            stderr.contains(&format!("renamed {} ", ws.join(renamed).display())),
            "{renamed}: {stderr}"
        );
    }
    for dir in ["", "gd", "gd/app", "sym", "many/1100", "noexec/r"] {
        host_git(&ws.join(dir), &["status"]);
    }
    assert!(
        !ws.join("PWNED").exists(),
        "host git ran the agent's program"
    );
});

attack!(
    a_repository_another_sandbox_holds_is_renamed_when_it_ends,
    |case| {
        // Sandbox A's command makes `sub/.git`; sandbox B starts meanwhile on
        // the same workspace and counts it as existing (bound read-only in B).
        // A ends while B runs: renaming it then would detach B's bind, and B's
        // command could rename it back. So A leaves it to B, which renames it
        // when it ends.
        let ws = case.path();
        let a_script = format!(
            "{AGENT_GIT} init -q sub && printf '[core]\\n\\tfsmonitor = touch {}/PWNED\\n' >> sub/.git/config \
         && touch a-made && while [ ! -e a-go ]; do sleep 0.05; done",
            ws.display()
        );
        let mut a = super::hostside::KillOnDrop(Some(
            case.command("worker", &["/bin/sh", "-c", &a_script])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        wait_until("A to make its repository", Duration::from_secs(10), || {
            ws.join("a-made").exists()
        });
        let b_script = "touch b-started; while [ ! -e b-go ]; do sleep 0.05; done; \
                    exec ./substrat-probe rename sub/.git sub/moved";
        let mut b = super::hostside::KillOnDrop(Some(
            case.command("worker", &["/bin/sh", "-c", b_script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        wait_until("B to start", Duration::from_secs(10), || {
            ws.join("b-started").exists()
        });
        std::fs::write(ws.join("a-go"), "").unwrap();
        let a_out = a.0.take().unwrap().wait_with_output().unwrap();
        let a_err = String::from_utf8_lossy(&a_out.stderr);
        assert!(
            a_err.contains("another running sandbox holds read-only"),
            "{a_err}"
        );
        // B's bind held: its command cannot move the repository.
        std::fs::write(ws.join("b-go"), "").unwrap();
        let b_out = b.0.take().unwrap().wait_with_output().unwrap();
        let b_stdout = String::from_utf8_lossy(&b_out.stdout);
        assert!(b_stdout.contains("OUTCOME errno:EBUSY"), "{b_out:?}");
        let b_err = String::from_utf8_lossy(&b_out.stderr);
        assert!(
            b_err.contains(&format!("renamed {}", ws.join("sub/.git").display())),
            "{b_err}"
        );
        assert!(!ws.join("sub/.git").exists());
        host_git(&ws.join("sub"), &["status"]);
        assert!(
            !ws.join("PWNED").exists(),
            "host git ran the agent's program"
        );
    }
);
