"""The nemesis's checker (tests/nemesis, scripts/nemesis) on histories
with planted anomalies: it must find each, and pass a clean one."""

import copy
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "nemesis"))

from nemesis import checker  # noqa: E402
from nemesis.history import History, pairs, read  # noqa: E402

A, B, L = "id-a", "id-b", "id-lead"
D0, D1 = "daemon-0", "daemon-1"


class Recorder:
    """A history built by hand: each op an invoke and its completion."""

    def __init__(self):
        self.events = []
        self.t = 0.0

    def op(self, process, f, value, kind="ok", result=None, daemon=0, dt=0.1):
        self.t += dt
        inv = {"i": len(self.events), "t": self.t, "process": process, "type": "invoke", "f": f, "value": value}
        if daemon is not None:
            inv["daemon"] = daemon
        self.events.append(inv)
        self.t += dt
        done = {**inv, "i": len(self.events), "t": self.t, "type": kind, "value": {**(value or {}), **(result or {})}}
        self.events.append(done)
        return done


def msg(mid, frm, to, text, kind="message", status="delivered", sync=0, thread=None):
    return {"seq": 0, "id": mid, "from_id": frm, "from_name": frm, "to_id": to, "text": text, "sync": sync,
            "kind": kind, "status": status, "thread": thread, "answered": 0}


def turn(tid, agent, mid, status="done", attempts=1, start=1000, end=1300, daemon=D0):
    return {"seq": 0, "id": tid, "agent_id": agent, "message_id": mid, "prompt": "", "status": status,
            "attempts": attempts, "daemon_id": daemon, "started_at": start, "finished_at": end, "error": None}


def clean():
    """An async message read once, a sync question run once and answered,
    daemons serving one socket each, both daemons probed."""
    h = Recorder()
    ids = {"0": D0, "1": D1}
    h.op("probe0", "list", None, result={"owners": {"a": D0, "b": D1}, "daemon_ids": ids}, daemon=0)
    h.op("probe1", "list", None, result={"owners": {"a": D0, "b": D1}, "daemon_ids": ids}, daemon=1)
    h.op("c0", "send", {"from": "a", "to": "b", "tag": "a1", "sync": False}, result={"message_id": "m1"})
    h.op("c1", "recv", {"agent": "b"}, result={"messages": [{"message_id": "m1", "from": "a", "text": "TAG:a1"}]}, daemon=1)
    h.op("c0", "send", {"from": "a", "to": "b", "tag": "s2", "sync": True}, result={"message_id": "m2"})
    h.op("serve", "serve", None, result={"served": {"a": [0], "b": [1]}}, daemon=None)
    h.op("probe0", "list", None, result={"owners": {"a": D0, "b": D1}, "daemon_ids": ids}, daemon=0)
    state = {
        "agents": [{"id": A, "name": "a"}, {"id": B, "name": "b"}, {"id": L, "name": "lead"}],
        "messages": [
            msg("m1", A, B, "TAG:a1"),
            msg("m2", A, B, "TAG:s2\n```substrat-plan\n{}\n```", status="turn", sync=1),
            msg("m3", B, A, "finished", kind="reply", status="turn", thread="m2"),
        ],
        "turns": [turn("t1", B, "m2"), turn("t2", A, "m3", start=1400, end=1500)],
        "turn_logs": {"b": "start s2 5000\nend s2 5000 6000\n", "a": ""},
        "daemon_index": {D0: 0, D1: 1},
    }
    return h, state


def run(h, state):
    return checker.check_events(h.events, state, lease=2)


def kinds(result):
    return sorted({a["kind"] for a in result["anomalies"]})


def test_a_clean_history_passes():
    h, state = clean()
    result = run(h, state)
    assert result["ok"], result["anomalies"]
    assert result["stats"]["operations"]["send"] == {"ok": 2, "fail": 0, "info": 0, "open": 0}
    assert any("budgets" in n for n in result["not_checked"])


def test_a_planted_loss_is_found():
    h, state = clean()
    state["messages"] = [m for m in state["messages"] if m["id"] != "m1"]
    result = run(h, state)
    assert kinds(result) == ["loss"]
    assert "a1 (m1) acknowledged, not in the database" in result["anomalies"][0]["detail"]
    # Kept, but never returned by a read and no read's answer was lost.
    h, state = clean()
    h.events = [e for e in h.events if e["f"] != "recv"]
    result = run(h, state)
    assert kinds(result) == ["loss"]
    assert "never returned by a read (status delivered)" in result["anomalies"][0]["detail"]
    # A sync question stored but never made a turn.
    h, state = clean()
    state["turns"] = [t for t in state["turns"] if t["message_id"] != "m2"]
    result = run(h, state)
    assert "loss" in kinds(result)
    assert any("never became a turn" in a["detail"] for a in result["anomalies"])


def test_a_read_whose_answer_was_lost_is_indeterminate_not_lost():
    h, state = clean()
    for e in h.events:
        if e["f"] == "recv" and e["type"] == "ok":
            e["type"] = "info"
    result = run(h, state)
    assert result["ok"], result["anomalies"]
    assert result["stats"]["indeterminate_reads"] == 1


def test_messages_waiting_on_an_agent_that_keeps_failing_are_stalled_not_lost():
    h, state = clean()
    state["turns"] = [turn("t1", B, "m2", status="queued", start=None, end=None),
                      turn("t0", B, None, status="failed")]
    state["turns"][1]["error"] = "session  not found"
    state["messages"] = [m for m in state["messages"] if m["id"] != "m3"]
    state["agents"][1]["state"] = "failed"
    state["turn_logs"]["b"] = ""
    result = run(h, state)
    assert kinds(result) == ["stalled"], result["anomalies"]
    assert "b is failed after three resumes" in result["anomalies"][0]["detail"]
    assert "session  not found" in result["anomalies"][0]["detail"]
    state["agents"][1]["state"] = "active"
    assert kinds(run(h, state)) == ["loss", "unanswered"]


def test_a_planted_duplicate_is_found():
    h, state = clean()
    h.op("c2", "recv", {"agent": "b"}, result={"messages": [{"message_id": "m1", "from": "a", "text": "TAG:a1"}]}, daemon=1)
    result = run(h, state)
    assert kinds(result) == ["duplicate"]
    assert "returned by 2 reads" in result["anomalies"][0]["detail"]
    # Stored twice.
    h, state = clean()
    state["messages"].append(msg("m1b", A, B, "TAG:a1"))
    assert kinds(run(h, state)) == ["duplicate"]
    # Two turns for one sync question.
    h, state = clean()
    state["turns"].append(turn("t1b", B, "m2", start=7000, end=7100))
    result = run(h, state)
    assert kinds(result) == ["duplicate"]
    assert "became 2 turns" in result["anomalies"][0]["detail"]
    # Run twice with one attempt counted; twice with two is a re-run.
    h, state = clean()
    state["turn_logs"]["b"] += "start s2 8000\nend s2 8000 9000\n"
    result = run(h, state)
    assert kinds(result) == ["duplicate"]
    assert "ran 2 times, the daemons counted 1 attempts" in result["anomalies"][0]["detail"]
    state["turns"][0]["attempts"] = 2
    result = run(h, state)
    assert result["ok"], result["anomalies"]
    assert result["stats"]["turns_run_again_after_an_interruption"] == 1


def test_a_planted_double_owner_is_found():
    h, state = clean()
    h.op("serve", "serve", None, result={"served": {"a": [0, 1], "b": [1]}}, daemon=None)
    result = run(h, state)
    assert kinds(result) == ["double-owner"]
    assert "a: daemons [0, 1] both answered" in result["anomalies"][0]["detail"]


def test_a_daemon_back_from_a_fault_may_serve_what_it_lost_for_a_lease():
    h, state = clean()
    h.op("nemesis", "start", {"fault": "pause", "target": 0}, daemon=None)
    h.op("nemesis", "end", {"fault": "pause", "target": 0}, daemon=None)
    h.op("serve", "serve", None, result={"served": {"a": [0, 1], "b": [1]}}, daemon=None, dt=0.5)
    h.op("probe0", "list", None, result={"owners": {"a": D0, "b": D1}, "daemon_ids": {"0": D0, "1": D1}}, daemon=0)
    result = run(h, state)
    assert result["ok"], result["anomalies"]
    assert result["stats"]["double_serving_within_a_lease_of_a_fault"] == 1
    h.op("serve", "serve", None, result={"served": {"a": [0, 1], "b": [1]}}, daemon=None, dt=1.5)
    assert kinds(run(h, state)) == ["double-owner"]


def test_an_agent_taken_from_a_live_daemon_is_found_and_one_from_a_paused_is_not():
    ids = {"0": D0, "1": D1}
    h, state = clean()
    h.op("probe1", "list", None, result={"owners": {"a": D1, "b": D1}, "daemon_ids": ids}, daemon=1)
    result = run(h, state)
    assert kinds(result) == ["adopted-from-live"]
    assert "a moved from daemon 0 to daemon 1" in result["anomalies"][0]["detail"]
    h, state = clean()
    h.op("nemesis", "start", {"fault": "pause", "target": 0}, daemon=None)
    h.op("probe1", "list", None, result={"owners": {"a": D1, "b": D1}, "daemon_ids": ids}, daemon=1, dt=3)
    h.op("nemesis", "end", {"fault": "pause", "target": 0}, daemon=None)
    h.op("probe0", "list", None, result={"owners": {"a": D1, "b": D1}, "daemon_ids": ids}, daemon=0)
    result = run(h, state)
    assert result["ok"], result["anomalies"]
    assert result["stats"]["recovery"]["pause"]["n"] == 1


def test_an_agent_taken_right_after_the_taker_was_paused_is_found():
    """Found by seed 2: a daemon back from a pause took the agents of a
    daemon held up behind it, before beating for a lease."""
    ids = {"0": D0, "1": D1}
    h, state = clean()
    h.op("nemesis", "start", {"fault": "pause", "target": 1}, daemon=None)
    h.op("probe0", "list", None, kind="info", result={"error": "timed out"}, daemon=0, dt=2)
    h.op("nemesis", "end", {"fault": "pause", "target": 1}, daemon=None)
    h.op("probe1", "list", None, result={"owners": {"a": D1, "b": D1}, "daemon_ids": ids}, daemon=1)
    result = run(h, state)
    assert kinds(result) == ["judged-too-soon"]
    assert "a moved from daemon 0 to daemon 1" in result["anomalies"][0]["detail"]
    assert "after a pause of daemon 1 ended" in result["anomalies"][0]["detail"]


def test_an_answer_that_overlaps_the_one_before_shows_no_move():
    """A `list` asked before a move and answered after it may hold reads
    from before: it is not evidence of a move back."""
    ids = {"0": D0, "1": D1}
    h, state = clean()
    h.op("probe1", "list", None, result={"owners": {"a": D1, "b": D1}, "daemon_ids": ids}, daemon=1)
    slow = h.op("probe0", "list", None, result={"owners": {"a": D0, "b": D1}, "daemon_ids": ids}, daemon=0)
    h.events[-2]["t"] = h.events[-4]["t"] - 0.05  # asked before the answer above
    assert h.events[-2]["type"] == "invoke" and slow["type"] == "ok"
    result = run(h, state)
    assert [a["detail"][:30] for a in result["anomalies"]] == ["a moved from daemon 0 to daemo"]


def test_an_unanswered_sync_question_is_found():
    h, state = clean()
    state["messages"] = [m for m in state["messages"] if m["id"] != "m3"]
    state["turns"] = [t for t in state["turns"] if t["id"] != "t2"]
    result = run(h, state)
    assert kinds(result) == ["unanswered"]


def test_turns_of_one_agent_at_once_are_found():
    h, state = clean()
    state["turn_logs"]["b"] += "start x 5500\nend x 5500 5800\n"
    result = run(h, state)
    assert kinds(result) == ["concurrent-turns"]
    assert "b: turns s2 and x ran at once" in result["anomalies"][0]["detail"]
    # A run stopped before its end counts until its last tick.
    h, state = clean()
    log = "start s2 5000000000\nend s2 5000000000 6000000000\nstart y 4900000000\n"
    state["turn_logs"]["b"] = log + "tick y 4900000000 5050000000\n"
    assert kinds(run(h, state)) == ["concurrent-turns"]
    state["turn_logs"]["b"] = log + "tick y 4900000000 4950000000\n"
    assert run(h, state)["ok"]
    # By the database's times as well.
    h, state = clean()
    state["turns"].append(turn("t9", B, None, start=1200, end=1250, daemon=D1))
    assert kinds(run(h, state)) == ["concurrent-turns"]


def test_a_daemon_that_never_serves_again_is_found():
    h, state = clean()
    h.op("nemesis", "start", {"fault": "kill", "target": 1}, daemon=None)
    h.op("nemesis", "end", {"fault": "kill", "target": 1}, daemon=None)
    h.op("probe1", "list", None, kind="fail", result={"error": "unavailable"}, daemon=1, dt=30)
    result = run(h, state)
    assert kinds(result) == ["no-recovery"]
    h.op("probe1", "list", None, result={"owners": {}}, daemon=1, dt=1)
    result = run(h, state)
    assert kinds(result) == ["no-recovery"]
    assert "ended at t=1.8: first operation served 62.0 s later (bound 21 s)" in result["anomalies"][0]["detail"]


def test_known_kinds_are_reported_and_do_not_fail():
    h, state = clean()
    h.op("serve", "serve", None, result={"served": {"a": [0, 1], "b": [1]}}, daemon=None)
    result = checker.apply_known(run(h, state), {"double-owner": "a stale socket"})
    assert result["ok"] and len(result["known"]) == 1
    assert "KNOWN double-owner: 1" in checker.summary(result)


def test_the_history_file_round_trips_and_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "history.jsonl"
    h = History(path)
    h.invoke("c0", "send", {"tag": "a1"}, daemon=2)
    h.append("c0", "ok", "send", {"tag": "a1", "message_id": "m"}, daemon=2)
    h.invoke("c1", "recv", {"agent": "b"})
    h.close()
    with open(path, "a") as f:
        f.write('{"i": 3, "t": 1.0, "proc')
    events = read(path)
    assert [e["type"] for e in events] == ["invoke", "ok", "invoke"]
    ops = pairs(events)
    assert ops[0][1]["value"]["message_id"] == "m" and ops[1][1] is None
    assert json.loads(path.read_text().splitlines()[0])["daemon"] == 2
    assert copy.deepcopy(events) == events


def test_the_history_that_found_the_ownership_bugs_still_shows_them():
    """Seed 1 (kill, pause; 2026-11-28, before the fix): daemon 0 paused
    6.4-10.7 s; daemons 1 and 2, held up behind it, swapped agents (by
    design: neither answered for a lease) and daemon 0, back, took every
    agent at once (the bug); stale sockets answered beside the new owners
    for seconds. Kept (its probes and faults, t < 20 s) as a regression
    of the checker on a real history."""
    import gzip

    path = pathlib.Path(__file__).resolve().parents[1] / "nemesis" / "regressions" / "seed1-pause.history.jsonl.gz"
    events = [json.loads(line) for line in gzip.open(path, "rt") if line.strip()]
    state = {"agents": [], "messages": [], "turns": [], "turn_logs": {}, "daemon_index": {}}
    result = checker.check_events(events, state, lease=2)
    found = {}
    for a in result["anomalies"]:
        found.setdefault(a["kind"], []).append(a["detail"])
    assert sorted(found) == ["double-owner", "judged-too-soon"], found
    assert any(d.startswith("lead moved from daemon 1 to daemon 0") and "after a pause of daemon 0 ended at t=10.7052" in d
               for d in found["judged-too-soon"]), found["judged-too-soon"]
    assert result["stats"]["faults"] == {"pause": 2}
