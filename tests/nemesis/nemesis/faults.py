"""The nemesis's faults, one class per kind. Each `begin`s on a target
(a daemon, or the database) and `end`s, healing what it broke; both are
written to the history by the nemesis (process `nemesis`)."""

import os
import subprocess
import threading

from .proxy import BLACKHOLE, RESET


class Fault:
    kind = "?"
    targets_daemon = True

    def __init__(self, cluster, lease):
        self.cluster = cluster
        self.lease = lease

    def unavailable(self):
        """None, or why this fault cannot run here."""
        return None

    def duration(self, rng):
        return rng.uniform(0.5, 3 * self.lease)


class Kill(Fault):
    """SIGKILL a daemon; after a while start it again (same state
    directory, so the same daemon id)."""

    kind = "kill"

    def begin(self, d, rng):
        self.cluster.daemons[d].kill()
        return {}

    def end(self, d):
        ok = self.cluster.daemons[d].start()
        return {"restarted": ok}


class Pause(Fault):
    """SIGSTOP a daemon for longer than a lease, then SIGCONT. Meanwhile
    the database's lock waits are sampled (evidence: a stopped daemon's
    sessions keep their locks)."""

    kind = "pause"

    def duration(self, rng):
        return rng.uniform(1.2 * self.lease, 3 * self.lease)

    def begin(self, d, rng):
        self.cluster.daemons[d].pause()
        self._stop = threading.Event()
        self._waits = []
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return {}

    def _sample(self):
        while not self._stop.wait(0.5):
            for w in lock_waits(self.cluster.postgres):
                if w not in self._waits:
                    self._waits.append(w)

    def end(self, d):
        self._stop.set()
        self._sampler.join(timeout=10)
        self.cluster.daemons[d].resume()
        return {"lock_waits": self._waits[:10]} if self._waits else {}


def lock_waits(postgres):
    """The database's sessions waiting on a lock, with what the holders
    last ran; a list of strings (empty when none or unreadable)."""
    try:
        rows = postgres.query_json(
            "SELECT w.pid, left(w.query, 160) AS waiting, w.application_name AS app, "
            "left(h.query, 160) AS holder, h.state AS holder_state, "
            "round(extract(epoch FROM now() - w.query_start)::numeric, 2) AS waited_s "
            "FROM pg_stat_activity w JOIN pg_stat_activity h ON h.pid = ANY(pg_blocking_pids(w.pid)) "
            "WHERE w.wait_event_type = 'Lock'", timeout=5)
    except Exception as e:  # noqa: BLE001 - evidence only
        return [f"unreadable: {e}"]
    return [f"{r['waiting']!r} waits behind ({r['holder_state']}) {r['holder']!r}" for r in rows]


class Cut(Fault):
    """Cut a daemon's connections to PostgreSQL at its proxy: reset them
    (and refuse new ones) or let them hang (blackhole)."""

    kind = "cut"

    def begin(self, d, rng):
        mode = rng.choice([RESET, BLACKHOLE])
        self.cluster.proxies[d].cut(mode)
        return {"mode": mode}

    def end(self, d):
        self.cluster.proxies[d].restore()
        return {}


class PgRestart(Fault):
    """Stop PostgreSQL (fast or immediate: a crash), start it again."""

    kind = "pg-restart"
    targets_daemon = False

    def duration(self, rng):
        return rng.uniform(0.2, 2 * self.lease)

    def begin(self, d, rng):
        mode = rng.choice(["fast", "immediate"])
        self.cluster.postgres.stop(mode)
        return {"mode": mode}

    def end(self, d):
        self.cluster.postgres.start()
        return {}


class DiskFull(Fault):
    """Fill the tmpfs under a daemon's state directory to the last byte,
    then free it."""

    kind = "disk-full"

    def unavailable(self):
        if os.getuid() != 0:
            return "needs root to mount a tmpfs of its own under each state directory"
        if not self.cluster.tmpfs:
            return "the state directories are not on tmpfs mounts of their own"
        return None

    def _filler(self, d):
        return self.cluster.daemons[d].state_dir / "nemesis-filler"

    def begin(self, d, rng):
        path = self._filler(d)
        # dd stops at ENOSPC with an error: that is the point.
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M"], capture_output=True)
        st = os.statvfs(path.parent)
        return {"free_bytes": st.f_bavail * st.f_frsize}

    def end(self, d):
        try:
            self._filler(d).unlink()
        except FileNotFoundError:
            pass
        return {}


KINDS = [Kill, Pause, Cut, PgRestart, DiskFull]
