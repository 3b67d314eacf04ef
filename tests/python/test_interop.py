"""Interop with the reference MCP servers (issue 41, "How it is checked"):
what an agent reads through the broker compared with what a direct client
(PyPI `mcp` 2.3, the Python SDK) reads from the same server, on the wire
(the JSON of each result, recorded below the SDK's model) and through the
SDK.

Upstreams, as the product runs them: npm server-everything as a remote
server over streamable HTTP (`web`) and over the older HTTP+SSE (`oldweb`);
npm server-filesystem (`fs`), PyPI mcp-server-time (`time`) and
mcp-server-git (`git`) as local servers, each in its own sandbox; and
tests/python/peers/content_server.py (`fixture`, streamable HTTP) for what
no reference server's definitions carry (icons, `_meta`). All installed by
scripts/setup under .cache/peers.

Differences from a direct client, documented in docs/upstreams.md ("What
passes to the agent"): tool names get the `<server>_` prefix, and fields
outside rmcp's model are not relayed; of what these servers send, that is
only each tool's `execution` (asserted exactly, below). Also checked: a
role's output limit cutting a long text, one of quotes, backslashes and
newlines and one of multi-byte characters on a character boundary at the
limit in bytes of text ("the role's `mcp.max_output_bytes` holds for what
the agent reads"), and remote servers killed and restarted while an agent's
session stays open ("When a server goes away")."""

import asyncio
import base64
import contextlib
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCResponse

from conftest import REPO
from test_broker_mcp import session_for
from test_upstreams import Daemon, free_port, peer, peers_installed, wait_listening, write_setup

EVERYTHING = "npm/node_modules/.bin/mcp-server-everything"
LIMIT = 1024
DEVNULL = open(os.devnull, "w")  # the direct servers' stderr


# --- the setup: one daemon and its upstreams for the module ----------------


class Interop:
    def __init__(self, root, daemon, servers, remotes):
        self.root, self.d, self.servers, self.remotes = root, daemon, servers, remotes
        self.agents = 0

    def agent(self, role):
        self.agents += 1
        return self.d.cli("agent", "create", f"i{self.agents}", "--role", role)

    def start_remote(self, name):
        """(Re)starts the remote server `name` on its port."""
        mode, port = self.remotes[name]["mode"], self.remotes[name]["port"]
        if mode == "fixture":
            command = [str(peer("venv/bin/python3")), str(REPO / "tests/python/peers/content_server.py"),
                       "streamable", str(port)]
            env = os.environ
        else:
            command, env = [str(peer(EVERYTHING)), mode], {**os.environ, "PORT": str(port)}
        self.remotes[name]["proc"] = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                                      stderr=subprocess.DEVNULL)
        wait_listening(port, name)

    def kill_remote(self, name):
        proc = self.remotes[name]["proc"]
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def interop(substrat_bin):
    if not peers_installed():
        pytest.skip(f"the reference MCP servers are not installed under {peer('')}: run scripts/setup")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = pathlib.Path(tempfile.mkdtemp(prefix="io", dir="/tmp"))
    policies, _ = write_setup(root, "Adds two numbers.")
    for name in ["web", "oldweb", "fixture", "fs", "time", "git"]:
        (policies / f"see-{name}.toml").write_text(
            f'version = 1\nextends = "worker"\n[tools]\nallow = ["{name}_*"]\n')
    (policies / "tight.toml").write_text(f"""version = 1
extends = "worker"
[tools]
allow = ["web_echo", "oldweb_echo", "fs_read_text_file"]
[mcp]
max_output_bytes = "{LIMIT}B"
""")
    (policies / "recover.toml").write_text(
        'version = 1\nextends = "worker"\n[tools]\nallow = ["web_echo", "oldweb_echo"]\n')
    remotes = {
        "web": {"mode": "streamableHttp", "port": free_port(), "path": "mcp", "transport": "streamable_http"},
        "oldweb": {"mode": "sse", "port": free_port(), "path": "sse", "transport": "sse"},
        "fixture": {"mode": "fixture", "port": free_port(), "path": "mcp", "transport": "streamable_http"},
    }
    files, repo = root / "files", root / "repo"
    # mcp-server-time names its local timezone in its arguments'
    # descriptions: `UTC` in the sandbox (no /etc/timezone there),
    # `Etc/UTC` outside on this host. Set alike for both clients.
    servers = {
        **{name: {"url": f"http://127.0.0.1:{r['port']}/{r['path']}", "transport": r["transport"]}
           for name, r in remotes.items()},
        "fs": {"command": str(peer("npm/node_modules/.bin/mcp-server-filesystem")), "args": [str(files)],
               "policy": "upstream-peers", "workspace": str(files)},
        "time": {"command": str(peer("venv/bin/mcp-server-time")), "args": ["--local-timezone", "Etc/UTC"],
                 "policy": "upstream-peers"},
        "git": {"command": str(peer("venv/bin/mcp-server-git")), "args": ["--repository", str(repo)],
                "policy": "upstream-peers", "workspace": str(repo)},
    }
    config = root / "interop.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    write_files(files, repo)
    setup = Interop(root, None, servers, remotes)
    d = None
    try:
        for name in remotes:
            setup.start_remote(name)
        d = setup.d = Daemon(substrat_bin, root, policies, config)
        d.wait(d.all_up, "every upstream server is up", seconds=30)
        yield setup
    finally:
        if d is not None:
            d.stop()
        for r in remotes.values():
            if "proc" in r:
                r["proc"].kill()
                r["proc"].wait()
        shutil.rmtree(root, ignore_errors=True)


def write_files(files, repo):
    """What the fs and git servers read. The repository's commit comes
    before the daemon starts: a sandboxed server's `.git` is its own, a
    copy of the host's refs and index made at its first launch (below)."""
    (files / "notes.txt").write_text("notes: \"quoted\" \\ é😀\n" * 3)
    (files / "sound.wav").write_bytes(b"RIFF" + bytes(range(60)))
    (files / "dot.png").write_bytes(base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
                                                     "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="))
    (files / "data.bin").write_bytes(bytes(range(256)))
    commit(repo, "tracked.txt", "first")
    (repo / "untracked é.txt").write_text("new\n")


def commit(repo, name, message):
    (repo / name).write_text(f"{message}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", name], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True)


# --- sessions that record the JSON each answer carried ---------------------


class Recorded:
    """A ClientSession, and the `result` of every answer as it came over
    the wire (a dict, before the SDK's model reads it)."""

    def __init__(self, session, answers):
        self.session, self.answers = session, answers

    async def _raw(self, key, request):
        before = len(self.answers)
        model = await request
        # The SDK may list tools itself after a call (to check its output
        # schema): the answer asked for is the first one carrying `key`.
        raw = next(a for a in self.answers[before:] if key in a)
        return raw, model

    async def tools(self):
        raw, _ = await self._raw("tools", self.session.list_tools())
        assert "nextCursor" not in raw, "one page"
        return raw["tools"]

    async def call(self, name, arguments):
        """The raw result, and the SDK's model of it (its checks passed)."""
        return await self._raw("content", self.session.call_tool(name, arguments))


@contextlib.asynccontextmanager
async def recorded(transport):
    answers = []
    async with transport as streams:
        read, write = streams[0], streams[1]
        send, receive = anyio.create_memory_object_stream(math.inf)

        async def pump():
            async with send:
                async for message in read:
                    if isinstance(message, SessionMessage) and isinstance(message.message, JSONRPCResponse):
                        answers.append(message.message.result)
                    await send.send(message)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pump)
            async with ClientSession(receive, write) as session:
                await session.initialize()
                yield Recorded(session, answers)
            tasks.cancel_scope.cancel()


def as_agent(agent):
    return recorded(session_for(agent))


def direct(setup, name):
    """A direct client of the same server: the same remote server, or the
    same command and arguments run outside a sandbox."""
    server = setup.servers[name]
    if "url" in server:
        if server["transport"] == "sse":
            return recorded(sse_client(server["url"]))
        return recorded(streamable_http_client(server["url"]))
    params = StdioServerParameters(command=server["command"], args=server.get("args", []),
                                   cwd=server.get("workspace"))
    return recorded(stdio_client(params, errlog=DEVNULL))


def exact(value):
    """JSON text, keys sorted: true and 1 are told apart (Python's == does
    not). A number is compared as a JSON number: rmcp's model holds a
    block's `annotations.priority` as a float and writes server-everything's
    `1` as `1.0` (the same number to JSON and to both SDKs' models;
    docs/upstreams.md)."""
    def numbers(v):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [numbers(x) for x in v]
        if isinstance(v, dict):
            return {k: numbers(x) for k, x in v.items()}
        return v
    return json.dumps(numbers(value), sort_keys=True, ensure_ascii=False)


def run(body):
    return asyncio.run(asyncio.wait_for(body(), timeout=60))


# --- definitions ------------------------------------------------------------

# What these servers' definitions carry besides name, description and
# inputSchema, and which of it reaches the agent.
RELAYED = {"title", "annotations", "outputSchema", "icons", "_meta"}
NOT_RELAYED = {"execution"}  # docs/upstreams.md: "fields outside rmcp's model (e.g. a tool's `execution`)"


@pytest.mark.parametrize("name", ["web", "oldweb", "fs", "time", "git", "fixture"])
def test_every_tool_definition_arrives_as_a_direct_client_sees_it(interop, name):
    agent = interop.agent(f"see-{name}")

    async def both():
        async with as_agent(agent) as relayed, direct(interop, name) as plain:
            return await relayed.tools(), await plain.tools()

    relayed, plain = run(both)
    prefix = f"{name}_"
    assert [t["name"] for t in relayed] == [prefix + t["name"] for t in plain], "every tool, in its order"
    seen = set()
    for got, want in zip(relayed, plain):
        seen |= set(want)
        tool = want["name"]
        assert got["name"] == prefix + tool
        # Field by field, each named when it differs.
        for field in sorted((set(got) | set(want)) - {"name"}):
            if field in NOT_RELAYED:
                assert field not in got, (tool, field)
                continue
            assert exact(got.get(field, "<absent>")) == exact(want.get(field, "<absent>")), (tool, field)
    unknown = seen - {"name", "description", "inputSchema"} - RELAYED - NOT_RELAYED
    assert not unknown, f"fields this test does not know yet: {unknown}"
    # What each server's definitions carry, so the comparison above covers it.
    carried = {
        "web": {"title", "annotations", "outputSchema", "execution"},
        "oldweb": {"title", "annotations", "outputSchema", "execution"},
        "fs": {"title", "annotations", "outputSchema", "execution"},
        "time": {"annotations"},
        "git": set(),
        "fixture": {"title", "annotations", "outputSchema", "icons", "_meta"},
    }[name]
    assert carried <= seen, (name, sorted(seen))


def test_a_tool_that_requires_a_task_is_listed_without_saying_so(interop):
    """server-everything's simulate-research-query has `execution.taskSupport:
    required`. The broker declares no tasks and drops `execution` (above):
    the agent sees a plain tool, and its call fails as a direct client's
    plain call does, with the server's own words."""
    agent = interop.agent("see-web")

    async def both():
        async with as_agent(agent) as relayed, direct(interop, "web") as plain:
            tools = {t["name"]: t for t in await plain.tools()}
            assert tools["simulate-research-query"]["execution"] == {"taskSupport": "required"}
            listed = {t["name"]: t for t in await relayed.tools()}
            assert "execution" not in listed["web_simulate-research-query"]
            args = {"topic": "interop"}
            return (await relayed.call("web_simulate-research-query", args))[0], \
                (await plain.call("simulate-research-query", args))[0]

    got, want = run(both)
    assert exact(got) == exact(want) and got["isError"] is True, got
    assert "requires task augmentation" in got["content"][0]["text"], got


# --- results ----------------------------------------------------------------

TIME_OF_DAY = re.compile(r"\b\d{1,2}:\d{2}:\d{2}\b")


def untimed(value):
    """server-everything stamps its resources with the time they are read
    (also inside base64 blobs): masked, blobs compared decoded."""
    if isinstance(value, str):
        return TIME_OF_DAY.sub("T", value)
    if isinstance(value, list):
        return [untimed(v) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("blob", "data") and isinstance(v, str):
                decoded = base64.b64decode(v)
                try:
                    v = "decoded:" + decoded.decode()
                except UnicodeDecodeError:
                    pass
            out[k] = untimed(v)
        return out
    return value


def kinds(result):
    """The content kinds of a raw result (`resource` split by its contents)."""
    found = set()
    for block in result["content"]:
        kind = block["type"]
        if kind == "resource":
            kind += "/blob" if "blob" in block["resource"] else "/text"
        found.add(kind)
        if "annotations" in block:
            found.add("annotations")
        if "_meta" in block:
            found.add("_meta")
    if "structuredContent" in result:
        found.add("structuredContent")
    return found


GZIP_SOURCE = "data:text/plain;base64," + base64.b64encode("gzip me: é😀 \"quoted\"\n".encode() * 20).decode()

CALLS = {
    "web": [
        ("echo", {"message": "a \"quoted\" \\ line\né😀"}),
        ("get-sum", {"a": 2, "b": 3}),
        ("get-tiny-image", {}),
        ("get-annotated-message", {"messageType": "success", "includeImage": True}),
        ("get-annotated-message", {"messageType": "error"}),
        ("get-resource-links", {"count": 3}),
        ("get-resource-reference", {"resourceType": "Text", "resourceId": 2}),
        ("get-resource-reference", {"resourceType": "Blob", "resourceId": 1}),
        ("get-structured-content", {"location": "Chicago"}),
        ("gzip-file-as-resource", {"name": "a.gz", "data": GZIP_SOURCE, "outputType": "resource"}),
        ("gzip-file-as-resource", {"name": "b.gz", "data": GZIP_SOURCE, "outputType": "resourceLink"}),
    ],
    "fixture": [("kinds", {"image_bytes": 3000}), ("dressed", {"city": "Zürich \"quoted\""})],
}
CALLS["oldweb"] = CALLS["web"]
# server-filesystem's media reads give audio and images from a reference server.
CALLS["fs"] = [("read_text_file", {"path": "FILES/notes.txt"}), ("read_media_file", {"path": "FILES/sound.wav"}),
               ("read_media_file", {"path": "FILES/dot.png"}), ("read_media_file", {"path": "FILES/data.bin"}),
               ("list_directory", {"path": "FILES"})]
CALLS["git"] = [("git_status", {"repo_path": "REPO"}), ("git_log", {"repo_path": "REPO", "max_count": 1})]
CALLS["time"] = [("convert_time", {"source_timezone": "Europe/Zurich", "time": "12:00",
                                   "target_timezone": "Asia/Tokyo"})]
EXPECTED_KINDS = {
    "web": {"text", "image", "annotations", "resource_link", "resource/text", "resource/blob", "structuredContent"},
    "fixture": {"text", "image", "audio", "annotations", "_meta", "resource_link", "resource/text", "resource/blob",
                "structuredContent"},
    "fs": {"text", "image", "audio", "resource/blob", "structuredContent"},
    "git": {"text"},
    "time": {"text", "structuredContent"},
}
EXPECTED_KINDS["oldweb"] = EXPECTED_KINDS["web"]


@pytest.fixture(scope="module")
def dirs(interop):
    return {"FILES": str(interop.root / "files"), "REPO": str(interop.root / "repo")}


def placed(arguments, dirs):
    """FILES and REPO at the start of an argument: the test's directories."""
    place = lambda v: re.sub(r"^(FILES|REPO)", lambda m: dirs[m.group(1)], v) if isinstance(v, str) else v
    return {k: place(v) for k, v in arguments.items()}


@pytest.mark.parametrize("name", ["web", "oldweb", "fixture", "fs", "git", "time"])
def test_every_content_kind_arrives_as_a_direct_client_sees_it(interop, dirs, name):
    agent = interop.agent(f"see-{name}")
    calls = [(tool, placed(args, dirs)) for tool, args in CALLS[name]]

    async def both():
        out = []
        async with as_agent(agent) as relayed, direct(interop, name) as plain:
            await relayed.tools(), await plain.tools()
            for tool, args in calls:
                got, model = await relayed.call(f"{name}_{tool}", args)
                want, _ = await plain.call(tool, args)
                out.append((tool, got, want, model))
        return out

    seen = set()
    for tool, got, want, model in run(both):
        assert exact(untimed(got)) == exact(untimed(want)), tool
        assert model.is_error is False, (tool, got)
        seen |= kinds(want)
    assert seen == EXPECTED_KINDS[name], sorted(seen)


def test_a_sandboxed_git_server_sees_the_repository_as_at_its_first_launch(interop, dirs):
    """Not a relay difference but the sandbox's (docs/run.md, `--git-state`:
    the workspace's `.git` inside is "made on the first launch as a copy of
    the host repository's HEAD, refs, packed refs, shallow list and index"):
    a commit made on the host after mcp-server-git started is not in its
    log; a direct client's server sees it."""
    agent = interop.agent("see-git")
    repo = pathlib.Path(dirs["REPO"])
    args = {"repo_path": str(repo), "max_count": 5}
    commit(repo, "later.txt", "later")
    try:
        async def both():
            async with as_agent(agent) as relayed, direct(interop, "git") as plain:
                return (await relayed.call("git_git_log", args))[0], (await plain.call("git_log", args))[0]

        got, want = run(both)
    finally:
        subprocess.run(["git", "-C", str(repo), "reset", "-q", "--hard", "HEAD~1"], check=True)
    logged = lambda result: re.findall(r"Message: '?(\w+)", result["content"][0]["text"])
    assert logged(want) == ["later", "first"], want
    assert logged(got) == ["first"], got


# --- a role's output limit --------------------------------------------------


def marker(removed, total):
    return f"\n[substrat: output truncated, {removed} of {total} bytes removed]"


def floor_boundary(data: bytes, room):
    at = max(0, min(room, len(data)))
    while at < len(data) and (data[at] & 0xC0) == 0x80:
        at -= 1
    return at


def cut_text(text, room):
    """crates/broker/src/output_budget.rs's cut_text, in bytes of UTF-8."""
    data = text.encode()
    total = len(data)
    if total <= room:
        return text
    longest = marker(total, total).encode()
    if len(longest) > room:
        return longest[:floor_boundary(longest, room)].decode()
    keep = floor_boundary(data, room - len(marker(total, total)))
    more = floor_boundary(data, room - len(marker(total - keep, total)))
    if more > keep and more + len(marker(total - more, total)) <= room:
        keep = more
    return data[:keep].decode() + marker(total - keep, total)


def human(size):
    if size < 1024:
        return f"{size} bytes"
    value, unit = size / 1024, "KiB"
    for nxt in ["MiB", "GiB"]:
        if value < 1024:
            break
        value, unit = value / 1024, nxt
    value = math.floor(value * 10 + 0.5) / 10
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"


def json_len(value):
    """Bytes of serde_json's compact encoding (non-ASCII as UTF-8)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


TEXTS = {
    "long": "x" * 3000,
    "escapes": "\"\\\n" * 1000,
    "multibyte": "é😀" * 500,
}


@pytest.mark.parametrize("kind", list(TEXTS))
def test_a_roles_output_limit_cuts_text_on_a_character_boundary(interop, kind):
    """At the tight role's limit (1 KiB) in bytes of the text, not of its
    JSON (the escapes text is twice as long in JSON), on a character
    boundary, with the documented marker; the same over both remote
    transports and through a sandboxed server-filesystem reading a file."""
    message = TEXTS[kind]
    path = interop.root / "files" / f"cut-{kind}.txt"
    path.write_text(message)
    agent = interop.agent("tight")

    async def calls():
        async with as_agent(agent) as relayed:
            await relayed.tools()
            return [await relayed.call(tool, args) for tool, args in [
                ("web_echo", {"message": message}), ("oldweb_echo", {"message": message}),
                ("fs_read_text_file", {"path": str(path)})]]

    (web, _), (oldweb, _), (read, read_model) = run(calls)
    echoed = f"Echo: {message}"
    for got in web, oldweb:
        assert got["content"] == [{"type": "text", "text": cut_text(echoed, LIMIT)}], got
        assert not got.get("isError") and "structuredContent" not in got, got
        cut = got["content"][0]["text"].encode()
        assert LIMIT - 4 < len(cut) <= LIMIT, len(cut)
    # read_text_file answers the text twice: a text block and
    # structuredContent {"content": text} (serialized size). The text is
    # cut leaving room for the note that replaces the structured content;
    # the tool has an output schema, so the result is an error
    # (docs/upstreams.md: "a result that so loses the structured content
    # of a tool with an output schema is marked `isError`").
    structured = json_len({"content": message})
    over = "over this role's limit of" if structured > LIMIT else "over what is left of this role's limit of"
    note = f"[substrat: structuredContent, {human(structured)}: {over} {human(LIMIT)}, left out]"
    assert read == {"content": [{"type": "text", "text": cut_text(message, LIMIT - len(note))},
                                {"type": "text", "text": note}], "isError": True}, read
    assert sum(len(b["text"].encode()) for b in read["content"]) <= LIMIT
    # The SDK takes it as the error result it is (no schema check fails).
    assert read_model.is_error is True


# --- recovery ---------------------------------------------------------------


def not_running(name):
    """The broker's error body (docs/upstreams.md, "When a server goes away")."""
    message = f"upstream server `{name}` is not running (restarting); try again later"
    return json.dumps({"error": "upstream", "message": message, "status": "error"}, separators=(",", ":"))


@pytest.mark.parametrize("name", ["web", "oldweb"])
def test_a_remote_server_restarted_mid_session_recovers(interop, name):
    """Killed (SIGKILL) while the agent's session is open: the broker notices,
    the agent's call is refused at once, and once the server is back on
    its port the same session's next call succeeds. Then restarted at once
    (the old session unknown to the new process): back as well."""
    d = interop.d
    agent = interop.agent("recover")
    tool = f"{name}_echo"

    def status():
        return d.servers()[name]

    async def session():
        timings = {}
        async with as_agent(agent) as relayed:
            async def echo(message):
                return (await relayed.call(tool, {"message": message}))[0]

            before = await echo("before")
            assert before["content"] == [{"type": "text", "text": "Echo: before"}], before
            # The same result, apart from its text, after each recovery.
            like_before = lambda text: {**before, "content": [{"type": "text", "text": text}]}
            restarts = status()["restarts"]
            interop.kill_remote(name)
            start = time.time()
            while status()["status"]["status"] == "up":
                assert time.time() - start < 10, "the broker does not notice"
                await asyncio.sleep(0.05)
            timings["down"] = time.time() - start
            start = time.time()
            refused = await echo("meanwhile")
            assert time.time() - start < 2, "refused at once, not after a timeout"
            assert refused["isError"] is True and refused["content"][0]["text"] == not_running(name), refused
            interop.start_remote(name)
            start = time.time()
            while not (status()["status"]["status"] == "up" and status()["restarts"] > restarts):
                assert time.time() - start < 15, f"not back: {status()}"
                await asyncio.sleep(0.05)
            timings["back"] = time.time() - start
            back = await echo("back")
            assert back == like_before("Echo: back"), back

            # Restarted at once: the broker's session is gone with the
            # process. A call now either succeeds or is refused at once.
            restarts = status()["restarts"]
            interop.kill_remote(name)
            interop.start_remote(name)
            start = time.time()
            early = await echo("early")
            assert time.time() - start < 5
            assert early["content"][0]["text"] in ("Echo: early", not_running(name)), early
            while not (status()["status"]["status"] == "up" and status()["restarts"] > restarts):
                assert time.time() - start < 15, f"not back after a quick restart: {status()}"
                await asyncio.sleep(0.05)
            timings["quick"] = time.time() - start
            timings["early"] = early["content"][0]["text"]
            again = await echo("again")
            assert again == like_before("Echo: again"), again
        return timings

    timings = run(session)
    print(f"{name}: {timings}")
