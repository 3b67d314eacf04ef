"""Shared fixtures: the substrat-sandbox binary built by scripts/test."""

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def substrat_bin() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("SUBSTRAT_BIN", REPO / "target" / "debug" / "substrat-sandbox"))
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build with `cargo build` (scripts/test does)")
    return path


@pytest.fixture
def run(substrat_bin):
    def _run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(substrat_bin), *args], cwd=REPO, capture_output=True, text=True, timeout=60)

    return _run
