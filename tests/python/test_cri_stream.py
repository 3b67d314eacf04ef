"""Streaming exec and attach through CRI, as kubelet and kubectl do them
(issue 44): the `Exec` and `Attach` RPCs return a URL of containerd's
streaming server, spoken to here over WebSocket with the `v4.channel.k8s.io`
subprotocol (the first byte of each message is the channel: stdin 0,
stdout 1, stderr 2, error 3 (a metav1.Status at the end), resize 4). The
node: tests/python/cri.py; the pods: test_cri.Pod."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import cri
import test_cri

REASON = cri.skip_reason()
try:
    import websocket  # websocket-client (PyPI; Debian python3-websocket)
except ImportError:
    websocket = None
    REASON = REASON or "websocket-client is not installed (scripts/setup installs it with pip)"
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CRI streaming suite: {REASON}")

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4


@pytest.fixture(scope="module")
def node():
    node = cri.Node()
    yield node
    node.close()


class Stream:
    """One remotecommand session over WebSocket: what arrives, by channel."""

    def __init__(self, url: str):
        assert url.startswith("http://"), url
        self.ws = websocket.create_connection(
            "ws://" + url[len("http://"):], subprotocols=["v4.channel.k8s.io"], timeout=20
        )
        self.received: dict[int, bytes] = {STDOUT: b"", STDERR: b"", ERROR: b""}
        self.closed = False

    def send(self, channel: int, data: bytes) -> None:
        self.ws.send_binary(bytes([channel]) + data)

    def resize(self, width: int, height: int) -> None:
        self.send(RESIZE, json.dumps({"Width": width, "Height": height}).encode())

    def pump(self, timeout: float) -> None:
        """Reads what comes within `timeout` seconds (or until the end)."""
        if self.closed:
            return
        self.ws.settimeout(timeout)
        try:
            frame = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            return
        except websocket.WebSocketConnectionClosedException:
            self.closed = True
            return
        if isinstance(frame, str):
            frame = frame.encode()
        if not frame:
            self.closed = True
            return
        self.received[frame[0]] = self.received.get(frame[0], b"") + frame[1:]

    def until(self, what: str, predicate, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.closed or time.monotonic() > deadline:
                raise AssertionError(f"{what}: not seen; received {self.received}")
            self.pump(0.2)

    def text(self, channel: int) -> str:
        return self.received.get(channel, b"").decode(errors="replace")

    def to_end(self, timeout: float = 20.0) -> dict:
        """Reads until the server closes; the error channel's Status."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            assert time.monotonic() < deadline, f"the stream did not end: {self.received}"
            self.pump(0.5)
        return json.loads(self.received[ERROR]) if self.received[ERROR] else {}

    def close(self) -> None:
        self.ws.close()


def exit_code(status: dict) -> int:
    """The command's exit code from remotecommand's Status (v4)."""
    if status.get("status") == "Success":
        return 0
    assert status.get("reason") == "NonZeroExitCode", status
    causes = status["details"]["causes"]
    return int(next(c["message"] for c in causes if c["reason"] == "ExitCode"))


def exec_url(node: cri.Node, container_id: str, cmd: list[str], tty=False, stdin=False) -> str:
    request = node.api.ExecRequest(container_id=container_id, cmd=cmd, tty=tty, stdin=stdin,
                                   stdout=True, stderr=not tty)
    return node.runtime.Exec(request, timeout=30).url


def test_streaming_exec_without_a_terminal_gives_streams_and_exit_code(node):
    pod = test_cri.Pod(node, "stream-plain")
    sleeper = pod.container("sleeper", ["/bin/sleep", "1000"])
    stream = Stream(exec_url(node, sleeper, ["/bin/sh", "-c", "echo out; echo err >&2; [ -t 1 ] || echo no-tty; exit 3"]))
    status = stream.to_end()
    assert stream.text(STDOUT) == "out\nno-tty\n", stream.received
    assert stream.text(STDERR) == "err\n", stream.received
    assert exit_code(status) == 3, status
    stream = Stream(exec_url(node, sleeper, ["/bin/true"]))
    assert exit_code(stream.to_end()) == 0
    pod.remove()


def test_streaming_exec_with_a_terminal_is_sized_and_resized(node):
    pod = test_cri.Pod(node, "stream-tty")
    sleeper = pod.container("sleeper", ["/bin/sleep", "1000"])
    stream = Stream(exec_url(node, sleeper, ["/bin/sh"], tty=True, stdin=True))
    # kubectl sends the terminal's size first, and again at each change.
    stream.resize(111, 33)
    stream.send(STDIN, b"tty; stty size\n")
    stream.until("the first size", lambda: "33 111" in stream.text(STDOUT))
    assert "/dev/pts/" in stream.text(STDOUT), stream.received
    stream.resize(80, 24)
    stream.send(STDIN, b"stty size; exit 7\n")
    status = stream.to_end()
    assert "24 80" in stream.text(STDOUT), stream.received
    assert exit_code(status) == 7, status
    # A terminal's exec whose client goes away keeps running, as under
    # runc: containerd's shim keeps the terminal's master open (no hangup;
    # kubernetes/kubernetes#89031). Stopping the pod ends it.
    marker = f"substrat-cri-{uuid.uuid4().hex[:8]}"
    stream = Stream(exec_url(node, sleeper, ["/bin/sh", "-c", f"sh; exit $?; : {marker}"], tty=True, stdin=True))
    # The answer, not the terminal's echo of the line (which comes before
    # the shell runs).
    stream.send(STDIN, b"echo left-$((40+2))\n")
    stream.until("the shell's answer", lambda: "left-42" in stream.text(STDOUT))
    stream.close()
    time.sleep(1)
    assert cri.processes_with(marker), "the abandoned exec ended (containerd closed its terminal)"
    pod.remove()
    assert cri.processes_with(marker) == [], "the exec's process survived its pod"


def test_streaming_exec_stdin_reaches_cat_and_ends_with_the_stream(node):
    marker = f"substrat-cri-{uuid.uuid4().hex[:8]}"
    pod = test_cri.Pod(node, "stream-stdin")
    sleeper = pod.container("sleeper", ["/bin/sleep", "1000"])
    stream = Stream(exec_url(node, sleeper, ["/bin/sh", "-c", f"cat; : {marker}"], stdin=True))
    stream.send(STDIN, b"through-stdin\n")
    stream.until("the line back from cat", lambda: stream.text(STDOUT) == "through-stdin\n")
    assert cri.processes_with(marker), "the exec does not run"
    # kubectl gone (v4 cannot half-close stdin): the process gets the end
    # of its input and ends; nothing of the exec is left.
    stream.close()
    cri.wait_until("the exec's process ends", lambda: cri.processes_with(marker) == [])
    assert pod.status(sleeper).state == node.api.CONTAINER_RUNNING
    pod.remove()


def test_attach_to_a_container_with_stdin_and_a_terminal(node):
    marker = f"substrat-cri-{uuid.uuid4().hex[:8]}"
    pod = test_cri.Pod(node, "attach")
    shell = pod.container("shell", ["/bin/sh", "-c", f"sh -i; exit $?; : {marker}"], stdin=True, tty=True)
    request = node.api.AttachRequest(container_id=shell, stdin=True, stdout=True, tty=True)
    stream = Stream(node.runtime.Attach(request, timeout=30).url)
    stream.resize(100, 30)
    stream.send(STDIN, b"echo attached-$((6*7)); tty; stty size\n")
    stream.until("the shell's answer", lambda: "attached-42" in stream.text(STDOUT) and "30 100" in stream.text(STDOUT))
    assert "/dev/pts/0" in stream.text(STDOUT), stream.received
    stream.send(STDIN, b"exit 4\n")
    stream.to_end()
    cri.wait_until("the container exits",
                   lambda: pod.status(shell).state == node.api.CONTAINER_EXITED)
    assert pod.status(shell).exit_code == 4
    pod.remove()
    assert cri.processes_with(marker) == []


def test_attach_to_a_container_with_stdin_and_no_terminal(node):
    pod = test_cri.Pod(node, "attach-pipe")
    reader = pod.container("reader", ["/bin/sh", "-c", "while read line; do echo \"got:$line\"; echo \"err:$line\" >&2; done; exit 6"],
                           stdin=True, stdin_once=True)
    request = node.api.AttachRequest(container_id=reader, stdin=True, stdout=True, stderr=True)
    stream = Stream(node.runtime.Attach(request, timeout=30).url)
    stream.send(STDIN, b"through-the-fifo\n")
    stream.until("the container's answer", lambda: "got:through-the-fifo\n" in stream.text(STDOUT)
                 and "err:through-the-fifo\n" in stream.text(STDERR))
    # stdin_once: the container's stdin ends with this attach (as kubectl
    # run -i --rm): the loop ends and the container exits with its code.
    stream.close()
    cri.wait_until("the container exits",
                   lambda: pod.status(reader).state == node.api.CONTAINER_EXITED)
    assert pod.status(reader).exit_code == 6
    pod.remove()
