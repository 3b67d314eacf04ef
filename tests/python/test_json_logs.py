"""`daemon --log-format json`: one JSON object per line, every event of a
turn carrying the turn's ids (`span`: agent, agent_id, turn), tool calls
with the same ids as the audit log, and nothing an agent chose able to act
on a terminal that shows the log (bidi controls written as \\uXXXX)."""

import json
import os
import pathlib
import subprocess
import tempfile
import time

from conftest import REPO

PLAN = {"turns": [{"steps": [{"call": "check_inbox"}, {"fail": "gave up \u202e here"}]}]}


def test_one_turn_followed_through_the_json_log(substrat_bin):
    root = pathlib.Path(tempfile.mkdtemp())
    state, ws = root / "state", root / "ws"
    ws.mkdir()
    log = open(root / "daemon.log", "w")
    daemon = subprocess.Popen(
        [str(substrat_bin), "daemon", "--provider", "stand-in", "--log-format", "json", "--state-dir", str(state)],
        env={**os.environ, "SUBSTRAT_LOG": "debug,rmcp=error,hyper=info,h2=info"},
        stderr=log,
    )
    try:

        def agent(*args):
            out = subprocess.run([str(substrat_bin), "agent", *args, "--json", "--state-dir", str(state)],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        deadline = time.time() + 10
        while not (state / "control.sock").exists():
            assert time.time() < deadline, "the daemon did not start"
            time.sleep(0.05)
        instructions = f"go\n```substrat-plan\n{json.dumps(PLAN)}\n```"
        agent("spawn", "lead", "--workspace", str(ws), instructions)
        deadline = time.time() + 60
        while True:
            turns = agent("inspect", "lead")["activity"]["recent_turns"]
            if turns and turns[0]["status"] in ("done", "failed"):
                break
            assert time.time() < deadline, f"the turn did not end: {turns}"
            time.sleep(0.2)
        assert turns[0]["status"] == "failed", turns
        turn_id = turns[0]["turn_id"]
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=20) == 0
        log.close()

    raw = (root / "daemon.log").read_text()
    assert "\u202e" not in raw, "a bidi control reached the log raw"
    events = [json.loads(line) for line in raw.splitlines()]
    in_turn = [e for e in events if e.get("span", {}).get("turn") == turn_id]
    messages = [e.get("message") for e in in_turn]
    assert "turn starts" in messages and "turn failed" in messages, messages
    failed = next(e for e in in_turn if e.get("message") == "turn failed")
    assert failed["reason"] == "cli_error", failed
    assert "gave up \u202e here" in failed["error"], failed
    assert "gave up \\u202e here" in raw
    agent_id = in_turn[0]["span"]["agent_id"]
    assert all(e["span"]["agent"] == "lead" and e["span"]["agent_id"] == agent_id for e in in_turn)
    calls = [e for e in events if e.get("message") == "tool call" and e.get("turn") == turn_id]
    assert [(c["tool"], c["decision"]) for c in calls] == [("check_inbox", "Allowed")]
    assert all(c["agent_id"] == agent_id for c in calls)
    # The same ids as the audit log's lines for those calls.
    audit = [json.loads(line) for line in (state / "audit.log").read_text().splitlines()]
    assert (agent_id, "check_inbox") in {(a["agent_id"], a["tool"]) for a in audit}
