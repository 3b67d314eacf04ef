"""A container's lifecycle through CRI as kubelet drives it (issue 44):
UpdateContainerResources reaching the container's cgroup, and a limit
above the operator's policy refused. The node: tests/python/cri.py."""

from __future__ import annotations

import pathlib
import uuid

import grpc
import pytest

import cri
from test_cri import Pod

REASON = cri.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CRI suite: {REASON}")


@pytest.fixture(scope="module")
def node():
    node = cri.Node()
    yield node
    node.close()


def limit_file(container_id: str, hierarchy: str, name: str) -> pathlib.Path:
    """The container's own group (`substrat-ID-PID`) in a v1 hierarchy."""
    groups = [
        pathlib.Path(g)
        for g in cri.cgroups_named(f"substrat-{container_id}-")
        if g.startswith(f"/sys/fs/cgroup/{hierarchy}/")
    ]
    assert len(groups) == 1, groups
    return groups[0] / name


def test_update_container_resources_reaches_the_containers_cgroup(node):
    api = node.api
    marker = f"substrat-cri-upd-{uuid.uuid4().hex[:8]}"
    pod = Pod(node, "upd")
    try:
        resources = api.LinuxContainerResources(
            memory_limit_in_bytes=256 << 20, cpu_period=100000, cpu_quota=100000
        )
        container = pod.container(
            "c",
            ["/bin/sh", "-c", f"sleep 1000; : {marker}"],
            linux=api.LinuxContainerConfig(resources=resources),
        )
        cri.wait_until("the container runs", lambda: cri.processes_with(marker))
        memory = limit_file(container, "memory", "memory.limit_in_bytes")
        quota = limit_file(container, "cpu", "cpu.cfs_quota_us")
        assert memory.read_text().strip() == str(256 << 20)
        assert quota.read_text().strip() == "100000"

        smaller = api.LinuxContainerResources(
            memory_limit_in_bytes=128 << 20, cpu_period=100000, cpu_quota=50000
        )
        node.runtime.UpdateContainerResources(
            api.UpdateContainerResourcesRequest(container_id=container, linux=smaller), timeout=60
        )
        assert memory.read_text().strip() == str(128 << 20)
        assert quota.read_text().strip() == "50000"
        assert pod.status(container).state == api.CONTAINER_RUNNING
    finally:
        pod.remove()
    assert cri.processes_with(marker) == []


def test_an_update_above_the_operators_policy_is_refused_by_name():
    operator = "policy = \"strict\"\n"
    node = cri.Node(operator_config=operator)
    api = node.api
    try:
        pod = Pod(node, "upd-strict", annotations={"io.substrat.workspace": "/work"})
        try:
            volume = node.dir / "empty-dir"
            volume.mkdir()
            container = pod.container(
                "c", ["/bin/sleep", "1000"], mounts=[api.Mount(container_path="/work", host_path=str(volume))]
            )
            memory = limit_file(container, "memory", "memory.limit_in_bytes")
            # strict: memory_max 1 GiB, applied at create.
            assert memory.read_text().strip() == str(1 << 30)
            wider = api.LinuxContainerResources(memory_limit_in_bytes=2 << 30)
            with pytest.raises(grpc.RpcError) as refused:
                node.runtime.UpdateContainerResources(
                    api.UpdateContainerResourcesRequest(container_id=container, linux=wider), timeout=60
                )
            assert "policy `strict`" in refused.value.details(), refused.value.details()
            assert "memory_max" in refused.value.details(), refused.value.details()
            assert memory.read_text().strip() == str(1 << 30)
        finally:
            pod.remove()
    finally:
        node.close()
