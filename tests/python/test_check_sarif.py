"""`check --format sarif` validates against the official SARIF 2.1.0 schema.

The schema is not committed; it is read from ../shared/data beside the
checkout (or $SARIF_SCHEMA). Without it the test is skipped by name, with
the reason, never passed.
"""

import json
import os
import pathlib

import jsonschema
import pytest

from conftest import REPO

SCHEMA = pathlib.Path(os.environ.get("SARIF_SCHEMA", REPO.parent / "shared" / "data" / "sarif-schema-2.1.0.json"))


@pytest.fixture(scope="module")
def validator():
    if not SCHEMA.is_file():
        pytest.skip(f"SARIF schema not found at {SCHEMA} (set SARIF_SCHEMA)")
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft4Validator(schema)


CASES = {
    "shipped policies, no findings": ["policies"],
    "findings with locations": ["tests/policies/good/host-network-writable-home.toml", "tests/policies/good/tool-cap-above-40.toml"],
    "host findings without a file": ["--host", "strict"],
    "proven on this host (check --prove), escapes as results": ["--prove", "tests/policies/good/host-network-writable-home.toml", "worker"],
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_sarif_output_is_valid(run, validator, args):
    out = run("check", "--format", "sarif", *args)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    assert doc["version"] == "2.1.0" and len(doc["runs"]) == 1
    run0 = doc["runs"][0]
    rules = run0["tool"]["driver"]["rules"]
    assert len(rules) >= 20
    for rule in rules:
        for key in ("id", "shortDescription", "fullDescription", "help", "defaultConfiguration"):
            assert key in rule, (rule["id"], key)
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    for result in run0["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note")
        if not result["ruleId"].startswith("HST"):
            region = result["locations"][0]["physicalLocation"]["region"]
            assert region["startLine"] >= 1


def test_sarif_results_match_json_findings(run):
    policy = "tests/policies/good/host-network-writable-home.toml"
    sarif = json.loads(run("check", "--format", "sarif", policy).stdout)
    report = json.loads(run("check", "--format", "json", policy).stdout)
    from_sarif = sorted(
        (r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in sarif["runs"][0]["results"]
    )
    from_json = sorted((f["rule_id"], f["line"]) for f in report["policies"][0]["findings"])
    assert from_sarif == from_json
    assert ("SBX001", 5) in from_sarif and ("SBX003", 10) in from_sarif
    uri = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == policy
