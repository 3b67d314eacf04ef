"""The CI integrations of `check` (docs/check.md): the GitHub Action's
metadata and the GitLab template against the schemas check-jsonschema
ships for them, the pre-commit manifest with pre-commit's own validator,
and each run for real where it can be here: the pre-commit hook through
`pre-commit try-repo`, the action's check step through its script.

The validators are pinned in .cache/ci-tools/venv by scripts/setup;
without them the tests are skipped by name, with the reason. Each
validator is also shown a broken copy, so a pass means it checked.
"""

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import REPO

TOOLS = REPO / ".cache" / "ci-tools" / "venv" / "bin"
BAD_POLICY = REPO / "tests" / "policies" / "good" / "host-network-writable-home.toml"
GOOD_POLICY = REPO / "policies" / "worker.toml"


def tool(name: str) -> pathlib.Path:
    path = TOOLS / name
    if not path.is_file():
        pytest.skip(f"{name} not installed at {path} (scripts/setup installs it)")
    return path


def validate(tmp_path, schema: str, source: pathlib.Path, broken_from: str, broken_to: str):
    ok = subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, source], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    text = source.read_text()
    assert broken_from in text
    broken = tmp_path / source.name
    broken.write_text(text.replace(broken_from, broken_to, 1))
    bad = subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, broken], capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Schema validation errors" in bad.stdout + bad.stderr


def test_the_action_metadata_is_valid(tmp_path):
    validate(tmp_path, "vendor.github-actions", REPO / "action.yml", "using: composite", "using: docker-compose")


def test_the_gitlab_template_is_valid(tmp_path):
    template = REPO / "ci" / "gitlab" / "substrat-check.gitlab-ci.yml"
    validate(tmp_path, "vendor.gitlab-ci", template, "when: always", "when: sometimes")


def test_the_pre_commit_manifest_is_valid(tmp_path):
    manifest = REPO / ".pre-commit-hooks.yaml"
    ok = subprocess.run([tool("pre-commit"), "validate-manifest", manifest], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / ".pre-commit-hooks.yaml"
    broken.write_text(manifest.read_text().replace("language: system", "language: no-such-language"))
    bad = subprocess.run([tool("pre-commit"), "validate-manifest", broken], capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr


def path_with_substrat(substrat_bin) -> str:
    return f"{substrat_bin.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def test_the_pre_commit_hook_fails_a_commit_of_a_risky_policy(tmp_path, substrat_bin):
    """`pre-commit try-repo` with this checkout as the hooks' repository:
    a project whose commit adds a policy with high findings fails the
    hook, one with the shipped worker passes."""
    pre_commit = tool("pre-commit")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    project = tmp_path / "project"
    (project / "policies").mkdir(parents=True)
    shutil.copy(BAD_POLICY, project / "policies" / "risky.toml")
    shutil.copy(GOOD_POLICY, project / "policies" / "worker.toml")
    env = dict(os.environ, PATH=path_with_substrat(substrat_bin), PRE_COMMIT_HOME=str(tmp_path / "cache"),
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=project, check=True, env=env)

    def hook(policy: str) -> subprocess.CompletedProcess:
        return subprocess.run([pre_commit, "try-repo", REPO, "substrat-check", "--files", policy],
                              cwd=project, env=env, capture_output=True, text=True)

    risky = hook("policies/risky.toml")
    assert risky.returncode == 1, risky.stdout + risky.stderr
    assert "3 high" in risky.stdout, risky.stdout
    clean = hook("policies/worker.toml")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout


def test_the_action_step_writes_sarif_and_its_verdict(tmp_path, substrat_bin):
    """ci/check-sarif as the action's check step runs it: the SARIF
    report and `status` in GITHUB_OUTPUT, exit 0 either way so the upload
    runs; exit 2 when check cannot run."""

    def step(paths: str) -> tuple[subprocess.CompletedProcess, dict]:
        output = tmp_path / "github_output"
        output.write_text("")
        env = dict(os.environ, PATH=path_with_substrat(substrat_bin), GITHUB_OUTPUT=str(output),
                   SUBSTRAT_CHECK_PATHS=paths, SUBSTRAT_CHECK_FAIL_ON="high",
                   SUBSTRAT_CHECK_SARIF=str(tmp_path / "report.sarif"))
        done = subprocess.run([REPO / "ci" / "check-sarif"], env=env, capture_output=True, text=True, cwd=tmp_path)
        outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
        return done, outputs

    done, outputs = step(f"{GOOD_POLICY} {BAD_POLICY}")
    assert done.returncode == 0, done.stderr
    assert outputs == {"status": "1", "sarif-file": str(tmp_path / "report.sarif")}
    results = json.loads((tmp_path / "report.sarif").read_text())["runs"][0]["results"]
    assert sum(r["level"] == "error" for r in results) == 3, results
    done, outputs = step(str(GOOD_POLICY))
    assert done.returncode == 0 and outputs["status"] == "0", done.stderr
    done, outputs = step(str(tmp_path / "no-such-policy.toml"))
    assert done.returncode == 2 and outputs["status"] == "2", done.stderr


def run_step(tmp_path, substrat_bin, paths: str, sarif: str) -> tuple[subprocess.CompletedProcess, str]:
    output = tmp_path / "github_output"
    output.write_text("")
    env = dict(os.environ, PATH=path_with_substrat(substrat_bin), GITHUB_OUTPUT=str(output),
               SUBSTRAT_CHECK_PATHS=paths, SUBSTRAT_CHECK_FAIL_ON="high", SUBSTRAT_CHECK_SARIF=sarif)
    done = subprocess.run([REPO / "ci" / "check-sarif"], env=env, capture_output=True, text=True, cwd=tmp_path)
    return done, output.read_text()


def test_the_action_step_output_cannot_be_forged_through_the_sarif_path(tmp_path, substrat_bin):
    """A SARIF path with a newline would add its own `status=0` line to
    GITHUB_OUTPUT after the real one (the last value wins): a check with
    high findings would pass. Such a path is refused, nothing written."""
    done, written = run_step(tmp_path, substrat_bin, str(BAD_POLICY), str(tmp_path / "r.sarif\nstatus=0"))
    assert "status=0" not in written, written
    assert done.returncode == 2, done.stderr
    assert "status=2" in written.splitlines(), written


def test_the_action_step_takes_each_path_as_a_path(tmp_path, substrat_bin):
    """Paths are never options of check: `--help` among them would print
    the help and exit 0, a pass for a risky policy beside it."""
    done, written = run_step(tmp_path, substrat_bin, f"--help {BAD_POLICY}", str(tmp_path / "r.sarif"))
    assert "status=0" not in written, written
    assert done.returncode == 2, done.stderr
    assert "--help: no such file or directory" in done.stderr, done.stderr


def test_no_action_input_is_spliced_into_a_shell_script():
    """`${{ inputs.X }}` inside `run:` is pasted into the script before
    bash reads it (a quote in the input runs commands): inputs reach the
    steps' scripts through `env:` only."""
    import yaml
    action = yaml.safe_load((REPO / "action.yml").read_text())
    for step in action["runs"]["steps"]:
        assert "${{" not in step.get("run", ""), step
