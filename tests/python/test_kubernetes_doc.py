"""docs/kubernetes.md says what the CRI suite runs: its YAML parses, its
RuntimeClass names the handler the tests use, and its containerd
configuration is the suite's (paths aside)."""

from __future__ import annotations

import pathlib
import re
import tomllib

import yaml

import cri

DOC = cri.REPO / "docs" / "kubernetes.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def test_every_manifest_parses_and_the_runtime_class_names_the_tested_handler():
    documents = [d for block in blocks("yaml") for d in yaml.safe_load_all(block) if d]
    kinds = [d["kind"] for d in documents]
    assert {"RuntimeClass", "Pod", "Sandbox", "SandboxTemplate"} <= set(kinds), kinds
    (runtime_class,) = [d for d in documents if d["kind"] == "RuntimeClass"]
    assert runtime_class["handler"] == cri.HANDLER
    for document in documents:
        spec = document.get("spec", {})
        pod = spec.get("podTemplate", {}).get("spec", spec)
        if "containers" in pod:
            assert pod["runtimeClassName"] == runtime_class["metadata"]["name"], document
    (pod,) = [d for d in documents if d["kind"] == "Pod"]
    assert "io.substrat.workspace" in pod["metadata"]["annotations"]


def test_the_documented_containerd_configuration_is_the_tested_one():
    documented = [tomllib.loads(b) for b in blocks("toml") if "containerd.runtimes" in b]
    assert documented, "no containerd configuration in the page"
    doc_cri = documented[0]["plugins"]["io.containerd.grpc.v1.cri"]
    tested = tomllib.loads(cri.containerd_config(pathlib.Path("/x"), pathlib.Path("/run/substrat-oci")))
    test_cri = tested["plugins"]["io.containerd.grpc.v1.cri"]
    assert doc_cri["containerd"]["runtimes"].keys() == test_cri["containerd"]["runtimes"].keys()
    doc_handler = doc_cri["containerd"]["runtimes"][cri.HANDLER]
    test_handler = test_cri["containerd"]["runtimes"][cri.HANDLER]
    assert doc_handler["runtime_type"] == test_handler["runtime_type"]
    assert doc_handler["pod_annotations"] == test_handler["pod_annotations"]
    assert doc_handler["options"].keys() == test_handler["options"].keys()
    assert doc_handler["options"]["SystemdCgroup"] is test_handler["options"]["SystemdCgroup"] is False
    assert doc_handler["options"]["Root"] == test_handler["options"]["Root"]
    assert doc_cri["containerd"]["default_runtime_name"] == test_cri["containerd"]["default_runtime_name"]
    assert doc_cri["disable_apparmor"] == test_cri["disable_apparmor"]
    operator = [tomllib.loads(b) for b in blocks("toml") if b.lstrip().startswith("policy =")]
    assert operator and "allow_host_paths" in operator[0]
