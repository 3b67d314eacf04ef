"""The checker: reads a history (history.py) and the state read at the end
(the database's agents, messages and turns, and each agent's own turn log)
and proves the guarantees docs/broker.md states for several daemons, or
names a counterexample for each it finds broken.

What it checks (each anomaly's `kind`):
- `loss`: a message acknowledged (ok) was never delivered: not in the
  database; an inbox message never returned by a read nor left queued;
  a prompt-carrying message (sync, broadcast copy, operator, spawn
  instructions) with no turn, or whose turn never settled.
- `duplicate`: a message stored twice; returned by two reads; two turns
  for one message; a turn run more often than the daemons counted its
  attempts (turn logs). A turn interrupted (its daemon killed, cut off,
  or the agent suspended) is queued again and may run again, even after
  its work ended but before its end was recorded: that is counted
  (`turns_run_again_after_an_interruption`), not an anomaly.
- `unanswered`: a sync question with neither a reply nor a no-reply.
- `stalled`: an agent still failed (or suspended) after the run resumed
  it three times at the end, with acknowledged messages waiting for it:
  not lost, but never to run without an operator.
- `concurrent-turns`: two turns of one agent running at the same time
  (by the agents' own logs, and by the database's start and end times).
- `double-owner`: two live daemons answering on one agent's socket in
  one probe round, other than during a fault or within a lease after one
  ended (a daemon back from a fault, or held up by one, releases the
  sockets of agents adopted from it at its first beat, a third of a
  lease later).
- `adopted-from-live`: an agent moved away from a daemon no fault
  touched (no fault on it, nor on the database, within a lease and a
  second before the move was seen) and that kept answering operations
  promptly (an operation asked and answered within half a lease, in each
  half of the lease before the move was seen): one held up that long
  loses its agents by design.
- `judged-too-soon`: an agent taken by a daemon less than a lease after
  a fault that stopped its own beats (kill, pause, cut, a PostgreSQL
  restart) ended: it judged the others before beating for a lease.
- `no-recovery`: a daemon that served nothing within the bound after a
  fault ended.
What it cannot see is listed in `not_checked` of the result.
"""

import json

from . import history as hist
from .history import INFO, OK
from .owners import adopted_from_live, double_owner, recovery, recovery_bound  # noqa: F401 - recovery_bound is API
from .summary import apply_known, summary  # noqa: F401 - the checker's API

NOT_CHECKED = [
    "budgets: the stand-in agents make no model requests, so the team's model budget is never exercised",
    "a read (check_inbox) whose answer was lost: the messages it took are counted `indeterminate`, not delivered or lost",
    "when a turn stopped mid-run died: it counts as running until its last logged tick (ticks are 50 ms apart), so an overlap shorter than that after a stop is not seen",
    "ownership by what a daemon does for an agent other than its socket and its turns",
]


def check(history_path, state_path, lease=2):
    events = hist.read(history_path)
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        state = None
    return check_events(events, state, lease)


def check_events(events, state, lease=2):
    ops = hist.pairs(events)
    anomalies = []
    stats = {"operations": _op_stats(ops)}
    if state is None:
        anomalies.append({"kind": "incomplete", "detail": "no state was read at the end: the run did not finish"})
        return _result(anomalies, stats)
    db = _Db(state)
    turn_states = {}
    for t in db.turns:
        turn_states[t["status"]] = turn_states.get(t["status"], 0) + 1
    stats["database"] = {"agents": len(db.name_of), "messages": len(db.messages), "turns": turn_states}
    anomalies += _async_messages(ops, db)
    anomalies += _turn_messages(ops, db)
    anomalies += _sync_answers(ops, db)
    for name, tags in db.stalled.items():
        errors = db.errors.get(name, [])
        anomalies.append({"kind": "stalled", "detail": f"{name} is {db.agent_state.get(name)} after three resumes at the end, "
                                                        f"{len(tags)} acknowledged messages waiting; its last turn errors: {errors[-3:]}",
                          "evidence": tags[:10]})
    anomalies += _concurrent_turns(db)
    owners, stats["double_serving_within_a_lease_of_a_fault"] = double_owner(ops, lease)
    anomalies += owners
    rec_anomalies, stats["recovery"], stats["faults"] = recovery(ops, lease)
    anomalies += rec_anomalies
    anomalies += adopted_from_live(ops, lease)
    stats["indeterminate_reads"] = db.indeterminate
    stats["turns_run_again_after_an_interruption"] = db.reruns
    settled = [e for e in events if e["f"] == "settled"]
    if settled and settled[-1]["value"].get("unsettled_turns"):
        anomalies.append({"kind": "unsettled", "detail": f"{settled[-1]['value']['unsettled_turns']} turns still queued or running at the end"})
    return _result(anomalies, stats)


def _result(anomalies, stats):
    return {"ok": not anomalies, "anomalies": anomalies, "stats": stats, "not_checked": NOT_CHECKED}


def _op_stats(ops):
    out = {}
    for inv, done in ops:
        if inv["process"] in ("nemesis", "setup"):
            continue
        by = out.setdefault(inv["f"], {"ok": 0, "fail": 0, "info": 0, "open": 0})
        by[done["type"] if done else "open"] += 1
    return out


def _excerpt(*events):
    return [json.dumps(e, sort_keys=True)[:600] for e in events if e]


class _Db:
    """The state read at the end, indexed."""

    def __init__(self, state):
        self.name_of = {a["id"]: a["name"] for a in state["agents"]}
        self.id_of = {a["name"]: a["id"] for a in state["agents"]}
        self.messages = state["messages"]
        self.by_id = {m["id"]: m for m in self.messages}
        self.by_tag = {}
        for m in self.messages:
            tag = _tag(m["text"])
            if tag:
                self.by_tag.setdefault(tag, []).append(m)
        self.turns = state["turns"]
        self.turns_of_message = {}
        for t in self.turns:
            if t.get("message_id"):
                self.turns_of_message.setdefault(t["message_id"], []).append(t)
        self.logs = {name: _parse_log(text) for name, text in state.get("turn_logs", {}).items()}
        self.daemon_index = state.get("daemon_index", {})
        self.indeterminate = 0
        self.reruns = 0
        self.agent_state = {a["name"]: a.get("state") for a in state["agents"]}
        self.stalled = {}
        self.errors = {}
        for t in self.turns:
            if t["status"] == "failed" and t.get("error"):
                self.errors.setdefault(self.name_of.get(t["agent_id"]), []).append(t["error"])


def _tag(text):
    if not text.startswith("TAG:"):
        return None
    return text[4:].split("\n", 1)[0].strip()


def _parse_log(text):
    """{tag: [(start_ns, end_ns or None, alive_ns)]} from `start TAG NS`,
    `tick TAG START_NS NS` and `end TAG START_NS NS` lines (each names
    its run's start). `alive_ns` is the last moment the run is known to
    have been running: its end, else its last tick, else its start. A run
    without an end was stopped before it (a suspend or kill queues the
    turn again); when it died after its last tick is not known."""
    runs = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "start" and parts[2].isdigit():
            runs.setdefault(parts[1], {}).setdefault(int(parts[2]), [None, int(parts[2])])
        elif len(parts) == 4 and parts[0] in ("tick", "end") and parts[2].isdigit() and parts[3].isdigit():
            run = runs.setdefault(parts[1], {}).setdefault(int(parts[2]), [None, int(parts[2])])
            run[1] = max(run[1], int(parts[3]))
            if parts[0] == "end":
                run[0] = int(parts[3])
    return {tag: [(start, end, alive) for start, (end, alive) in sorted(rs.items())] for tag, rs in runs.items()}


def _async_messages(ops, db):
    """Inbox messages: each acknowledged one returned by exactly one read."""
    out = []
    reads = {}       # message id -> ok reads that returned it
    lost_reads = {}  # recipient name -> unknown reads (their answer lost)
    for inv, done in ops:
        if inv["f"] != "recv" or not done:
            continue
        if done["type"] == OK:
            for m in done["value"].get("messages", []):
                reads.setdefault(m["message_id"], []).append(done)
        elif done["type"] == INFO:
            lost_reads.setdefault(inv["value"]["agent"], []).append(inv)
    for inv, done in ops:
        if inv["f"] != "send" or inv["value"].get("sync") or not done or done["type"] == "fail":
            continue
        tag = inv["value"]["tag"]
        stored = db.by_tag.get(tag, [])
        if len(stored) > 1:
            out.append({"kind": "duplicate", "detail": f"async message {tag} stored {len(stored)} times",
                        "evidence": _excerpt(inv, done) + [m["id"] for m in stored]})
        if done["type"] != OK:
            continue
        mid = done["value"].get("message_id")
        if mid not in db.by_id:
            out.append({"kind": "loss", "detail": f"async message {tag} ({mid}) acknowledged, not in the database",
                        "evidence": _excerpt(inv, done)})
            continue
        got = reads.get(mid, [])
        if len(got) > 1:
            out.append({"kind": "duplicate", "detail": f"async message {tag} ({mid}) returned by {len(got)} reads",
                        "evidence": _excerpt(inv, done, *got)})
        elif not got:
            row = db.by_id[mid]
            maybe = [r for r in lost_reads.get(inv["value"]["to"], []) if r["t"] >= inv["t"]]
            if row["status"] == "delivered" and maybe:
                db.indeterminate += 1
            else:
                out.append({"kind": "loss", "detail": f"async message {tag} ({mid}) acknowledged, never returned by a read (status {row['status']})",
                            "evidence": _excerpt(inv, done)})
    return out


def _units(ops, db):
    """(tag, recipient name, invoke, completion, message row) for every
    prompt-carrying message whose sending was ok or unknown."""
    for inv, done in ops:
        f, v = inv["f"], inv["value"] or {}
        if not done or done["type"] == "fail":
            continue
        if f == "send" and v.get("sync"):
            rcpts = [v["to"]]
        elif f == "operator":
            rcpts = [v["to"]]
        elif f == "spawn":
            rcpts = [v["name"]]
        elif f == "broadcast":
            rows = db.by_tag.get(v["tag"], [])
            rcpts = sorted({db.name_of.get(m["to_id"], m["to_id"]) for m in rows})
            if done["type"] == OK and len(rows) < done["value"].get("recipient_count", 0):
                yield v["tag"], None, inv, done, None
        else:
            continue
        for r in rcpts:
            rows = [m for m in db.by_tag.get(v["tag"], []) if db.name_of.get(m["to_id"]) == r]
            yield v["tag"], r, inv, done, rows


def _turn_messages(ops, db):
    out = []
    for tag, rcpt, inv, done, rows in _units(ops, db):
        if rcpt is None:
            out.append({"kind": "loss", "detail": f"broadcast {tag} acknowledged to {done['value'].get('recipient_count')} recipients, fewer copies stored",
                        "evidence": _excerpt(inv, done)})
            continue
        if len(rows) > 1:
            out.append({"kind": "duplicate", "detail": f"{inv['f']} {tag} to {rcpt} stored {len(rows)} times",
                        "evidence": _excerpt(inv, done) + [m["id"] for m in rows]})
        if not rows:
            if done["type"] == OK:
                out.append({"kind": "loss", "detail": f"{inv['f']} {tag} to {rcpt} acknowledged, not in the database",
                            "evidence": _excerpt(inv, done)})
            continue
        turns = [t for m in rows for t in db.turns_of_message.get(m["id"], [])]
        if len(turns) > 1:
            out.append({"kind": "duplicate", "detail": f"{inv['f']} {tag} to {rcpt} became {len(turns)} turns",
                        "evidence": _excerpt(inv, done) + [json.dumps(t)[:300] for t in turns]})
        if not turns:
            out.append({"kind": "loss", "detail": f"{inv['f']} {tag} to {rcpt} stored ({rows[0]['status']}) but never became a turn",
                        "evidence": _excerpt(inv, done)})
            continue
        if any(t["status"] in ("queued", "running") for t in turns):
            state = db.agent_state.get(rcpt)
            if state in ("failed", "suspended"):
                # Not lost: waiting for an operator's resume, which the
                # run gave three times. Why the agent keeps failing is the
                # anomaly.
                db.stalled.setdefault(rcpt, []).append(tag)
            else:
                out.append({"kind": "loss", "detail": f"{inv['f']} {tag} to {rcpt}: its turn never settled ({turns[0]['status']})",
                            "evidence": _excerpt(inv, done)})
        runs = db.logs.get(rcpt, {}).get(tag, [])
        complete = [r for r in runs if r[1] is not None]
        attempts = sum(t.get("attempts") or 0 for t in turns)
        if len(complete) > 1:
            db.reruns += 1
        if len(runs) > max(attempts, 1):
            out.append({"kind": "duplicate", "detail": f"{inv['f']} {tag} to {rcpt}: its turn ran {len(runs)} times, the daemons counted {attempts} attempts (turn log)",
                        "evidence": _excerpt(inv, done) + [f"runs (ns): {runs}", f"turns: {json.dumps(turns)[:400]}"]})
        if any(t["status"] == "done" for t in turns) and not complete:
            out.append({"kind": "loss", "detail": f"{inv['f']} {tag} to {rcpt}: recorded done, but its work never ran to its end (turn log)",
                        "evidence": _excerpt(inv, done) + [f"runs (ns): {runs}"]})
    return out


def _sync_answers(ops, db):
    out = []
    answered = {}
    for m in db.messages:
        if m["kind"] in ("reply", "no_reply") and m.get("thread"):
            answered.setdefault(m["thread"], []).append(m)
    for inv, done in ops:
        v = inv["value"] or {}
        if inv["f"] != "send" or not v.get("sync") or not done or done["type"] == "fail":
            continue
        rows = db.by_tag.get(v["tag"], [])
        for m in rows:
            answers = [a for a in answered.get(m["id"], []) if a["to_id"] == m["from_id"]]
            turns = db.turns_of_message.get(m["id"], [])
            waiting = any(t["status"] in ("queued", "running") for t in turns)
            if not answers and waiting and db.agent_state.get(v["to"]) in ("failed", "suspended"):
                continue  # counted as `stalled`
            if not answers:
                out.append({"kind": "unanswered", "detail": f"sync question {v['tag']} ({m['id']}) from {v['from']} to {v['to']}: no reply and no no-reply",
                            "evidence": _excerpt(inv, done) + [json.dumps(t)[:300] for t in turns]})
            elif len(answers) > 1:
                out.append({"kind": "duplicate", "detail": f"sync question {v['tag']} answered {len(answers)} times",
                            "evidence": _excerpt(inv, done) + [a["id"] for a in answers]})
    return out


def _overlaps(intervals):
    """Pairs of (start, end, label) that overlap, after sorting by start."""
    found = []
    intervals = sorted(intervals)
    for a, b in zip(intervals, intervals[1:]):
        if b[0] < a[1]:
            found.append((a, b))
    return found


def _concurrent_turns(db):
    out = []
    for name, runs in db.logs.items():
        spans = []
        for tag, rs in runs.items():
            for start, end, alive in rs:
                spans.append((start, alive, f"{tag}{'' if end else ' (stopped; alive until its last tick)'}"))
        for a, b in _overlaps(spans):
            out.append({"kind": "concurrent-turns", "detail": f"{name}: turns {a[2]} and {b[2]} ran at once (turn log)",
                        "evidence": [f"{a[2]}: {a[0]}..{a[1]} ns", f"{b[2]}: {b[0]}..{b[1]} ns"]})
    by_agent = {}
    for t in db.turns:
        if t.get("started_at") and t.get("finished_at"):
            by_agent.setdefault(t["agent_id"], []).append((t["started_at"], t["finished_at"], f"{t['id']} on {t.get('daemon_id')}"))
    for agent, spans in by_agent.items():
        for a, b in _overlaps(spans):
            out.append({"kind": "concurrent-turns", "detail": f"{db.name_of.get(agent, agent)}: turns {a[2]} and {b[2]} overlap in the database",
                        "evidence": [f"{a[2]}: {a[0]}..{a[1]} ms", f"{b[2]}: {b[0]}..{b[1]} ms"]})
    return out
