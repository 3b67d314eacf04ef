"""A kubelet subPath through CRI (issue 44, the attacker's review of
hostsock): kubelet bind-mounts a subPath at
/var/lib/kubelet/pods/UID/volume-subpaths/VOL/CTR/N and hands that path to
containerd. The runtime took it for the pod's own engine file, by its
path: `hostPath: /` with `subPath: etc` gave the pod the host's /etc,
read-write and idmapped (container root acting as host root). It is now
judged by what the bind mount shows (/etc: refused), and a subPath of the
pod's own emptyDir stays the pod's own.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

import cri
from test_cri import Pod, node  # noqa: F401  (the fixture)


def test_atk_a_subpath_of_the_hosts_etc_is_refused(node):  # noqa: F811
    api = node.api
    pod = Pod(node, "subpath")
    kubelet = pathlib.Path("/var/lib/kubelet")
    made = kubelet if not kubelet.exists() else kubelet / "pods" / pod.uid
    subpaths = kubelet / "pods" / pod.uid / "volume-subpaths"
    # What kubelet does for `hostPath: {path: /}` + `subPath: etc`, and for
    # an emptyDir `cache` + `subPath: sub`.
    etc = subpaths / "root" / "c" / "0"
    empty = kubelet / "pods" / pod.uid / "volumes" / "kubernetes.io~empty-dir" / "cache" / "sub"
    own = subpaths / "cache" / "c" / "1"
    for place in (etc, empty, own):
        place.mkdir(parents=True)
    subprocess.run(["mount", "--bind", "/etc", str(etc)], check=True)
    subprocess.run(["mount", "--bind", str(empty), str(own)], check=True)
    written = pathlib.Path("/etc/atk-written-by-pod")
    try:
        mount = api.Mount(container_path="/host-etc", host_path=str(etc), readonly=False)
        with pytest.raises(Exception) as refused:
            c = pod.container("c", ["/bin/sleep", "1000"], mounts=[mount])
            # Were it created: what the attacker did with it.
            pod.exec(c, ["/bin/touch", "/host-etc/atk-written-by-pod"])
        text = str(refused.value)
        print("refused:", text[:400])
        assert "read-write bind of the host's" in text and "/etc" in text, text
        assert "refused" in text, text
        assert not written.exists(), "the pod wrote into the host's /etc"
        # The pod's emptyDir through a subPath: its own, writable as root.
        mount = api.Mount(container_path="/cache", host_path=str(own), readonly=False)
        c = pod.container("own", ["/bin/sleep", "1000"], mounts=[mount])
        touched = pod.exec(c, ["/bin/touch", "/cache/made"])
        assert touched.exit_code == 0, touched.stderr
        st = (empty / "made").stat()
        assert st.st_uid == 0, f"the pod's file is not root's on the host: {st.st_uid}"
        pod.remove()
    finally:
        written.unlink(missing_ok=True)
        subprocess.run(["umount", "-l", str(etc)], check=False)
        subprocess.run(["umount", "-l", str(own)], check=False)
        shutil.rmtree(made, ignore_errors=True)
