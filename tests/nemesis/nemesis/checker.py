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
import statistics

from . import history as hist
from .history import INFO, OK

NOT_CHECKED = [
    "budgets: the stand-in agents make no model requests, so the team's model budget is never exercised",
    "a read (check_inbox) whose answer was lost: the messages it took are counted `indeterminate`, not delivered or lost",
    "when a turn stopped mid-run died: it counts as running until its last logged tick (ticks are 50 ms apart), so an overlap shorter than that after a stop is not seen",
    "ownership by what a daemon does for an agent other than its socket and its turns",
]


def recovery_bound(lease):
    """How long a daemon may take to serve again after a fault ends: a
    heartbeat period's worth of judging (one lease), adoption, and a
    reconnect to the database after its 5 s call bound, with margin."""
    return 15.0 + 3 * lease


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
    owners, stats["double_serving_within_a_lease_of_a_fault"] = _double_owner(ops, lease)
    anomalies += owners
    rec_anomalies, stats["recovery"], stats["faults"] = _recovery(ops, lease)
    anomalies += rec_anomalies
    anomalies += _adopted_from_live(ops, lease)
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


def _double_owner(ops, lease):
    """Two daemons answering on one agent's socket in one probe round. A
    daemon back from a fault (or held up by one elsewhere: a stopped
    daemon's locks) serves what it had until its first beat tells it
    another daemon adopted those agents (a third of a lease): a round
    during a fault or within a lease after one ended is left out, and
    counted."""
    out = []
    reported = set()
    windows = _fault_windows(ops)
    grace = 0
    for inv, done in ops:
        if inv["f"] != "serve" or not done or done["type"] != OK:
            continue
        for name, daemons in done["value"]["served"].items():
            if len(daemons) < 2:
                continue
            # Any fault: a stopped daemon's locks hold the others up too.
            recent = [w for w in windows if w[0] <= done["t"] and w[1] >= inv["t"] - lease]
            if recent:
                grace += 1
                continue
            if (name, tuple(daemons)) not in reported:
                reported.add((name, tuple(daemons)))
                out.append({"kind": "double-owner", "detail": f"{name}: daemons {daemons} both answered on its socket at t={done['t']}",
                            "evidence": _excerpt(done)})
    return out, grace


def _fault_windows(ops):
    """(start, end, target, kind) of every fault; end is inf when it never
    ended."""
    windows = []
    open_at = {}
    for inv, done in ops:
        if inv["process"] != "nemesis" or not done or inv["f"] not in ("start", "end"):
            continue
        key = (done["value"]["fault"], done["value"]["target"])
        if inv["f"] == "start":
            open_at[key] = inv["t"]
        elif key in open_at:
            windows.append((open_at.pop(key), done["t"], key[1], key[0]))
    windows += [(t, float("inf"), key[1], key[0]) for key, t in open_at.items()]
    return windows


# Faults during which a daemon's heartbeats stop (a full disk leaves its
# database connection alone).
BEAT_STOPPERS = ("kill", "pause", "cut", "pg-restart")


def _adopted_from_live(ops, lease):
    """Owner changes seen by the daemons' `list` probes, from a daemon no
    fault touched around the move."""
    out = []
    windows = _fault_windows(ops)
    index = {}
    for inv, done in ops:
        if inv["f"] == "list" and done and done["type"] == OK and "daemon_ids" in done["value"]:
            index.update({v: int(k) for k, v in done["value"]["daemon_ids"].items()})
    # An answer read the database somewhere between its invoke and its
    # completion: a move is seen only between answers that do not overlap
    # in time (one asked during a fault may hold reads made before it).
    seen = {}
    for inv, done in sorted(((i, d) for i, d in ops if i["f"] == "list" and d and d["type"] == OK), key=lambda p: p[1]["t"]):
        for name, owner in done["value"].get("owners", {}).items():
            before = seen.get(name)
            if before is not None and before[1] > inv["t"]:
                continue
            seen[name] = (owner, done["t"])
            if before is None or owner is None or before[0] is None or before[0] == owner:
                continue
            old = index.get(before[0], before[0])
            lo, hi = before[1] - lease - 1.0, done["t"]
            touched = [w for w in windows if w[0] <= hi and w[1] >= lo and w[2] in (old, None)]
            # A daemon held up (behind another's locks, say) misses its
            # beats and loses its agents by design: only one that kept
            # answering through the lease before the move is live.
            prompt = [(i["t"], d["t"]) for i, d in ops if d and d["type"] == OK and i.get("daemon") == old
                      and d["t"] - i["t"] < lease / 2]
            halves = [(hi - lease, hi - lease / 2), (hi - lease / 2, hi)]
            answering = all(any(a >= lo_h and b <= hi_h for a, b in prompt) for lo_h, hi_h in halves)
            if not touched and answering:
                out.append({"kind": "adopted-from-live",
                            "detail": f"{name} moved from daemon {old} to daemon {index.get(owner, owner)} between t={before[1]} and t={done['t']}, and no fault touched daemon {old} or the database from t={lo:.1f}",
                            "evidence": _excerpt(inv, done)})
            new = index.get(owner, owner)
            # A daemon judges the others only after a lease of beats: one
            # whose beats a fault stopped cannot take agents sooner.
            stopped = [w for w in windows if w[2] in (new, None) and w[3] in BEAT_STOPPERS
                       and w[1] > before[1] - lease and w[0] <= hi]
            if stopped:
                w = stopped[-1]
                out.append({"kind": "judged-too-soon",
                            "detail": f"{name} moved from daemon {old} to daemon {new} between t={before[1]} and t={done['t']}, "
                                      f"less than a lease ({lease} s) after a {w[3]} of daemon {new} ended at t={w[1]}",
                            "evidence": _excerpt(inv, done)})
    return out


def _recovery(ops, lease):
    """Per fault: from its end to the first ok operation through its
    daemon (every daemon for a database fault)."""
    bound = recovery_bound(lease)
    anomalies = []
    times = {}
    counts = {}
    # Operations asked after the fault ended, by when they were asked
    # (one stuck through the fault and answered after says less).
    served = sorted((inv["t"], done["t"], inv.get("daemon")) for inv, done in ops
                    if done and done["type"] == OK and inv.get("daemon") is not None)
    ends = [(done, inv) for inv, done in ops if inv["process"] == "nemesis" and inv["f"] == "end" and done]
    starts = [done for inv, done in ops if inv["process"] == "nemesis" and inv["f"] == "start" and done]
    for inv, done in ops:
        if inv["process"] == "nemesis" and inv["f"] == "start" and done:
            k = done["value"]["fault"]
            counts[k] = counts.get(k, 0) + 1
    daemons = sorted({d for _, _, d in served})
    for done, inv in ends:
        kind, target = done["value"]["fault"], done["value"]["target"]
        wanted = [target] if target is not None else daemons
        worst = 0.0
        for d in wanted:
            after = next((t_ok for t_inv, t_ok, dd in served if dd == d and t_inv >= done["t"]), None)
            nxt = next((s["t"] for s in starts if s["t"] > done["t"] and s["value"]["target"] in (d, None)), None)
            if after is None or (nxt is not None and after > nxt):
                if nxt is None:
                    anomalies.append({"kind": "no-recovery", "detail": f"daemon {d} served nothing after {kind} ended at t={round(done['t'], 3)}",
                                      "evidence": _excerpt(done)})
                worst = None
                break
            worst = max(worst, after - done["t"])
        if worst is None:
            continue
        times.setdefault(kind, []).append(worst)
        if worst > bound:
            anomalies.append({"kind": "no-recovery", "detail": f"after {kind} on {target} ended at t={round(done['t'], 3)}: first operation served {worst:.1f} s later (bound {bound:.0f} s)",
                              "evidence": _excerpt(done)})
    summary = {k: {"n": len(v), "median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3)} for k, v in times.items()}
    return anomalies, summary, counts


def apply_known(result, known):
    """Marks anomalies of the kinds in `known` ({kind: why}) as known: they
    are kept and printed, but no longer fail the run."""
    result["known"] = [a for a in result["anomalies"] if a["kind"] in known]
    result["anomalies"] = [a for a in result["anomalies"] if a["kind"] not in known]
    result["known_reasons"] = {k: known[k] for k in {a["kind"] for a in result["known"]}}
    result["ok"] = not result["anomalies"]
    return result


def _by_kind(anomalies, lines, label, per_kind=3):
    kinds = {}
    for a in anomalies:
        kinds.setdefault(a["kind"], []).append(a)
    for kind, items in kinds.items():
        lines.append(f"  {label}{kind}: {len(items)}")
        for a in items[:per_kind]:
            lines.append(f"    {a['detail']}")
            for e in a.get("evidence", [])[:3]:
                lines.append(f"        {e}")


def summary(result):
    lines = []
    s = result.get("stats", {})
    total = sum(sum(v.values()) for v in s.get("operations", {}).values())
    lines.append(f"nemesis: {total} operations; faults {s.get('faults', {})}; at the end {s.get('database', {})}")
    lines.append(f"nemesis: recovery after each fault kind (s): {s.get('recovery', {})}")
    lines.append(f"nemesis: turns run again after an interruption: {s.get('turns_run_again_after_an_interruption', 0)}, "
                 f"reads with a lost answer: {s.get('indeterminate_reads', 0)}")
    for kind, reason in (result.get("skipped_faults") or {}).items():
        lines.append(f"SKIPPED fault {kind}: {reason}")
    for item in result.get("not_checked", []):
        lines.append(f"not checked: {item}")
    if result.get("known"):
        lines.append(f"nemesis: {len(result['known'])} known anomalies (tests/nemesis/known.json)")
        _by_kind(result["known"], lines, "KNOWN ", per_kind=1)
    if result["ok"]:
        lines.append("nemesis: no anomaly")
    else:
        lines.append(f"nemesis: {len(result['anomalies'])} anomalies")
        _by_kind(result["anomalies"], lines, "")
    return "\n".join(lines)
