"""What a run stands up: its own PostgreSQL, a proxy and a daemon per
seat, each daemon's state directory on a small tmpfs of its own when
root (for the disk fault)."""

import os
import pathlib
import subprocess

from .daemons import Daemon
from .postgres import Postgres
from .proxy import Proxy

TMPFS_SIZE = "96m"
# The agents each daemon offers to run, counting those placed on it: the
# team (7) and its spawns (MAX_SPAWNS) fit in two daemons, so spawns and
# creations go to whichever has most free slots.
MAX_AGENTS = 16


class Cluster:
    def __init__(self, out, binary, policies, lease, seats=3):
        self.out = pathlib.Path(out)
        self.binary = binary
        self.postgres = Postgres(self.out / "pg")
        self.proxies = []
        self.daemons = []
        self.tmpfs = []
        self.lease = lease
        self.seats = seats
        self.policies = policies

    def up(self):
        # The team's workspace, a shared path of every daemon.
        shared = self.out / "ws"
        shared.mkdir(parents=True, exist_ok=True)
        self.postgres.init()
        self.postgres.start()
        for i in range(self.seats):
            proxy = Proxy(self.postgres.port)
            self.proxies.append(proxy)
            state = self.out / f"state{i}"
            state.mkdir(parents=True, exist_ok=True)
            if os.getuid() == 0:
                done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(state)],
                                      capture_output=True, text=True)
                if done.returncode == 0:
                    self.tmpfs.append(state)
            d = Daemon(i, self.binary, state, self.postgres.url(proxy.port), self.policies, self.lease, self.out,
                       shared=shared.resolve(), max_agents=MAX_AGENTS)
            self.daemons.append(d)
            if not d.start():
                raise RuntimeError(f"daemon {i} did not start: see {d.log_path}")

    def down(self):
        for d in self.daemons:
            try:
                d.stop()
            except OSError:
                pass
        for p in self.proxies:
            p.stop()
        try:
            self.postgres.stop("fast")
        except OSError:
            pass
        for state in self.tmpfs:
            subprocess.run(["umount", "-l", str(state)], capture_output=True)
        self.tmpfs = []
