"""Pods as kubelet makes them, through CRI to containerd with the runtime
handler `substrat` (issue 44). The node: tests/python/cri.py."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
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

    def __init__(self, node: cri.Node, name: str, annotations: dict[str, str] | None = None, **linux):
        self.node = node
        self.api = node.api
        # kubelet's shape: the runtime takes only a UUID for a pod's uid.
        self.uid = str(uuid.uuid4())
        self.name = name
        self.logs = node.dir / "logs" / self.uid
        self.logs.mkdir(parents=True)
        self.cgroup_parent = f"/{node.cgroup_top}/pod{self.uid}"
        self.config = self.api.PodSandboxConfig(
            metadata=self.api.PodSandboxMetadata(name=name, uid=self.uid, namespace="default"),
            hostname=name,
            log_directory=str(self.logs),
            annotations=annotations or {},
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
        """StopPodSandbox and RemovePodSandbox; then, as kubelet, the pod's
        cgroup (the runtime removes the containers' groups below it, as
        runc does, and must leave nothing there)."""
        self.node.runtime.StopPodSandbox(self.api.StopPodSandboxRequest(pod_sandbox_id=self.id), timeout=60)
        self.node.runtime.RemovePodSandbox(self.api.RemovePodSandboxRequest(pod_sandbox_id=self.id), timeout=60)
        for group in cri.cgroups_named(self.uid):
            left = [d for d, _, _ in os.walk(group) if d != group]
            assert left == [], f"a container's cgroup survived: {left}"
            os.rmdir(group)


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
    # busybox nc stops reading the network at the end of its stdin (CRI
    # gives /dev/null): a pipe keeps it open until the line has come. The
    # client tries until the server listens.
    server = pod.container("server", ["/bin/sh", "-c", f"echo serving; : {marker}; sleep 3 | nc -l -p 7070"])
    client = pod.container(
        "client",
        [
            "/bin/sh",
            "-c",
            "for i in $(seq 50); do echo hello-over-loopback | nc 127.0.0.1 7070 && break; sleep 0.1; done;"
            f" : {marker}",
        ],
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
    # containerd copies the output asynchronously: both lines, in time.
    log = cri.wait_until(
        "the server's log holds both lines",
        lambda: (text := (pod.logs / "server.log").read_text()).count("\n") >= 2 and text,
    )
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


def cgroup_lines(pid: int) -> dict[str, str]:
    """A process's groups by controller list (`memory`, `cpu,cpuacct`, `` for v2)."""
    lines = pathlib.Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {line.split(":", 2)[1]: line.split(":", 2)[2] for line in lines}


def test_containers_join_the_pods_cgroup_and_stats_are_theirs(node):
    """A container without limits still joins linux.cgroupsPath (below the
    pod's cgroup_parent), and ContainerStats read the container's usage,
    not the engine's (issue 44)."""
    api = node.api
    marker = f"substrat-cri-{uuid.uuid4().hex[:8]}"
    pod = Pod(node, "cgroups")
    free = pod.container("free", ["/bin/sh", "-c", f"sleep 1000; : {marker}-free"])
    limit = 96 << 20
    limited = pod.container(
        "limited",
        ["/bin/sh", "-c", f"head -c 33554432 /dev/zero > /dev/shm/fill; sleep 1000; : {marker}-limited"],
        linux=api.LinuxContainerConfig(resources=api.LinuxContainerResources(memory_limit_in_bytes=limit)),
    )
    for name in ("free", "limited"):
        pids = cri.wait_until(f"{name} runs", lambda n=name: cri.processes_with(f"{marker}-{n}"))
        for pid in pids:
            groups = cgroup_lines(pid)
            # Every v1 controller the host has, cpuacct for the CPU stats.
            v1 = {c for line in groups for c in line.split(",") if c and not c.startswith("name=")}
            for controller in v1 & {"memory", "pids", "cpu", "cpuacct", "cpuset", "blkio", "freezer"}:
                path = next(p for c, p in groups.items() if controller in c.split(","))
                assert path.startswith(pod.cgroup_parent + "/"), f"{name} {controller}: {path}"
    assert pod.status(free).state == api.CONTAINER_RUNNING
    # An idle sleeper's CPU, not the host's (which was reported when
    # cpuacct was not joined: hours of CPU).
    stats = node.runtime.ContainerStats(api.ContainerStatsRequest(container_id=free), timeout=30).stats
    cpu = stats.cpu.usage_core_nano_seconds.value
    assert cpu < 2_000_000_000, f"the CPU stats are not the container's: {cpu} ns"

    def working_set():
        stats = node.runtime.ContainerStats(api.ContainerStatsRequest(container_id=limited), timeout=30).stats
        return stats.memory.working_set_bytes.value

    # 32 MiB in the container's /dev/shm (tmpfs: counted, not reclaimable).
    cri.wait_until("the container's 32 MiB show", lambda: working_set() >= 32 << 20)
    assert working_set() < limit, f"the stats are not the container's: {working_set()} bytes"
    pod.remove()
    assert cri.cgroups_named(pod.uid) == [], "a cgroup survived"


def test_a_protected_host_path_is_refused_with_its_field(node):
    api = node.api
    pod = Pod(node, "hostpath")
    for readonly in (False, True):
        mount = api.Mount(container_path="/host-etc", host_path="/etc", readonly=readonly)
        with pytest.raises(Exception) as refused:
            pod.container(f"etc{int(readonly)}", ["/bin/true"], mounts=[mount])
        text = str(refused.value)
        access = "read-only" if readonly else "read-write"
        assert f"a {access} bind of the host's /etc into /host-etc" in text, text
        assert re.search(r"mounts\[\d+\]", text), text
    # An ordinary hostPath volume still works.
    data = node.dir / "data"
    data.mkdir()
    (data / "note").write_text("from the host\n")
    ok = pod.container(
        "data", ["/bin/sleep", "1000"], mounts=[api.Mount(container_path="/data", host_path=str(data), readonly=True)]
    )
    assert pod.exec(ok, ["/bin/cat", "/data/note"]).stdout == b"from the host\n"
    pod.remove()


def test_a_pod_naming_another_pods_uid_gets_none_of_its_volumes():
    """A pod's annotations passed through (`pod_annotations` naming
    io.kubernetes.*) set io.kubernetes.pod.uid to another pod's uid: its
    volumes under /var/lib/kubelet/pods/UID were taken for the container's
    own. The pod's uid is now the engine's cgroupsPath's (pod<UID>)."""
    node = cri.Node(pod_annotations=("io.substrat.*", "io.kubernetes.*"))
    made = None
    try:
        api = node.api
        victim = Pod(node, "victim")
        kubelet = pathlib.Path("/var/lib/kubelet")
        made = kubelet if not kubelet.exists() else kubelet / "pods" / victim.uid
        volume = kubelet / "pods" / victim.uid / "volumes" / "kubernetes.io~empty-dir" / "data"
        volume.mkdir(parents=True)
        (volume / "note").write_text("the victim's\n")
        mount = api.Mount(container_path="/data", host_path=str(volume), readonly=True)
        names = {
            "io.kubernetes.pod.uid": victim.uid,
            "io.kubernetes.cri.sandbox-uid": victim.uid,
            "io.kubernetes.cri.sandbox-id": victim.id,
        }
        attacker = Pod(node, "attacker", annotations=names)
        with pytest.raises(Exception) as refused:
            attacker.container("thief", ["/bin/cat", "/data/note"], mounts=[mount])
        text = str(refused.value)
        assert "a read-only bind of the host's /var/lib/kubelet/pods/" in text, text
        assert "an engine's or a service's place" in text, text
        # The sandbox id the runtime still reads is containerd's own: it
        # writes it over a pod's passed-through one (measured on 1.6).
        plain = attacker.container("plain", ["/bin/sleep", "1000"])
        config = next((node.dir / "state").rglob(f"{plain}/config.json"))
        annotations = json.loads(config.read_text())["annotations"]
        assert annotations["io.kubernetes.cri.sandbox-id"] == attacker.id, annotations
        assert annotations["io.kubernetes.pod.uid"] == victim.uid, "the forged uid no longer passes"
        # The victim's own container binds it: its uid is its cgroup's.
        own = victim.container("owner", ["/bin/sleep", "1000"], mounts=[mount])
        assert victim.exec(own, ["/bin/cat", "/data/note"]).stdout == b"the victim's\n"
        attacker.remove()
        victim.remove()
    finally:
        node.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def test_exec_works_under_a_long_runtime_root():
    """The runtime's root as long as an operator may make it: its sockets
    (create's, exec's) no longer overflow sun_path (issue 44)."""
    long_node = None
    try:
        long_node = cri.Node(root=pathlib.Path("/tmp") / ("substrat-oci-root-" + "r" * 90))
        pod = Pod(long_node, "longroot")
        sleeper = pod.container("sleeper", ["/bin/sleep", "1000"])
        out = pod.exec(sleeper, ["/bin/echo", "reached"])
        assert out.exit_code == 0 and out.stdout == b"reached\n", out
        assert len(str(long_node.oci_root)) > 100
        pod.remove()
    finally:
        if long_node is not None:
            long_node.close()


def test_the_node_policy_needs_a_workspace_and_the_pod_names_it():
    """With a policy for every pod (oci.toml `policy = "worker"`), a
    container's workspace is the pod's `io.substrat.workspace` annotation
    (passed by the handler's pod_annotations), else its working directory;
    `/`, the pause container's and most images', is refused by name."""
    node = cri.Node(operator_config='policy = "worker"\n')
    try:
        api = node.api
        # The pod's own (pause) container is refused first.
        with pytest.raises(Exception) as refused:
            Pod(node, "bare-policy")
        text = str(refused.value)
        assert "process.cwd: the policy's workspace cannot be /" in text and "io.substrat.workspace" in text, text
        node.remove_all_pods()

        pod = Pod(node, "policy", annotations={"io.substrat.workspace": "/work"})
        # The pod's emptyDir, as kubelet makes it (a directory of its own,
        # mode 0777): shown as it is, the container a stranger to the host.
        volume = node.dir / "empty-dir"
        volume.mkdir()
        volume.chmod(0o777)
        app = pod.container(
            "app", ["/bin/sleep", "1000"], mounts=[api.Mount(container_path="/work", host_path=str(volume))]
        )
        out = pod.exec(app, ["/bin/sh", "-c", "touch /work/made && echo made; touch /etc/x 2>&1; true"])
        assert out.stdout.decode().startswith("made\n"), out
        assert "touch: /etc/x: Permission denied" in out.stdout.decode(), out
        assert (volume / "made").exists()
        pod.remove()
    finally:
        node.close()


def test_a_pod_on_the_hosts_network_is_refused_by_name(node):
    """hostNetwork: containerd gives the pause container no network
    namespace, the runtime-spec's way to say the host's: refused."""
    api = node.api
    context = api.LinuxSandboxSecurityContext(namespace_options=api.NamespaceOption(network=api.NODE, pid=api.CONTAINER))
    with pytest.raises(Exception) as refused:
        Pod(node, "host-network", security_context=context)
    text = str(refused.value)
    assert "linux.namespaces: no network namespace" in text and "hostNetwork" in text, text
    node.remove_all_pods()


def test_the_pods_security_context_holds_inside(node):
    """runAsUser, readOnlyRootFilesystem, allowPrivilegeEscalation false,
    seccompProfile RuntimeDefault, capabilities: what a container sees."""
    api = node.api
    pod = Pod(node, "context")
    context = api.LinuxContainerSecurityContext(
        run_as_user=api.Int64Value(value=1234),
        readonly_rootfs=True,
        no_new_privs=True,
        seccomp=api.SecurityProfile(profile_type=api.SecurityProfile.RuntimeDefault),
        capabilities=api.Capability(drop_capabilities=["ALL"]),
        namespace_options=pod.namespaces(),
    )
    app = pod.container("app", ["/bin/sleep", "1000"], linux=api.LinuxContainerConfig(security_context=context))
    script = "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; touch /made 2>&1; true"
    out = pod.exec(app, ["/bin/sh", "-c", script]).stdout.decode()
    assert out.startswith("1234\n"), out
    for line in ("CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"):
        assert line in out, out
    assert "touch: /made: Read-only file system" in out, out
    # What widens nothing: Unconfined seccomp (substrat's default still
    # applies), allowPrivilegeEscalation true (no_new_privs set anyway).
    wide = api.LinuxContainerSecurityContext(
        seccomp=api.SecurityProfile(profile_type=api.SecurityProfile.Unconfined),
        no_new_privs=False,
        namespace_options=pod.namespaces(),
    )
    loose = pod.container("loose", ["/bin/sleep", "1000"], linux=api.LinuxContainerConfig(security_context=wide))
    out = pod.exec(loose, ["/bin/sh", "-c", script]).stdout.decode()
    for line in ("CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"):
        assert line in out, out
    pod.remove()


def test_an_added_capability_is_refused_by_name(node):
    """capabilities.add beyond the engine's defaults: refused naming the
    capability (it was quietly dropped); the defaults alone, or re-added,
    widen nothing (the container gets none)."""
    api = node.api
    pod = Pod(node, "capadd")
    for caps in (["NET_ADMIN"], ["SYS_ADMIN"], ["CHOWN", "BPF"]):
        context = api.LinuxContainerSecurityContext(
            capabilities=api.Capability(add_capabilities=caps), namespace_options=pod.namespaces()
        )
        with pytest.raises(Exception) as refused:
            pod.container(f"add-{caps[-1].lower()}", ["/bin/true"], linux=api.LinuxContainerConfig(security_context=context))
        text = str(refused.value)
        assert re.search(rf"process\.capabilities\.\w+: CAP_{caps[-1]} is added", text), text
    context = api.LinuxContainerSecurityContext(
        capabilities=api.Capability(add_capabilities=["CHOWN", "NET_RAW"]), namespace_options=pod.namespaces()
    )
    app = pod.container("defaults", ["/bin/sleep", "1000"], linux=api.LinuxContainerConfig(security_context=context))
    out = pod.exec(app, ["/bin/grep", "CapEff", "/proc/self/status"]).stdout.decode()
    assert "CapEff:\t0000000000000000" in out, out
    pod.remove()


def test_a_privileged_container_is_refused_by_name(node):
    """privileged: true: containerd gives the container every capability
    and host device, and no masked path: refused, naming privileged (with
    or without host devices: privileged_without_host_devices)."""
    api = node.api
    context = api.LinuxSandboxSecurityContext(privileged=True, namespace_options=api.NamespaceOption(pid=api.CONTAINER))
    pod = Pod(node, "privileged", security_context=context)
    privileged = api.LinuxContainerSecurityContext(privileged=True, namespace_options=pod.namespaces())
    with pytest.raises(Exception) as refused:
        pod.container("app", ["/bin/sleep", "1000"], linux=api.LinuxContainerConfig(security_context=privileged))
    text = str(refused.value)
    assert "process.capabilities: a privileged container" in text, text
    assert "drop `privileged`" in text, text
    pod.remove()


def test_each_node_has_its_own_bridge_subnet_and_cgroup_top(node):
    """Runs in parallel never share the pods' bridge, subnet or cgroups."""
    tags = [f"cri{n:08x}" for n in range(200)]
    networks = [cri.node_network(tag) for tag in tags]
    assert all(len(bridge) <= 15 for bridge, _ in networks), networks
    assert len({bridge for bridge, _ in networks}) == len(tags)
    # 12,800 subnets: 200 nodes at once collide about twice (birthday).
    assert len({subnet for _, subnet in networks}) >= len(tags) - 5, "subnets collide"
    assert node.bridge == cri.node_network(node.dir.name)[0]
    assert node.dir.name in node.cgroup_top
    links = subprocess.run(["ip", "-o", "link", "show", node.bridge], capture_output=True, text=True)
    assert node.bridge in links.stdout or links.returncode != 0, links
