"""The history: one JSON object per line, Jepsen style.

Every operation is an `invoke` followed by one completion of the same
process: `ok` (it happened), `fail` (it did not) or `info` (unknown: it may
have happened). Each line carries `i` (its index), `t` (seconds since the
run started, monotonic), `process`, `type`, `f` (the operation), `value`
and, when one daemon served it, `daemon` (its index).
"""

import json
import threading
import time

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
COMPLETIONS = (OK, FAIL, INFO)


class History:
    """Appends events to a file, flushed per line (a crash keeps what was
    written). Thread-safe."""

    def __init__(self, path, clock=time.monotonic):
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._clock = clock
        self._start = clock()
        self._next = 0

    def now(self):
        return self._clock() - self._start

    def append(self, process, kind, f, value=None, daemon=None):
        with self._lock:
            event = {"i": self._next, "t": round(self.now(), 4), "process": process, "type": kind, "f": f, "value": value}
            if daemon is not None:
                event["daemon"] = daemon
            self._next += 1
            self._file.write(json.dumps(event, sort_keys=True) + "\n")
            self._file.flush()
            return event

    def invoke(self, process, f, value=None, daemon=None):
        return self.append(process, INVOKE, f, value, daemon)

    def close(self):
        with self._lock:
            self._file.close()


def read(path):
    """The events of a history file, in order. A last line cut short (a
    crash while writing) is left out."""
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def pairs(events):
    """(invoke, completion) per operation, in invocation order; an invoke
    never completed (the run ended first) is paired with None."""
    open_ops = {}
    done = []
    for e in events:
        if e["type"] == INVOKE:
            open_ops[e["process"]] = len(done)
            done.append([e, None])
        elif e["type"] in COMPLETIONS:
            slot = open_ops.pop(e["process"], None)
            if slot is not None:
                done[slot][1] = e
    return [tuple(p) for p in done]
