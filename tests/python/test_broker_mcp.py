"""The broker through the real Python MCP SDK (PyPI `mcp`) as the client:
SDK -> substrat-mcp-server (stdio) -> the agent's broker socket -> daemon."""

import asyncio
import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from conftest import REPO

RELAY = pathlib.Path(os.environ.get("SUBSTRAT_MCP_SERVER", REPO / "target" / "debug" / "substrat-mcp-server"))


@pytest.fixture
def daemon(substrat_bin):
    state = pathlib.Path(tempfile.mkdtemp()) / "state"
    proc = subprocess.Popen(
        [str(substrat_bin), "daemon", "--state-dir", str(state), "--policies", str(REPO / "tests" / "broker" / "policies")],
        env={**os.environ, "SUBSTRAT_LOG": "warn,rmcp=error"},
    )
    deadline = time.time() + 10
    while not (state / "control.sock").exists():
        assert time.time() < deadline, "daemon did not start"
        time.sleep(0.02)

    def agent(*args):
        out = subprocess.run([str(substrat_bin), "agent", *args, "--json", "--state-dir", str(state)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    agent.state_dir = state
    yield agent
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "clean shutdown on SIGTERM"


def session_for(agent_record):
    assert RELAY.is_file(), f"{RELAY} is not built"
    params = StdioServerParameters(
        command=str(RELAY), args=["--agent-id", agent_record["id"]], env={"SUBSTRAT_SOCKET": agent_record["socket"]}
    )
    return stdio_client(params)


async def with_session(agent_record, body):
    async with session_for(agent_record) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)


def tool_json(result):
    return json.loads(result.content[0].text)


def test_tools_prompts_and_messaging_through_the_sdk(daemon):
    lead = daemon("create", "lead", "--role", "worker")
    worker = daemon("create", "w1", "--role", "worker", "--parent", "lead")

    async def as_lead(session):
        tools = await session.list_tools()
        assert [t.name for t in tools.tools] == ["send_message", "broadcast", "check_inbox", "spawn_agent", "inspect_agent"]
        schema = {t.name: t.input_schema for t in tools.tools}
        assert schema["send_message"]["required"] == ["recipient", "text"]
        sent = await session.call_tool("send_message", {"recipient": "w1", "text": "review please", "sync": False})
        assert not sent.is_error
        body = tool_json(sent)
        assert body["status"] == "sent" and body["waiting_for_reply"] is False
        spawned = tool_json(await session.call_tool("spawn_agent", {"name": "helper", "instructions": "help w1"}))
        assert spawned["status"] == "created" and spawned["name"] == "helper"
        view = tool_json(await session.call_tool("inspect_agent", {"name": "w1"}))
        assert view["state"] == "idle" and view["recent_messages"][0]["text"] == "review please"
        bad = await session.call_tool("send_message", {"recipient": "nobody", "text": "x"})
        assert bad.is_error and tool_json(bad)["error"] == "unknown_recipient"
        with pytest.raises(MCPError) as unknown:
            await session.call_tool("no_such_tool", {})
        assert "unknown tool" in str(unknown.value)
        with pytest.raises(MCPError):
            await session.call_tool("send_message", {"recipient": 1})
        prompts = await session.list_prompts()
        names = {p.name for p in prompts.prompts}
        assert {"worker", "reviewer", "strict"} <= names
        prompt = await session.get_prompt("reviewer")
        text = prompt.messages[0].content.text
        assert "You are a reviewer" in text and text.endswith("send_message, check_inbox, inspect_agent.")
        return body["message_id"]

    message_id = asyncio.run(with_session(lead, as_lead))

    async def as_worker(session):
        inbox = tool_json(await session.call_tool("check_inbox", {}))
        assert inbox["messages"] == [{"from": "lead", "text": "review please", "message_id": message_id}]
        siblings = tool_json(await session.call_tool("broadcast", {"text": "hello team"}))
        assert siblings["recipient_count"] == 1  # helper

    asyncio.run(with_session(worker, as_worker))


def test_relay_without_a_broker_answers_with_errors(daemon):
    lead = daemon("create", "lead", "--role", "worker")
    gone = {**lead, "socket": lead["socket"] + ".missing"}

    async def attempt(session):
        return None

    with pytest.raises(Exception) as failure:
        asyncio.run(asyncio.wait_for(with_session(gone, attempt), timeout=20))
    assert "not reachable" in str(failure.value) or "broker" in repr(failure.value)


def test_script_roles_as_prompts_and_at_spawn(daemon, tmp_path):
    """A Lua role (tests/broker/roles/incident.lua) through the SDK: its
    arguments in prompts/list, resolved by prompts/get with the caller's
    team; a missing argument and a script that loops forever get clear
    errors, and the broker keeps serving. `agent spawn --arg` resolves it
    once and keeps the result."""
    lead = daemon("create", "lead", "--role", "worker")
    daemon("create", "w1", "--role", "worker", "--parent", "lead")

    async def as_lead(session):
        prompts = {p.name: p for p in (await session.list_prompts()).prompts}
        responder = prompts["responder"]
        assert responder.description == "Triages incidents with the team's help"
        assert [(a.name, a.description, a.required) for a in responder.arguments] == [
            ("service", "The service with the incident", True), ("severity", "P1, P2 or P3", False)]
        got = await session.get_prompt("responder", {"service": "db", "severity": "P1"})
        first = got.messages[0].content.text
        assert first.startswith("You respond to a P1 incident on db. Escalate to the on-call lead. Team: w1."), first
        # The script's declared tools narrow the policy's (worker's) scope.
        assert first.endswith("Tools in scope for this role: send_message, check_inbox."), first
        assert [(m.role, m.content.text) for m in got.messages[1:]] == [("assistant", "Ready to triage db.")]
        with pytest.raises(MCPError) as missing:
            await session.get_prompt("responder", {"severity": "P1"})
        assert "role `responder`: argument `service` is required" in str(missing.value)
        with pytest.raises(MCPError) as unknown:
            await session.get_prompt("responder", {"service": "db", "colour": "red"})
        assert "takes no argument `colour`" in str(unknown.value)
        started = time.time()
        with pytest.raises(MCPError) as looping:
            await session.get_prompt("looper")
        assert "role `looper` ran past its time limit of 300 ms" in str(looping.value)
        assert time.time() - started < 5
        # The broker keeps serving.
        inbox = tool_json(await session.call_tool("check_inbox", {}))
        assert inbox["messages"] == []
        static = await session.get_prompt("reviewer")
        assert "You are a reviewer" in static.messages[0].content.text

    asyncio.run(with_session(lead, as_lead))

    ws = tmp_path / "ws"
    ws.mkdir()
    spawned = daemon("spawn", "oncall", "--role", "responder", "--workspace", str(ws),
                     "--arg", "service=web", "look at the errors")
    assert spawned["name"] == "oncall"
    persona = daemon("inspect", "oncall")["persona"]
    assert persona.startswith("You respond to a P2 incident on web. Escalate to the on-call lead. Team: lead, w1"), persona
    assert persona.endswith("Opening messages:\n[assistant] Ready to triage web.")
