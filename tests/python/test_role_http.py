"""The roles' HTTP endpoints (seed 004 §7) of a daemon started with
--roles-http: with and without the token, each error of §7.3, on a loopback
port and on a Unix socket."""

import http.client
import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import REPO

TOKEN = "roles-http-token-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def start(substrat_bin, listen):
    state = pathlib.Path(tempfile.mkdtemp()) / "state"
    proc = subprocess.Popen(
        [str(substrat_bin), "daemon", "--state-dir", str(state), "--policies", str(REPO / "tests/broker/policies"),
         "--roles-http", listen, "--roles-http-token-env", "SUBSTRAT_TEST_ROLES_TOKEN"],
        env={**os.environ, "SUBSTRAT_LOG": "warn", "SUBSTRAT_TEST_ROLES_TOKEN": TOKEN})
    deadline = time.time() + 15
    while not (state / "control.sock").exists():
        assert time.time() < deadline and proc.poll() is None, "daemon did not start"
        time.sleep(0.05)
    return proc, state


def request(conn, method, path, body=None, token=TOKEN):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    return response.status, (json.loads(payload) if payload else None), response


def stop(proc):
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def test_the_roles_endpoints_over_tcp(substrat_bin):
    port = free_port()
    proc, _ = start(substrat_bin, f"127.0.0.1:{port}")
    try:
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "the endpoints do not listen"
                time.sleep(0.05)
        conn = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        # No token, a wrong one: 401 before anything else, even for unknown paths.
        for token in [None, "wrong", TOKEN + "x", ""]:
            for path in ["/agents/list", "/nothing"]:
                status, body, response = request(conn(), "GET", path, token=token)
                assert status == 401 and body["error"]["code"] == "unauthorized", (token, path, body)
                assert response.getheader("WWW-Authenticate") == "Bearer"
        # §7.1
        status, body, _ = request(conn(), "GET", "/agents/list")
        assert status == 200
        agents = {a["name"]: a for a in body["agents"]}
        assert agents["responder"] == {
            "name": "responder", "description": "Triages incidents with the team's help",
            "tools": ["send_message", "check_inbox"], "source": "lua",
            "arguments": [{"name": "service", "description": "The service with the incident", "required": True},
                          {"name": "severity", "description": "P1, P2 or P3", "required": False}]}
        assert agents["worker"]["source"] == "toml" and agents["worker"]["arguments"] == []
        # §7.2
        status, body, _ = request(conn(), "POST", "/agents/responder/prompt",
                                  {"arguments": {"service": "payments-api", "severity": "P1"}})
        assert status == 200, body
        assert body["result"]["system"].startswith("You respond to a P1 incident on payments-api.")
        assert body["result"]["tools"] == ["send_message", "check_inbox"]
        assert body["result"]["messages"] == [{"role": "assistant", "content": "Ready to triage payments-api."}]
        status, body, _ = request(conn(), "POST", "/agents/reviewer/prompt")
        assert status == 200 and "You are a reviewer" in body["result"]["system"]
        # §7.3, each error.
        cases = [
            ("POST", "/agents/nobody/prompt", {}, 404, "not_found"),
            ("POST", "/agents/responder/prompt", {"arguments": {"severity": "P1"}}, 400, "bad_request"),
            ("POST", "/agents/responder/prompt", b"{not json", 400, "bad_request"),
            ("POST", "/agents/failing/prompt", {}, 500, "agent_error"),
            ("POST", "/agents/looper/prompt", {}, 408, "timeout"),
            ("GET", "/agents/responder/prompt", None, 405, "method_not_allowed"),
            ("GET", "/other", None, 404, "not_found"),
        ]
        for method, path, sent, wanted_status, code in cases:
            status, body, _ = request(conn(), method, path, sent)
            assert (status, body["error"]["code"]) == (wanted_status, code), (path, sent, body)
        status, body, _ = request(conn(), "POST", "/agents/failing/prompt", {})
        assert "the runbook index is missing" in body["error"]["message"], body
        # Still serving.
        assert request(conn(), "GET", "/agents/list")[0] == 200
    finally:
        stop(proc)


def test_the_roles_endpoints_on_a_unix_socket(substrat_bin):
    path = pathlib.Path(tempfile.mkdtemp(dir="/tmp")) / "roles.sock"
    proc, _ = start(substrat_bin, f"unix:{path}")
    try:
        deadline = time.time() + 10
        while not path.exists():
            assert time.time() < deadline, "no socket"
            time.sleep(0.05)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        status, body, _ = request(UnixConnection(str(path)), "GET", "/agents/list")
        assert status == 200 and any(a["name"] == "responder" for a in body["agents"])
        assert request(UnixConnection(str(path)), "GET", "/agents/list", token=None)[0] == 401
    finally:
        stop(proc)


def test_the_endpoints_refuse_a_public_address_and_a_short_token(substrat_bin, tmp_path):
    kept = tmp_path / "notes.txt"
    kept.write_text("the operator's file")
    for listen, env, wanted in [
        ("0.0.0.0:8750", TOKEN, "loopback address or a Unix socket only"),
        ("127.0.0.1:8750", "short", "at least 16 characters"),
        # A path that is not a socket is never removed to make room.
        (f"unix:{kept}", TOKEN, "Address already in use"),
    ]:
        out = subprocess.run(
            [str(substrat_bin), "daemon", "--state-dir", tempfile.mkdtemp(dir="/tmp") + "/s", "--roles-http", listen,
             "--roles-http-token-env", "SUBSTRAT_TEST_ROLES_TOKEN"],
            env={**os.environ, "SUBSTRAT_TEST_ROLES_TOKEN": env}, capture_output=True, text=True, timeout=20)
        assert out.returncode == 2 and wanted in out.stderr, out.stderr
    assert kept.read_text() == "the operator's file"
