"""Watchers that are processes of the history too: a probe per daemon
(`agent list` through it: is it serving, and where does it say each agent
runs) and a prober of every agent socket in every state directory (which
live daemons answer for an agent)."""

import json

from . import rpc
from .history import FAIL, INFO, OK


class DaemonProbe:
    def __init__(self, history, team, daemons, index, stop, period=0.3):
        self.history = history
        self.team = team
        self.daemons = daemons
        self.index = index
        self.stop = stop
        self.period = period
        self.name = f"probe{index}"

    def once(self):
        d = self.daemons[self.index]
        if not d.alive():
            return
        self.history.invoke(self.name, "list", None, daemon=self.index)
        code, out, err = d.agent_cli("list", timeout=5)
        if code != 0:
            kind = INFO if code is None else FAIL
            self.history.append(self.name, kind, "list", {"error": (err or "").strip()[-200:]}, daemon=self.index)
            return
        try:
            agents = json.loads(out)["agents"]
        except (ValueError, KeyError):
            self.history.append(self.name, FAIL, "list", {"error": "unreadable list"}, daemon=self.index)
            return
        by_id = {x.id: i for i, x in enumerate(self.daemons) if x.id}
        placement = {}
        owners = {}
        for a in agents:
            did = (a.get("daemon") or {}).get("daemon_id")
            owners[a["name"]] = did
            if did in by_id:
                placement[a["name"]] = by_id[did]
        self.team.place({k: v for k, v in placement.items() if k in self.team.ids})
        states = {a["name"]: a.get("state") for a in agents}
        ids = {str(x.index): x.id for x in self.daemons if x.id}
        self.history.append(self.name, OK, "list", {"owners": owners, "states": states, "daemon_ids": ids}, daemon=self.index)

    def run(self):
        while not self.stop.is_set():
            self.once()
            self.stop.wait(self.period)


class ServeProbe:
    """Every round, for each agent, which state directories' sockets a live
    daemon answers on. Recorded as one `serve` op per round."""

    def __init__(self, history, team, daemons, stop, period=1.0):
        self.history = history
        self.team = team
        self.daemons = daemons
        self.stop = stop
        self.period = period

    def once(self):
        ids = self.team.snapshot()["ids"]
        self.history.invoke("serve", "serve", None)
        served = {}
        for name, agent_id in ids.items():
            here = []
            for i, d in enumerate(self.daemons):
                path = d.state_dir / "agents" / agent_id / "broker.sock"
                if d.alive() and not d.paused and path.exists() and rpc.serves(path, timeout=0.5):
                    here.append(i)
            served[name] = here
        self.history.append("serve", OK, "serve", {"served": served})

    def run(self):
        while not self.stop.is_set():
            self.once()
            self.stop.wait(self.period)
