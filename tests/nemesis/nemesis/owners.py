"""The checker's view of ownership and recovery: which daemons answer
for an agent, who took an agent from whom and when, and how soon each
daemon served again after a fault (checker.py's docstring says what each
anomaly means)."""

import json
import statistics

from .history import OK


def recovery_bound(lease):
    """How long a daemon may take to serve again after a fault ends: a
    heartbeat period's worth of judging (one lease), adoption, and a
    reconnect to the database after its 5 s call bound, with margin."""
    return 15.0 + 3 * lease


def _excerpt(*events):
    return [json.dumps(e, sort_keys=True)[:600] for e in events if e]


def double_owner(ops, lease):
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


def adopted_from_live(ops, lease):
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


def recovery(ops, lease):
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
