"""The workload's clients. Each client is a process of the history: it
picks an operation, writes its invoke, runs it against one daemon (an
agent's broker socket, or a daemon's control socket for the operator's
commands) and writes its completion: ok, fail (it did not happen) or
info (unknown)."""

import itertools
import json
import threading

from . import rpc
from .history import FAIL, INFO, OK
from .team import turn_plan

# Errors a tool answers with that mean nothing was done. `unavailable`
# is not among them: docs/broker.md says a send whose commit was cut off
# may have been kept.
DEFINITE_TOOL_ERRORS = {"unknown_recipient", "inbox_full", "message_too_large", "rate_limited",
                        "step_limit", "spawn_depth", "children_limit", "broadcast_fanout",
                        "name_taken", "invalid_name", "forbidden"}

WEIGHTS = [("send", 30), ("recv", 22), ("sync", 15), ("broadcast", 5), ("operator", 10),
           ("spawn", 3), ("suspend", 5), ("inspect", 10)]
MAX_SPAWNS = 12

_tags = itertools.count()
_tag_lock = threading.Lock()


def new_tag(prefix):
    with _tag_lock:
        return f"{prefix}{next(_tags)}"


class Client:
    def __init__(self, name, history, team, daemons, rng, stop, op_timeout=5.0):
        self.name = name
        self.history = history
        self.team = team
        self.daemons = daemons
        self.rng = rng
        self.stop = stop
        self.timeout = op_timeout

    def run(self):
        ops = [o for o, _ in WEIGHTS]
        weights = [w for _, w in WEIGHTS]
        while not self.stop.is_set():
            op = self.rng.choices(ops, weights)[0]
            getattr(self, f"op_{op}")()
            self.stop.wait(self.rng.uniform(0.05, 0.25))

    # -- through an agent's broker socket --------------------------------

    def _socket(self, name):
        d = self.team.where(name)
        agent_id = self.team.ids[name]
        return d, self.daemons[d].state_dir / "agents" / agent_id / "broker.sock"

    def _tool(self, f, agent, tool, args, value):
        """Calls `tool` as `agent`; returns the body when ok, else None."""
        d, path = self._socket(agent)
        self.history.invoke(self.name, f, value, daemon=d)
        try:
            is_error, body = rpc.call_tool(path, tool, args, timeout=self.timeout)
        except rpc.Refused as e:
            self.history.append(self.name, FAIL, f, {**value, "error": str(e)}, daemon=d)
            return None
        except rpc.Unknown as e:
            self.history.append(self.name, INFO, f, {**value, "error": str(e)}, daemon=d)
            return None
        if is_error:
            code = body.get("error") or body.get("status") or body.get("rpc_error")
            definite = code in DEFINITE_TOOL_ERRORS or "rpc_error" in body
            kind = FAIL if definite else INFO
            self.history.append(self.name, kind, f, {**value, "error": body}, daemon=d)
            return None
        self.history.append(self.name, OK, f, {**value, **_keep(body)}, daemon=d)
        return body

    def _sender_and_peer(self):
        workers = self.team.workers()
        sender = self.rng.choice(workers + ["lead"])
        peers = [p for p in self.team.peers(sender) if p not in self.team.spawned]
        return sender, self.rng.choice(peers)

    def op_send(self):
        sender, to = self._sender_and_peer()
        tag = new_tag("a")
        self._tool("send", sender, "send_message", {"recipient": to, "text": f"TAG:{tag}", "sync": False},
                   {"from": sender, "to": to, "tag": tag, "sync": False})

    def op_sync(self):
        sender, to = self._sender_and_peer()
        tag = new_tag("s")
        self._tool("send", sender, "send_message", {"recipient": to, "text": turn_plan(tag), "sync": True},
                   {"from": sender, "to": to, "tag": tag, "sync": True})

    def op_broadcast(self):
        sender = self.rng.choice(self.team.workers() + ["lead"])
        tag = new_tag("b")
        self._tool("broadcast", sender, "broadcast", {"text": turn_plan(tag)}, {"from": sender, "tag": tag})

    def op_recv(self, agent=None, process=None):
        agent = agent or self.rng.choice(self.team.names())
        return self._tool("recv", agent, "check_inbox", {}, {"agent": agent})

    def op_spawn(self):
        if len(self.team.spawned) >= MAX_SPAWNS:
            return self.op_send()
        parent = self.rng.choice(self.team.workers())
        tag = new_tag("c")
        name = f"sp-{tag}"
        body = self._tool("spawn", parent, "spawn_agent",
                          {"name": name, "instructions": turn_plan(tag), "role": "member", "workspace_subdir": name},
                          {"parent": parent, "name": name, "tag": tag})
        if body and body.get("agent_id"):
            d = self.team.where(parent)
            home = self.team.home[parent] + "/" + name
            self.team.add(name, body["agent_id"], parent, home, d)

    # -- through a daemon's control socket (the operator) ----------------

    def _cli(self, f, d, args, value):
        self.history.invoke(self.name, f, value, daemon=d)
        code, out, err = self.daemons[d].agent_cli(*args, timeout=self.timeout + 5)
        if code is None:
            self.history.append(self.name, INFO, f, {**value, "error": "timed out"}, daemon=d)
            return None
        if code != 0:
            # The CLI's errors are definite unless the database call was
            # cut off (docs/broker.md: a send whose commit was cut may be kept).
            kind = INFO if "unavailable" in err or "connection" in err.lower() else FAIL
            self.history.append(self.name, kind, f, {**value, "error": err.strip()[-300:]}, daemon=d)
            return None
        try:
            body = json.loads(out) if out.strip() else {}
        except ValueError:
            body = {"raw": out[-300:]}
        self.history.append(self.name, OK, f, {**value, **_keep(body)}, daemon=d)
        return body

    def op_operator(self):
        to = self.rng.choice(self.team.names())
        d = self.rng.randrange(len(self.daemons))
        tag = new_tag("o")
        self._cli("operator", d, ["send", to, turn_plan(tag)], {"to": to, "tag": tag})

    def op_inspect(self):
        name = self.rng.choice(self.team.names())
        d = self.rng.randrange(len(self.daemons))
        self._cli("inspect", d, ["inspect", name], {"agent": name})

    def op_suspend(self):
        name = self.rng.choice(self.team.names())
        d = self.team.where(name)
        if self._cli("suspend", d, ["suspend", name], {"agent": name}) is None:
            return
        self.stop.wait(self.rng.uniform(0.2, 1.5))
        self.resume(name)

    def resume(self, name):
        d = self.team.where(name)
        return self._cli("resume", d, ["resume", name], {"agent": name})


def _keep(body):
    """What the history keeps of an answer: ids and counts, the messages a
    read returned (their text is the tag)."""
    out = {}
    for key in ("message_id", "agent_id", "recipient_count", "undelivered", "status", "waiting_for_reply"):
        if key in body:
            out[key] = body[key]
    if "messages" in body:
        out["messages"] = [{"message_id": m.get("message_id"), "from": m.get("from"), "text": m.get("text", "")[:80]}
                           for m in body["messages"]]
    if "state" in body and "name" in body:
        out["state"] = body["state"]
    return out
