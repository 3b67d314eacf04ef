"""Pods as kubelet makes them, through CRI to containerd with the runtime
handler `substrat` (issue 44). The node: tests/python/cri.py."""

from __future__ import annotations

import os
import pathlib
import re
import uuid

import pytest

import cri

REASON = cri.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CRI suite: {REASON}")


@pytest.fixture(scope="module")
def node():
    node = cri.Node()
    yield node
    node.close()


class Pod:
    """One pod sandbox and its containers, named for this test."""

    def __init__(self, node: cri.Node, name: str, **linux):
        self.node = node
        self.api = node.api
        self.uid = uuid.uuid4().hex
        self.name = name
        self.logs = node.dir / "logs" / self.uid
        self.logs.mkdir(parents=True)
        self.cgroup_parent = f"/substrat-cri/pod{self.uid}"
        self.config = self.api.PodSandboxConfig(
            metadata=self.api.PodSandboxMetadata(name=name, uid=self.uid, namespace="default"),
            hostname=name,
            log_directory=str(self.logs),
            linux=self.api.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=linux.pop("security_context", None) or self.api.LinuxSandboxSecurityContext(
                    namespace_options=self.namespaces()
                ),
                **linux,
            ),
        )
        self.id = node.runtime.RunPodSandbox(
            self.api.RunPodSandboxRequest(config=self.config, runtime_handler=cri.HANDLER), timeout=60
        ).pod_sandbox_id

    def namespaces(self):
        """What kubelet asks for a pod without shareProcessNamespace: a pid
        namespace per container (the proto's default, 0, is POD)."""
        return self.api.NamespaceOption(pid=self.api.CONTAINER)

    def container(self, name: str, command: list[str], start: bool = True, **config) -> str:
        linux = config.pop("linux", None) or self.api.LinuxContainerConfig()
        if not linux.HasField("security_context"):
            linux.security_context.namespace_options.CopyFrom(self.namespaces())
        request = self.api.CreateContainerRequest(
            pod_sandbox_id=self.id,
            sandbox_config=self.config,
            config=self.api.ContainerConfig(
                metadata=self.api.ContainerMetadata(name=name),
                image=self.api.ImageSpec(image=cri.IMAGE),
                command=command,
                log_path=f"{name}.log",
                linux=linux,
                **config,
            ),
        )
        container_id = self.node.runtime.CreateContainer(request, timeout=60).container_id
        if start:
            self.node.runtime.StartContainer(self.api.StartContainerRequest(container_id=container_id), timeout=60)
        return container_id

    def status(self, container_id: str):
        return self.node.runtime.ContainerStatus(
            self.api.ContainerStatusRequest(container_id=container_id), timeout=30
        ).status

    def exec(self, container_id: str, command: list[str], timeout: int = 20):
        return self.node.runtime.ExecSync(
            self.api.ExecSyncRequest(container_id=container_id, cmd=command, timeout=timeout), timeout=60
        )

    def remove(self) -> None:
        self.node.runtime.StopPodSandbox(self.api.StopPodSandboxRequest(pod_sandbox_id=self.id), timeout=60)
        self.node.runtime.RemovePodSandbox(self.api.RemovePodSandboxRequest(pod_sandbox_id=self.id), timeout=60)


def container_pid(node: cri.Node, container_id: str) -> int:
    """The container's pid as containerd knows it (the runtime's)."""
    tasks = node.ctr("tasks", "ls").stdout
    for line in tasks.splitlines():
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise AssertionError(f"no task {container_id}: {tasks}")


def test_a_pod_of_two_containers_lives_and_ends_as_kubelet_expects(node):
    api = node.api
    marker = f"substrat-cri-{uuid.uuid4().hex[:8]}"
    pod = Pod(node, "two")
    server = pod.container("server", ["/bin/sh", "-c", f"echo serving; : {marker}; nc -l -p 7070"])
    client = pod.container(
        "client", ["/bin/sh", "-c", f"sleep 0.5; echo hello-over-loopback | nc 127.0.0.1 7070; : {marker}"]
    )

    # The client exits; the server got its line over the pod's loopback
    # (the pause container's network namespace) and exits too.
    def exited(container_id):
        return pod.status(container_id).state == api.CONTAINER_EXITED

    cri.wait_until("the client exits", lambda: exited(client))
    cri.wait_until("the server exits", lambda: exited(server))
    assert pod.status(client).exit_code == 0
    assert pod.status(server).exit_code == 0
    # Logs in the CRI format: TIMESTAMP STREAM P|F TEXT.
    log = (pod.logs / "server.log").read_text()
    lines = log.splitlines()
    assert len(lines) == 2, log
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\S+ stdout F .*", line), line
    assert [line.split(" ", 3)[3] for line in lines] == ["serving", "hello-over-loopback"]

    # A long-running container: ExecSync, status, stats.
    sleeper = pod.container("sleeper", ["/bin/sh", "-c", f"sleep 1000; : {marker}"])
    out = pod.exec(sleeper, ["/bin/sh", "-c", "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; id -u; exit 3"])
    assert out.exit_code == 3, out
    text = out.stdout.decode()
    assert "CapEff:\t0000000000000000" in text and "NoNewPrivs:\t1" in text, text
    assert pod.status(sleeper).state == api.CONTAINER_RUNNING
    stats = node.runtime.ContainerStats(api.ContainerStatsRequest(container_id=sleeper), timeout=30).stats
    assert stats.attributes.id == sleeper
    assert stats.memory.working_set_bytes.value > 0

    pod.remove()
    assert cri.processes_with(marker) == [], "a container's process survived"
    assert cri.mounts_under(node.dir) == [], "a mount survived"
    assert cri.cgroups_named(pod.uid) == [], "a cgroup survived"
    pods = node.runtime.ListPodSandbox(api.ListPodSandboxRequest(), timeout=30).items
    assert pod.id not in [p.id for p in pods]
