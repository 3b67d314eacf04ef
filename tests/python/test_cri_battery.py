"""The escape battery (`substrat-probe battery`, what `check --prove` runs)
in a container kubelet would start through CRI with the handler
`substrat`, against `substrat-run --policy worker` with the same host
fixtures: every attack ends the same way, but those listed with the reason
(issue 44; the Rust twin for podman is crates/oci/tests/oci/engine_battery.rs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import uuid

import pytest

import cri
from test_cri import Pod

PROBE_INSIDE = "/run/substrat-probe"
RUN = cri.oci_binary().with_name("substrat-run")
PROBE = cri.oci_binary().with_name("substrat-probe-static")
REASON = cri.skip_reason() or (
    None if RUN.is_file() and PROBE.is_file() else f"needs {RUN} and {PROBE} (cargo build --workspace; scripts/static-probe)"
)
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CRI battery: {REASON}")

# Attacks whose setup differs by design, with the reason.
DIFFERENT = {
    "environment": "the policy's variables against the configuration's",
    "protected-write": "the worker policy protects .git; a container without a policy has no protected paths",
    "protected-create": "as protected-write",
    "protected-rename-over": "as protected-write",
    "protected-symlink-swap": "as protected-write",
    "mcp-config-write": "the worker policy protects .cursor/mcp.json; a container does not",
    "write-system": "the root filesystem is the container's own copy of the image, writable as kubelet asks",
    "limit-pids": "a pod without limits has no pids.max; worker's is 512",
}


class Fixtures:
    """The host side: a workspace, a secret and a directory outside every
    bind, a Unix, an abstract and a TCP socket, a marked process."""

    def __init__(self, secret: str):
        self.dir = tempfile.TemporaryDirectory(prefix="cri-battery-")
        base = self.dir.name
        self.ws = os.path.join(base, "ws")
        os.makedirs(os.path.join(self.ws, ".git", "hooks"))
        os.makedirs(os.path.join(self.ws, ".cursor"))
        with open(os.path.join(self.ws, ".git", "config"), "w") as f:
            f.write("[core]\n")
        with open(os.path.join(self.ws, ".cursor", "mcp.json"), "w") as f:
            f.write("{}\n")
        outside = os.path.join(base, "outside")
        os.makedirs(outside)
        with open(os.path.join(outside, "secret.txt"), "w") as f:
            f.write(secret)
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(os.path.join(outside, "host.sock"))
        self.unix.listen()
        name = f"substrat-cri-escape-{uuid.uuid4().hex[:8]}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + name)
        self.abstract.listen()
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        marker = f"substrat-cri-escape-marker-{uuid.uuid4().hex[:8]}"
        self.marked = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 600"], stdin=subprocess.DEVNULL)
        cri.wait_until("the marked process runs", lambda: cri.processes_with(marker) == [self.marked.pid])
        self.args = [
            f"ws={self.ws}",
            f"outside={os.path.join(outside, 'secret.txt')}",
            f"outside_dir={outside}",
            f"socket={os.path.join(outside, 'host.sock')}",
            f"abstract={name}",
            f"port={self.tcp.getsockname()[1]}",
            "host_ip=",
            f"marker={marker[::-1]}",
            f"marker_pid={self.marked.pid}",
            f"secret={secret[::-1]}",
        ]

    def battery(self) -> list[str]:
        return [PROBE_INSIDE, "battery", *self.args]

    def close(self) -> None:
        self.marked.kill()
        self.marked.wait()
        for s in (self.unix, self.abstract, self.tcp):
            s.close()
        self.dir.cleanup()


def outcomes(lines: list[str], what: str) -> dict[str, str]:
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            continue
    assert any(p.get("done") is True for p in parsed), f"{what}: the battery did not finish: {lines}"
    return {p["attack"]: p["outcome"] for p in parsed if "attack" in p and "outcome" in p}


def test_the_battery_ends_in_a_cri_container_as_under_substrat_run_worker():
    secret = f"substrat-cri-secret-{uuid.uuid4().hex}"
    fixtures = Fixtures(secret)
    node = None
    try:
        run = subprocess.run(
            [str(RUN), "--policy", "worker", "--backend", "native", "--tty", "never",
             "--workspace", fixtures.ws, "--agent-bind", "ro", str(PROBE), PROBE_INSIDE, "--", *fixtures.battery()],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
            env={**os.environ, "SUBSTRAT_OCI_ESCAPE_SECRET": secret},
        )
        under_run = outcomes(run.stdout.splitlines(), "substrat-run")
        # The secret in containerd's environment (the engine's), which never
        # reaches a container.
        os.environ["SUBSTRAT_OCI_ESCAPE_SECRET"] = secret
        try:
            node = cri.Node()
        finally:
            del os.environ["SUBSTRAT_OCI_ESCAPE_SECRET"]
        api = node.api
        pod = Pod(node, "battery")
        mounts = [
            api.Mount(container_path=fixtures.ws, host_path=fixtures.ws),
            api.Mount(container_path=PROBE_INSIDE, host_path=str(PROBE), readonly=True),
        ]
        battery = pod.container("battery", fixtures.battery(), working_dir=fixtures.ws, mounts=mounts)
        cri.wait_until(
            "the battery ends", lambda: pod.status(battery).state == api.CONTAINER_EXITED, timeout=120
        )
        log = (pod.logs / "battery.log").read_text().splitlines()
        in_container = outcomes([line.split(" ", 3)[3] for line in log if line.count(" ") >= 3], "CRI container")
        pod.remove()
    finally:
        if node is not None:
            node.close()
        fixtures.close()
    assert sorted(under_run) == sorted(in_container), "the same attacks ran"
    assert len(under_run) >= 30, under_run
    differ = [
        f"{attack}: substrat-run {outcome}, CRI container {in_container[attack]}"
        for attack, outcome in under_run.items()
        if in_container[attack] != outcome and attack not in DIFFERENT
    ]
    assert differ == [], "outcomes differ:\n" + "\n".join(differ)
    # Measured here: environment HOSTNAME,PATH (never the engine's secret),
    # protected-* and mcp-config-write ok (no policy on top), write-system
    # ENOENT (the image has no /usr; the host's is not in the view),
    # limit-pids EAGAIN only at the host's own limit.
    assert "SUBSTRAT_OCI_ESCAPE_SECRET" not in in_container["environment"], in_container["environment"]
    assert not os.path.exists("/usr/substrat-prove"), "written on the host's /usr"
