"""The team the workload drives: a lead and its workers spread over the
daemons, the agents they spawn, and where each runs now."""

import json
import pathlib
import threading

WORKERS = 6


def turn_plan(tag, sleep_s=0.2):
    """A prompt whose turn logs its start, then a tick every 50 ms and its
    end (each with its start), by the host's clock,
    in the agent's workspace (turns.log), sleeping between. Only a prompt
    naming `tag` runs it: the stand-in keeps a session's newest plan for
    later prompts without one (a sync reply's turn), which then match the
    plain entry."""
    ticks = 4
    shell = (f"s=$(date +%s%N); echo start {tag} $s >> turns.log; "
             f"for i in {' '.join(str(i) for i in range(ticks))}; do sleep {sleep_s / ticks:g}; "
             f"echo tick {tag} $s $(date +%s%N) >> turns.log; done; "
             f"echo end {tag} $s $(date +%s%N) >> turns.log")
    plan = {"turns": [
        {"when": f"TAG:{tag}", "steps": [{"shell": shell}, {"reply": "finished"}]},
        {"steps": [{"reply": "noted"}]},
    ]}
    return f"TAG:{tag}\n```substrat-plan\n{json.dumps(plan)}\n```"


class Team:
    def __init__(self, workspace):
        self.workspace = pathlib.Path(workspace)
        self.lock = threading.Lock()
        self.ids = {}        # name -> agent id
        self.parent = {}     # name -> parent name
        self.home = {}       # name -> workspace directory
        self.placement = {}  # name -> daemon index that runs it (last seen)
        self.spawned = []

    def add(self, name, agent_id, parent, home, daemon):
        with self.lock:
            self.ids[name] = agent_id
            self.parent[name] = parent
            self.home[name] = str(home)
            self.placement.setdefault(name, daemon)
            if parent not in (None, "lead"):
                self.spawned.append(name)

    def names(self):
        with self.lock:
            return list(self.ids)

    def workers(self):
        with self.lock:
            return [n for n, p in self.parent.items() if p == "lead"]

    def peers(self, name):
        """Whom `name` may message: its parent, children and siblings."""
        with self.lock:
            parent = self.parent.get(name)
            out = [n for n, p in self.parent.items() if n != name and (p == parent or p == name)]
            if parent is not None:
                out.append(parent)
            return out

    def where(self, name):
        with self.lock:
            return self.placement.get(name)

    def place(self, mapping):
        with self.lock:
            self.placement.update(mapping)

    def snapshot(self):
        with self.lock:
            return {"ids": dict(self.ids), "parent": dict(self.parent), "home": dict(self.home)}
