"""Agents over MCP streamable HTTP (issue 41): the agent's broker socket
speaks HTTP too (told from the line protocol by the first byte), served by
rmcp's streamable HTTP server behind the broker's own door. Driven with the
real Python MCP SDK over the socket (what the sandbox's bridge carries from
127.0.0.1:3130) and with raw HTTP for what a client must not get away with."""

import asyncio
import http.client
import json
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from conftest import REPO
from test_broker_mcp import daemon  # noqa: F401  (the fixture)
from test_upstreams import Daemon, free_port, wait_listening

URL = "http://127.0.0.1:3130/mcp"
ACCEPT = "application/json, text/event-stream"


class UnixHTTP(http.client.HTTPConnection):
    """HTTP/1.1 to a Unix socket, with the Host a client in the sandbox sends."""

    def __init__(self, path):
        super().__init__("127.0.0.1", 3130, timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def post(agent, body, headers=None):
    conn = UnixHTTP(agent["socket"])
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", "/mcp", data, {"Content-Type": "application/json", "Accept": ACCEPT, **(headers or {})})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def initialize(agent, headers=None, version="2025-11-25", answer=None):
    status, head, body = post(
        agent,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        },
        headers,
    )
    if answer is not None:
        answer.append(body)
    return status, head.get("mcp-session-id") or head.get("Mcp-Session-Id")


def sse_events(body):
    """The events of an SSE body, each a dict of its fields."""
    events = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


def sdk(agent):
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=agent["socket"]), timeout=10)
    return streamable_http_client(URL, http_client=client)


async def in_session(agent, body):
    async with sdk(agent) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)


def test_the_sdk_over_http_on_the_agents_socket(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    worker = daemon("create", "w1", "--role", "worker", "--parent", "lead")

    async def as_lead(session):
        tools = await session.list_tools()
        assert [t.name for t in tools.tools][:3] == ["send_message", "broadcast", "check_inbox"]
        sent = await session.call_tool("send_message", {"recipient": "w1", "text": "over http", "sync": False})
        assert not sent.is_error, sent
        return json.loads(sent.content[0].text)["message_id"]

    message_id = asyncio.run(in_session(lead, as_lead))

    async def as_worker(session):
        inbox = json.loads((await session.call_tool("check_inbox", {})).content[0].text)
        # Identity is the socket's: the message is the worker's, from lead.
        assert inbox["messages"] == [{"from": "lead", "text": "over http", "message_id": message_id}]

    asyncio.run(in_session(worker, as_worker))


def test_what_the_line_gate_refuses_is_refused_over_http_too(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    daemon("create", "w1", "--role", "worker", "--parent", "lead")
    status, session = initialize(lead)
    assert status == 200 and session
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    post(lead, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    # Speaking for another agent: refused with the request's id, audited.
    spoof = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "send_message", "arguments": {"recipient": "w1", "text": "x", "from": "w1"}},
    }
    status, _, body = post(lead, spoof, headers)
    answer = json.loads(body)
    assert (status, answer["id"], answer["error"]["code"]) == (200, 7, -32600), answer
    assert "naming another agent is refused" in answer["error"]["message"]
    inbox = daemon("inspect", "w1")
    assert not any(m.get("text") == "x" for m in inbox.get("recent_messages", [])), inbox
    # A key twice (two parsers could read it two ways), a batch, not JSON.
    dup = b'{"jsonrpc":"2.0","id":8,"method":"ping","method":"tools/list"}'
    for raw, code in [(dup, -32700), (b"[]", -32600), (b"\xff{", -32700)]:
        status, _, body = post(lead, raw, headers)
        assert (status, json.loads(body)["error"]["code"]) == (400, code), (raw, body)
    # A body past 4 MiB: 413, not read into memory whole.
    status, _, body = post(lead, b'{"x":"' + b"a" * (4 << 20) + b'"}', headers)
    assert status == 413 and b"longer than 4194304 bytes" in body
    # DNS rebinding: a browser's foreign Origin, or a Host that is not
    # the loopback, is refused before anything is read.
    assert initialize(lead, {"Origin": "http://evil.example"})[0] == 403
    assert initialize(lead, {"Host": "evil.example:3130"})[0] in (400, 403)
    assert initialize(lead, {"Origin": "http://127.0.0.1:3130"})[0] == 200


def test_a_ninth_session_ends_the_oldest(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    # Clients of either revision (each served by an rmcp server of its own)
    # count against the same limit.
    versions = ["2025-06-18", "2025-11-25"] * 4 + ["2025-11-25"]
    sessions = [initialize(lead, version=v)[1] for v in versions]
    assert len(set(sessions)) == 9 and all(sessions)
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}

    def ping_in(n):
        return post(lead, ping, {"Mcp-Session-Id": sessions[n], "MCP-Protocol-Version": versions[n]})[0]

    assert ping_in(0) == 404, "the oldest session was ended"
    assert ping_in(1) == 200 and ping_in(2) == 200 and ping_in(8) == 200


def test_the_line_protocol_still_answers_on_the_same_socket(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(lead["socket"])
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
        line = s.makefile("rb").readline()
    assert json.loads(line) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_requests_besides_tool_calls_are_held_to_a_rate(daemon):  # noqa: F811
    """rmcp keeps every answer for a late resumption: an agent must not make
    the daemon hold answers faster than they expire."""
    lead = daemon("create", "lead", "--role", "worker")
    _, session = initialize(lead)
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    post(lead, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    conn = UnixHTTP(lead["socket"])
    statuses = []
    for n in range(160):
        body = json.dumps({"jsonrpc": "2.0", "id": 100 + n, "method": "tools/list"})
        conn.request("POST", "/mcp", body, {"Content-Type": "application/json", "Accept": ACCEPT, **headers})
        response = conn.getresponse()
        answer = response.read()
        statuses.append(response.status)
        if response.status == 429:
            refused = json.loads(answer)
            assert refused["id"] == 100 + n and refused["error"]["code"] == -32000
            assert int(response.getheader("Retry-After")) >= 1
    assert 100 <= statuses.count(200) < 160 and statuses.count(429) == 160 - statuses.count(200), statuses
    # Tool calls are the role's to limit, not this door's.
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "check_inbox", "arguments": {}}}
    assert post(lead, call, headers)[0] == 200


def test_a_session_is_known_only_on_its_own_agents_socket(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    worker = daemon("create", "w1", "--role", "worker", "--parent", "lead")
    _, session = initialize(lead)
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert post(lead, ping, headers)[0] == 200
    # The worker presenting the lead's session id gets no session.
    assert post(worker, ping, headers)[0] == 404
    # Ending it (DELETE) ends it.
    conn = UnixHTTP(lead["socket"])
    conn.request("DELETE", "/mcp", headers=headers)
    assert conn.getresponse().status in (200, 202, 204)
    assert post(lead, ping, headers)[0] == 404


def test_only_initialize_comes_without_a_session_and_an_id_is_used_once(daemon):  # noqa: F811
    lead = daemon("create", "lead", "--role", "worker")
    call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "check_inbox", "arguments": {}}}
    # rmcp would serve this statelessly (2026-07-28), each with a handler
    # of its own: steps counted from zero every time. Refused.
    stateless = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "check_inbox"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    status, _, body = post(lead, {**call, "params": {**call["params"], "_meta": meta}}, stateless)
    assert (status, json.loads(body)["id"], json.loads(body)["error"]["code"]) == (400, 4, -32600), body
    assert b"send initialize first" in body
    # Claude Code probes server/discover first and falls back on an error.
    probe = {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}}
    assert post(lead, probe, {"MCP-Protocol-Version": "2026-07-28"})[0] == 400
    _, session = initialize(lead)
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    post(lead, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    # Naming a session does not change rmcp's mind: a 2026-07-28 request
    # (by its header, or its _meta alone) is served statelessly whatever
    # session it names, live or made up. Refused before rmcp.
    context = {**meta, "io.modelcontextprotocol/clientCapabilities": {}}
    for named in (session, "made-up"):
        for extra, params in [(stateless, call["params"]), ({}, {**call["params"], "_meta": context})]:
            request = {**call, "id": 5, "params": params}
            status, _, body = post(lead, request, {**headers, "Mcp-Session-Id": named, **extra})
            assert (status, json.loads(body)["error"]["code"]) == (400, -32600), body
            assert b"revisions up to 2025-11-25" in body
    assert post(lead, call, headers)[0] == 200
    status, _, body = post(lead, call, headers)
    assert (status, json.loads(body)["error"]["message"]) == (200, "duplicate request id in this session"), body


def test_removing_the_agent_ends_its_http_sessions_and_streams(daemon):  # noqa: F811
    daemon("create", "lead", "--role", "worker")
    w1 = daemon("create", "w1", "--role", "worker", "--parent", "lead")
    _, session = initialize(w1)
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    post(w1, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    stream = UnixHTTP(w1["socket"])
    stream.request("GET", "/mcp", headers={"Accept": "text/event-stream", **headers})
    standing = stream.getresponse()
    assert standing.status == 200
    daemon("remove", "w1")
    # The standing stream ends (the connection closes) within the timeout.
    stream.sock.settimeout(10)
    while standing.fp.readline():
        pass


def test_only_a_client_of_2025_11_25_gets_priming_events(daemon):  # noqa: F811
    """SEP-1699's priming event (an id, `retry`, empty data) is 2025-11-25's.
    Gemini CLI 0.61 asks for 2025-06-18, never sends MCP-Protocol-Version,
    parses an empty data as JSON, and on that error drops the server: it
    offered none of the broker's tools."""
    lead = daemon("create", "lead", "--role", "worker")
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}

    def answers(version, headers):
        bodies = []
        _, session = initialize(lead, version=version, answer=bodies)
        headers = {"Mcp-Session-Id": session, **headers}
        assert post(lead, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)[0] == 202
        status, _, body = post(lead, tools_list, headers)
        assert status == 200, body
        return [sse_events(b) for b in bodies + [body]]

    init, listed = answers("2025-06-18", {})  # as Gemini CLI sends them
    for events in (init, listed):
        assert all(e.get("data") for e in events), events
        assert not any("retry" in e for e in events), events
    assert json.loads(init[-1]["data"])["result"]["protocolVersion"] == "2025-06-18"
    assert "send_message" in [t["name"] for t in json.loads(listed[-1]["data"])["result"]["tools"]]
    for events in answers("2025-11-25", {"MCP-Protocol-Version": "2025-11-25"}):
        primer = events[0]
        assert primer["data"] == "" and primer["id"] and primer["retry"] == "3000", events
        assert json.loads(events[-1]["data"])["id"] in (1, 2)


@pytest.fixture
def slow_daemon(substrat_bin):
    """A daemon whose role `slowuser` may call `notify_slow`, a tool of a
    remote upstream (tests/python/peers/notify_server.py, the Python SDK's
    server) that sleeps: a call whose answer takes a while."""
    try:
        import uvicorn  # noqa: F401
        from mcp.server.mcpserver import MCPServer  # noqa: F401
    except ImportError as e:
        pytest.skip(f"SKIPPED: the slow upstream needs the Python SDK's server and uvicorn ({e})")
    # Short: agents' socket paths must fit in 107 bytes.
    root = pathlib.Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    port = free_port()
    server = subprocess.Popen([sys.executable, str(REPO / "tests/python/peers/notify_server.py"), str(port), str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = None
    try:
        wait_listening(port, "the slow server")
        policies = root / "policies"
        policies.mkdir()
        (policies / "slowuser.toml").write_text(
            'version = 1\nextends = "worker"\n[tools]\nallow = ["check_inbox", "notify_slow"]\n')
        config = root / "upstreams.json"
        config.write_text(json.dumps({"mcpServers": {"notify": {"url": f"http://127.0.0.1:{port}/mcp"}}}))
        d = Daemon(substrat_bin, root, policies, config)
        d.wait(lambda: d.servers()["notify"]["status"]["status"] == "up", "the slow server is up")
        d.marks = root
        yield d
    finally:
        if d is not None:
            d.stop()
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def get(agent, headers):
    """A GET of the endpoint, read to its end: status and body."""
    conn = UnixHTTP(agent["socket"])
    conn.request("GET", "/mcp", headers={"Accept": "text/event-stream", **headers})
    response = conn.getresponse()
    return response.status, response.read()


def test_a_cut_stream_is_resumed_with_the_answer_and_only_by_its_session(slow_daemon):
    """The spec's resumability, done: a client whose POST stream breaks
    mid-call comes back with GET, its session and the Last-Event-ID it had,
    and gets the events it missed, the call's answer among them. rmcp
    replays by event id alone (and without a session on its stateless
    path): the door and the log give a session its own events only."""
    d = slow_daemon
    agent = d.cli("agent", "create", "a", "--role", "slowuser")
    other = d.cli("agent", "create", "b", "--role", "slowuser")
    _, session = initialize(agent)
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    assert post(agent, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)[0] == 202
    call = {"jsonrpc": "2.0", "id": 42, "method": "tools/call",
            "params": {"name": "notify_slow", "arguments": {"seconds": 2}}}
    # The call's stream: read up to the priming event's id, then cut.
    cut = UnixHTTP(agent["socket"])
    cut.request("POST", "/mcp", json.dumps(call), {"Content-Type": "application/json", "Accept": ACCEPT, **headers})
    response = cut.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    seen = b""
    while not (found := re.search(rb"id: ?([0-9a-f]{32})\r?\n", seen)):
        line = response.fp.readline()
        assert line, f"the stream ended before its first event id: {seen!r}"
        seen += line
    assert b'"result"' not in seen, "cut before the answer"
    last_event_id = found.group(1).decode()
    cut.sock.shutdown(socket.SHUT_RDWR)
    cut.close()
    # Back with GET + Last-Event-ID: the answer, sent after the cut.
    status, body = get(agent, {**headers, "Last-Event-ID": last_event_id})
    assert status == 200, body
    events = [e for e in sse_events(body) if e.get("data")]
    assert len(events) == 1, events
    answer = json.loads(events[0]["data"])
    assert answer["id"] == 42 and answer["result"]["content"][0]["text"] == "slept", answer
    assert not (d.marks / "cancelled").exists(), "the cut did not cancel the call"
    # Resuming from the answer itself: nothing more, the stream ends.
    status, body = get(agent, {**headers, "Last-Event-ID": events[0]["id"]})
    assert status == 200 and not [e for e in sse_events(body) if e.get("data")], body
    # Refused: the id from another session of the same agent, a forged
    # one, no session, a revision without sessions (rmcp would replay by
    # the id alone there), and the session on another agent's socket.
    _, second = initialize(agent)
    refusals = [
        (agent, {"Mcp-Session-Id": second, "Last-Event-ID": last_event_id}, 400, b"names no event"),
        (agent, {**headers, "Last-Event-ID": "0"}, 400, b"names no event"),
        (agent, {**headers, "Last-Event-ID": "0/0"}, 400, b"names no event"),
        (agent, {**headers, "Last-Event-ID": "f" * 32}, 400, b"names no event"),
        (agent, {"Last-Event-ID": last_event_id}, 400, b"needs the Mcp-Session-Id"),
        (agent, {"Last-Event-ID": last_event_id, "MCP-Protocol-Version": "2026-07-28"}, 400, b"needs the Mcp-Session-Id"),
        (agent, {**headers, "Last-Event-ID": last_event_id, "MCP-Protocol-Version": "2026-07-28"}, 400,
         b"revisions up to 2025-11-25"),
        (other, {**headers, "Last-Event-ID": last_event_id}, 404, b"session not found"),
    ]
    for on, asked, want, why in refusals:
        status, body = get(on, {"MCP-Protocol-Version": "2025-11-25", **asked})
        assert (status, why in body, b"slept" in body) == (want, True, False), (asked, status, body)
    # The refusals are audited.
    audit = (d.state / "audit.log").read_text()
    assert audit.count("resume_refused") == 4, audit
    # The session's end takes its events: a resumption gets 404.
    conn = UnixHTTP(agent["socket"])
    conn.request("DELETE", "/mcp", headers=headers)
    assert conn.getresponse().status in (200, 202, 204)
    assert get(agent, {**headers, "Last-Event-ID": last_event_id})[0] == 404
