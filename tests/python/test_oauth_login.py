"""OAuth 2.1 for a remote upstream server, end to end through the daemon
(issue 41): `tools login`, the agent's calls, the refresh before expiry,
`tools logout`, and a search of an agent's sandbox for the tokens.

The server is tests/python/peers/oauth_server.py: the official Python
SDK's MCP server over streamable HTTP and its authorization-server routes
(PKCE checked by the SDK), with random tokens that expire after
EXPIRES_IN seconds and a page of what happened for the test. The test
plays the person: it opens the URL `tools login` prints (urllib, the
redirect followed to the daemon's loopback listener)."""

import base64
import json
import os
import pathlib
import secrets
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from mcp.shared.exceptions import MCPError

from conftest import REPO
from test_broker_mcp import RELAY
from test_upstreams import call, free_port, text, wait_listening

SERVER = "oauth"
# rmcp refreshes a token whose remaining life is under 30 s: with 32 s, the
# first refresh comes after about 2 s, long before the token expires, and
# the first token is expired 32 s after the login.
EXPIRES_IN = 32


def http_get(url):
    """A browser's GET: redirects followed, no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        return response.status, response.geturl(), response.read().decode()


class Run:
    """The daemon and what every command of the operator printed."""

    def __init__(self, substrat_bin, root, policies, config, env):
        self.bin, self.state, self.root = str(substrat_bin), root / "state", root
        self.outputs = []
        self.log = open(root / "daemon.log", "wb")
        self.proc = subprocess.Popen(
            [self.bin, "daemon", "--provider", "stand-in", "--backend", "native", "--state-dir", str(self.state),
             "--policies", str(policies), "--upstreams", str(config)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait(lambda: (self.state / "control.sock").exists(), "the daemon listens", 30)

    def wait(self, done, what, seconds):
        deadline = time.time() + seconds
        while not done():
            assert self.proc.poll() is None, f"the daemon exited: {(self.root / 'daemon.log').read_text()}"
            assert time.time() < deadline, f"timed out waiting until {what}"
            time.sleep(0.1)

    def cli(self, *args, ok=True):
        out = subprocess.run([self.bin, *args, "--json", "--state-dir", str(self.state)], capture_output=True,
                             text=True, timeout=60)
        self.outputs.append((args, out.stdout + out.stderr))
        assert (out.returncode == 0) == ok, out.stdout + out.stderr
        return json.loads(out.stdout) if ok else out.stderr

    def server(self):
        [entry] = [s for s in self.cli("tools", "list")["servers"] if s["server"] == SERVER]
        return entry

    def turns(self, name):
        db = sqlite3.connect(f"file:{self.state / 'state.db'}?mode=ro", uri=True)
        try:
            return db.execute("SELECT t.status, t.result, t.error FROM turns t JOIN agents a ON a.id = t.agent_id "
                              "WHERE a.name = ? ORDER BY t.seq", (name,)).fetchall()
        finally:
            db.close()

    def stop(self):
        self.proc.terminate()
        code = self.proc.wait(timeout=20)
        self.log.close()
        assert code == 0, (self.root / "daemon.log").read_text()


def fixture_state(port):
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{port}/test/state", timeout=10) as response:
        return json.loads(response.read())


def generation(result):
    body = text(result)
    assert not result.is_error and body.startswith("generation="), body
    return int(body.removeprefix("generation="))


# The search, run by the agent's shell in its sandbox: its environment,
# every visible process's environment and command line, the MCP config
# the agent was given, the token file by its path, and every readable
# file below 2 MiB outside the kernel's trees and the host's system
# directories (bound read-only; the daemon writes none of them), gathered
# into the workspace in sections. The test looks for the tokens in it by
# value: the sandbox is gone by then and every token ever issued is known.
SEARCH = r"""
{{
  printf '\n### env\n'; env
  printf '\n### environ\n'; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; echo; done
  printf '\n### cmdline\n'; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done
  printf '\n### mcp.json\n'; cat .cursor/mcp.json
  printf '\n### token file\n'; cat {token_file} 2>&1; ls -la {token_dir} 2>&1
  printf '\n### files\n'
  find / \( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path '/lib*' -o -path /bin -o -path /sbin \
         -o -path /tmp/haystack \) -prune -o -type f -size -2M -readable -print > /tmp/files 2>/dev/null
  wc -l < /tmp/files
  tr '\n' '\0' < /tmp/files | xargs -0 -r cat 2>/dev/null
  printf '\n### end\n'
}} > /tmp/haystack 2>&1
cp /tmp/haystack haystack.out && echo searched
"""


def sections(haystack: bytes):
    """The search's output by section name."""
    out, name = {}, None
    for line in haystack.split(b"\n"):
        if line.startswith(b"### "):
            name = line[4:].decode()
            out[name] = b""
        elif name is not None:
            out[name] += line + b"\n"
    return out


@pytest.fixture
def root(substrat_bin):
    try:
        import uvicorn  # noqa: F401
        from mcp.server.auth.provider import OAuthAuthorizationServerProvider  # noqa: F401
        from mcp.server.mcpserver import MCPServer  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the Python MCP SDK's server pieces are missing ({e}): run scripts/setup")
    for binary in ["substrat-stand-in-agent", "substrat-run", "substrat-mcp-server"]:
        if not (pathlib.Path(substrat_bin).parent / binary).is_file():
            pytest.skip(f"{binary} is not built next to {substrat_bin}: cargo build --workspace")
    if not RELAY.is_file():
        pytest.skip(f"{RELAY} is not built")
    probe = subprocess.run([str(substrat_bin), "run", "--policy", "worker", "--backend", "native", "--", "true"],
                           capture_output=True, text=True, cwd=REPO)
    if probe.returncode != 0:
        pytest.skip(f"no native sandbox on this host: {probe.stderr.strip()}")
    # Short: agents' socket paths must fit in 107 bytes.
    path = pathlib.Path(tempfile.mkdtemp(prefix="oa", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_login_refresh_logout_and_no_token_in_a_sandbox(root, substrat_bin):
    port = free_port()
    fixture = subprocess.Popen([sys.executable, str(REPO / "tests/python/peers/oauth_server.py"), str(port),
                                str(EXPIRES_IN)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = None
    try:
        wait_listening(port, "the OAuth fixture")
        policies = root / "policies"
        policies.mkdir()
        # The shipped worker role, allowed the server's tools.
        (policies / "oauth-user.toml").write_text(
            f'version = 1\nextends = "worker"\n[tools]\nallow = ["check_inbox", "{SERVER}_*"]\n')
        config = root / "upstreams.json"
        # No client_id: dynamic registration (RFC 7591).
        config.write_text(json.dumps({"mcpServers": {SERVER: {"url": f"http://127.0.0.1:{port}/mcp", "oauth": {}}}}))
        env_marker = "envcontrol" + secrets.token_hex(12)
        env = {**os.environ, "SUBSTRAT_LOG": "debug", "LC_SUBSTRAT_TEST": env_marker}
        d = Run(substrat_bin, root, policies, config, env)

        # Before the login: down, telling the operator what to run.
        d.wait(lambda: d.server()["status"]["status"] == "down", "the server is down without tokens", 30)
        reason = d.server()["status"]["reason"]
        assert f"tools login {SERVER}" in reason, reason

        # The login, as the operator runs it; the test is the browser.
        login = subprocess.Popen([d.bin, "tools", "login", SERVER, "--json", "--state-dir", str(d.state)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        begun = json.loads(login.stdout.readline())
        assert begun["ok"] is True and begun["server"] == SERVER, begun
        assert begun["url"].startswith(f"http://127.0.0.1:{port}/authorize?"), begun
        status, landed, page = http_get(begun["url"])
        assert status == 200 and landed.startswith("http://127.0.0.1:") and "/callback?code=" in landed, landed
        assert "received" in page, page
        rest, errors = login.communicate(timeout=30)
        d.outputs.append((("tools", "login", SERVER), json.dumps(begun) + rest + errors))
        assert login.returncode == 0, rest + errors
        done = json.loads(rest)
        token_file = d.state / "oauth" / f"{SERVER}.json"
        assert done == {"ok": True, "server": SERVER, "stored": str(token_file)}, done

        # The token file: the daemon's user's only.
        info = token_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid(), oct(info.st_mode)
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        first = fixture_state(port)
        [first_access] = [t for t in first["issued"] if t["kind"] == "access"]
        assert first_access["generation"] == 0 and first["authorizations"] == 1 and first["clients"] == 1, first
        assert first_access["token"] in token_file.read_text()

        # The daemon connects with the stored tokens; an agent calls the tool.
        d.wait(lambda: d.server()["status"]["status"] == "up", "the server is up after the login", 30)
        agent = d.cli("agent", "create", "caller", "--role", "oauth-user")
        generation(call(agent, f"{SERVER}_whoami", {}))

        # The refresh, before expiry: a call once the first token has less
        # than 30 s to live (from 3 s after the login) is made with a
        # refreshed one, long before the first expires.
        d.wait(lambda: time.time() > first_access["issued_at"] + 4, "the first access token is 4 s old", 10)
        assert generation(call(agent, f"{SERVER}_whoami", {})) >= 1
        mid = fixture_state(port)
        assert mid["refreshes"] and mid["refreshes"][0]["from_generation"] == 0, mid["refreshes"]
        assert mid["refreshes"][0]["at"] < first_access["expires_at"] - 15, mid["refreshes"]

        # An agent's turn in its sandbox (the stand-in agent: a real MCP
        # client of the broker through the relay, and a shell) calls the
        # tool, then searches everything it can see.
        ws = root / "ws"
        ws.mkdir()
        file_marker = "filecontrol" + secrets.token_hex(12)
        (ws / "marker.txt").write_text(file_marker)
        search = SEARCH.format(token_file=token_file, token_dir=token_file.parent)
        plan = {"turns": [{"steps": [{"call": f"{SERVER}_whoami"}, {"shell": search}, {"reply": "{results}"}]}]}
        d.cli("agent", "spawn", "searcher", "--role", "oauth-user", "--workspace", str(ws),
              f"search\n```substrat-plan\n{json.dumps(plan)}\n```")
        d.wait(lambda: [t[0] for t in d.turns("searcher")] in (["done"], ["failed"]), "the agent's turn ends", 60)
        [(status, result, error)] = d.turns("searcher")
        assert status == "done", (status, result, error)
        assert "generation=" in result and "searched" in result, result

        # The first token expires EXPIRES_IN s after the login; a call after
        # that works, with a newer token.
        d.wait(lambda: time.time() > first_access["expires_at"] + 1, "the first access token expired", EXPIRES_IN + 5)
        after = call(agent, f"{SERVER}_whoami", {})
        used = generation(after)
        state = fixture_state(port)
        issued = {(t["kind"], t["generation"]): t for t in state["issued"]}
        assert used >= 1 and issued[("access", used)]["expires_at"] > time.time(), (used, state["issued"])
        assert state["authorizations"] == 1, "refreshed, not authorized again"
        with_tokens = [r for r in state["requests"] if isinstance(r["generation"], int)]
        assert not [r for r in with_tokens if r["expired"] or r["revoked"] or r["status"] == 401], state["requests"]
        assert any(r["generation"] >= 1 for r in with_tokens)
        # The file follows the refreshes (the newest tokens), still private.
        newest = max(g for (kind, g) in issued if kind == "access")
        stored = token_file.read_text()
        assert issued[("access", newest)]["token"] in stored and issued[("refresh", newest)]["token"] in stored
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and token_file.stat().st_uid == os.getuid()

        # What the operator's commands show.
        d.cli("tools", "list")
        d.cli("agent", "inspect", "caller")
        d.cli("agent", "inspect", "searcher")
        d.cli("agent", "list")

        # Logout: both tokens revoked at the server, the file gone, and the
        # next call tells the operator to log in again.
        restarts = d.server()["restarts"]
        out = d.cli("tools", "logout", SERVER)
        assert out == {"ok": True, "server": SERVER, "outcome": "revoked"}, out
        revoked = {(r["kind"], r["generation"]) for r in fixture_state(port)["revocations"]}
        assert {("access", newest), ("refresh", newest)} <= revoked, revoked
        assert not token_file.exists()
        assert [p.name for p in token_file.parent.iterdir()] == []
        # The session made with them ended with the logout: down at once,
        # and calls say what the operator must do.
        after_logout = d.server()["status"]
        assert after_logout["status"] == "down" and f"tools login {SERVER}" in after_logout["reason"], after_logout
        try:
            refused = text(call(agent, f"{SERVER}_whoami", {}))
        except MCPError as e:
            refused = str(e)
        assert f"upstream server `{SERVER}` is not authorized: an operator must run " \
               f"`substrat-sandbox tools login {SERVER}`" in refused, refused
        # It stays so: reconnecting finds no tokens.
        d.wait(lambda: d.server()["restarts"] > restarts, "the broker connects again", 15)
        d.wait(lambda: d.server()["status"]["status"] == "down", "the reconnection fails", 15)
        assert f"tools login {SERVER}" in d.server()["status"]["reason"]
        assert d.cli("tools", "logout", SERVER)["outcome"] == "nothing_stored"
        outputs = d.outputs
        d.stop()
        d = None

        # The secret search ran and saw its controls...
        tokens = [t["token"] for t in fixture_state(port)["issued"]]
        assert len(tokens) >= 4
        haystack = (ws / "haystack.out").read_bytes()
        seen = sections(haystack)
        assert set(seen) >= {"env", "environ", "cmdline", "mcp.json", "token file", "files", "end"}, list(seen)
        assert env_marker.encode() in seen["env"] and env_marker.encode() in seen["environ"]
        assert b"substrat-stand-in-agent" in seen["cmdline"] and b"substrat-mcp-server" in seen["cmdline"], \
            seen["cmdline"]
        assert b"mcpServers" in seen["mcp.json"], seen["mcp.json"]
        assert b"No such file" in seen["token file"] or b"Permission denied" in seen["token file"], seen["token file"]
        assert file_marker.encode() in seen["files"] and int(seen["files"].split(b"\n")[0]) > 10
        # ... and found no token.
        for token in tokens:
            assert token.encode() not in haystack, "a token was readable in the agent's sandbox"
        # Nor is one in the daemon's output, a file of its state directory
        # (logs, audit, database) or anything a command printed.
        daemon_log = (root / "daemon.log").read_bytes()
        assert daemon_log, "the daemon printed nothing"
        for token in tokens:
            assert token.encode() not in daemon_log, "a token in the daemon's log"
            for path in (root / "state").rglob("*"):
                if path.is_file() and not path.is_symlink():
                    assert token.encode() not in path.read_bytes(), f"a token in {path}"
            for args, printed in outputs:
                assert token not in printed, f"a token in the output of {args}"
    finally:
        if d is not None:
            d.stop()
        fixture.kill()
        fixture.wait()
