"""One run: stand the cluster up, make the team, run the workload and the
nemesis for the given time, heal everything, let the team settle, read
the database and the turn logs, and check."""

import json
import pathlib
import random
import shutil
import threading
import time

from . import checker, faults
from .cluster import Cluster
from .history import FAIL, INFO, OK, History
from .monitor import DaemonProbe, ServeProbe
from .team import WORKERS, Team
from .workload import Client

CLIENTS = 4


class Run:
    def __init__(self, seed, seconds, out, binary, policies, lease=5, kinds=None, log=print):
        self.seed = seed
        self.seconds = seconds
        self.out = pathlib.Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lease = lease
        self.log = log
        self.rng = random.Random(seed)
        self.cluster = Cluster(self.out, binary, policies, lease)
        self.history = History(self.out / "history.jsonl")
        self.team = Team(self.out / "ws")
        self.stop = threading.Event()
        self.stop_nemesis = threading.Event()
        all_faults = [k(self.cluster, lease) for k in faults.KINDS]
        self.faults = [f for f in all_faults if kinds is None or f.kind in kinds]
        self.skipped = {}

    # -- setup -------------------------------------------------------------

    def make_team(self):
        ws = self.team.workspace
        ws.mkdir(parents=True, exist_ok=True)
        lead = self.cluster.daemons[0]
        for name, parent, d in [("lead", None, 0)] + [(f"w{i}", "lead", i % len(self.cluster.daemons)) for i in range(WORKERS)]:
            home = ws / name
            home.mkdir(exist_ok=True)
            args = ["create", name, "--role", "member", "--workspace", str(home)]
            if parent:
                args += ["--parent", parent]
            code, out, err = self.cluster.daemons[d].agent_cli(*args, timeout=20)
            if code != 0:
                raise RuntimeError(f"agent create {name} on daemon {d}: {err}")
            self.team.add(name, json.loads(out)["id"], parent, home, d)
        del lead

    # -- the nemesis -------------------------------------------------------

    def nemesis(self):
        usable = []
        for f in self.faults:
            reason = f.unavailable()
            if reason:
                self.skipped[f.kind] = reason
                self.history.append("nemesis", INFO, "skip-fault", {"fault": f.kind, "reason": reason})
                self.log(f"SKIPPED fault {f.kind}: {reason}")
            else:
                usable.append(f)
        rng = random.Random(self.rng.random())
        if not usable:
            return
        # 1-5 s between faults whatever the lease (the cadence of the
        # runs at --lease 2, before 5 s became the least a daemon takes).
        while not self.stop_nemesis.wait(rng.uniform(1.0, 5.0)):
            fault = rng.choice(usable)
            d = rng.randrange(len(self.cluster.daemons)) if fault.targets_daemon else None
            hold = fault.duration(rng)
            self.history.invoke("nemesis", "start", {"fault": fault.kind, "target": d})
            info = fault.begin(d, rng)
            self.history.append("nemesis", OK, "start", {"fault": fault.kind, "target": d, **info})
            self.stop_nemesis.wait(hold)
            self.history.invoke("nemesis", "end", {"fault": fault.kind, "target": d})
            try:
                info = fault.end(d)
                self.history.append("nemesis", OK, "end", {"fault": fault.kind, "target": d, **info})
            except Exception as e:  # noqa: BLE001 - the run must go on and say so
                self.history.append("nemesis", FAIL, "end", {"fault": fault.kind, "target": d, "error": str(e)})

    # -- the end: heal, settle, drain, read --------------------------------

    def heal(self):
        """Every fault undone: proxies pass, PostgreSQL up, daemons running
        and not paused, no filler file; every agent resumed."""
        for p in self.cluster.proxies:
            p.restore()
        if not self.cluster.postgres.wait_ready(2):
            self.cluster.postgres.start()
        for d in self.cluster.daemons:
            filler = d.state_dir / "nemesis-filler"
            if filler.exists():
                filler.unlink()
            if d.paused:
                d.resume()
            if not d.alive():
                d.start()

    def settle(self, seconds, cap=600):
        """Waits until no turn is queued or running; returns the count
        still unsettled when `seconds` passed without that count falling
        (a backlog a long run leaves is worked off while it shrinks, for
        `cap` seconds at most). An agent failed (a turn of its failed: a
        full disk, say) or suspended with turns queued is resumed on the
        way, as an operator would, at most three times each."""
        start = time.monotonic()
        deadline = start + seconds
        left = None
        best = None
        resumed = {}
        while time.monotonic() < min(deadline, start + cap):
            try:
                rows = self.cluster.postgres.query_json(
                    "SELECT count(*) AS n FROM turns WHERE status IN ('queued', 'running')")
                left = rows[0]["n"]
                stuck = self.cluster.postgres.query_json(
                    "SELECT DISTINCT a.name FROM agents a JOIN turns t ON t.agent_id = a.id "
                    "WHERE t.status = 'queued' AND a.state IN ('failed', 'suspended')")
            except RuntimeError:
                left, stuck = None, []
            if left == 0:
                return 0
            if left is not None and (best is None or left < best):
                best = left
                deadline = time.monotonic() + seconds
            for row in stuck:
                name = row["name"]
                if name in self.team.ids and resumed.get(name, 0) < 3:
                    resumed[name] = resumed.get(name, 0) + 1
                    self.resumer.resume(name)
            time.sleep(0.5)
        return left

    def drain(self):
        """Reads every inbox until it is empty (process `drain`)."""
        drainer = Client("drain", self.history, self.team, self.cluster.daemons, random.Random(0), threading.Event())
        for name in self.team.names():
            for _ in range(20):
                body = drainer.op_recv(agent=name)
                if body is not None and not body.get("messages"):
                    break
                if body is None:
                    time.sleep(0.5)

    def resume_all(self):
        self.resumer = Client("drain", self.history, self.team, self.cluster.daemons, random.Random(0), threading.Event())
        for name in self.team.names():
            self.resumer.resume(name)

    def read_state(self):
        pg = self.cluster.postgres
        state = {
            "agents": pg.query_json("SELECT id, name, parent_id, daemon_id, state FROM agents"),
            "messages": pg.query_json("SELECT seq, id, from_id, from_name, to_id, text, sync, kind, status, thread, answered FROM messages ORDER BY seq"),
            "turns": pg.query_json("SELECT seq, id, agent_id, message_id, split_part(COALESCE(prompt, ''), E'\\n', 1) AS prompt, status, attempts, daemon_id, started_at, finished_at, error FROM turns ORDER BY seq"),
            "daemons": pg.query_json("SELECT id, name FROM daemons"),
        }
        state["daemon_index"] = {d.id: d.index for d in self.cluster.daemons if d.id}
        state["team"] = self.team.snapshot()
        logs = {}
        for name, home in self.team.snapshot()["home"].items():
            path = pathlib.Path(home) / "turns.log"
            logs[name] = path.read_text() if path.exists() else ""
        state["turn_logs"] = logs
        return state

    # -- all of it ---------------------------------------------------------

    def run(self):
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self.cluster.up()
            self.make_team()
            self.history.append("setup", OK, "team", self.team.snapshot())
            threads = [threading.Thread(target=Client(f"c{i}", self.history, self.team, self.cluster.daemons,
                                                      random.Random(self.rng.random()), self.stop).run)
                       for i in range(CLIENTS)]
            threads += [threading.Thread(target=DaemonProbe(self.history, self.team, self.cluster.daemons, i, self.stop).run)
                        for i in range(len(self.cluster.daemons))]
            threads.append(threading.Thread(target=ServeProbe(self.history, self.team, self.cluster.daemons, self.stop).run))
            nemesis = threading.Thread(target=self.nemesis)
            for t in threads + [nemesis]:
                t.daemon = True
                t.start()
            time.sleep(self.seconds)
            self.stop_nemesis.set()
            nemesis.join()
            # The workload goes on a while after the last fault ended, so
            # its recovery is seen.
            time.sleep(3 + 2 * self.lease)
            self.stop.set()
            for t in threads:
                t.join(timeout=30)
            self.history.append("nemesis", OK, "heal", None)
            self.heal()
            self.resume_all()
            left = self.settle(20 + 4 * self.lease)
            self.drain()
            left = self.settle(10 + 2 * self.lease) if left else left
            self.history.append("nemesis", OK, "settled", {"unsettled_turns": left})
            state = self.read_state()
            (self.out / "state.json").write_text(json.dumps(state, indent=1))
        finally:
            self.stop.set()
            self.stop_nemesis.set()
            for d in self.cluster.daemons:
                audit = d.state_dir / "audit.log"
                if audit.exists():
                    shutil.copy(audit, self.out / f"audit{d.index}.log")
            self.cluster.down()
            self.history.close()
        result = checker.check(self.out / "history.jsonl", self.out / "state.json", lease=self.lease)
        result["seed"] = self.seed
        result["skipped_faults"] = self.skipped
        (self.out / "result.json").write_text(json.dumps(result, indent=1))
        return result
