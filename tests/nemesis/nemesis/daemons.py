"""The daemons under test: `substrat-sandbox daemon` with the stand-in
provider, each with its own state directory and its own proxy to the
shared PostgreSQL."""

import os
import pathlib
import signal
import socket
import subprocess
import time


class Daemon:
    def __init__(self, index, binary, state_dir, url, policies, lease, log_dir, shared=None, max_agents=None):
        self.index = index
        self.binary = binary
        self.state_dir = pathlib.Path(state_dir)
        self.url = url
        self.policies = policies
        self.lease = lease
        # Placement (docs/broker.md#placement): the slots it offers and
        # the team's workspace, shared by every daemon (one host here).
        self.placement_args = []
        if max_agents:
            self.placement_args += ["--max-agents", str(max_agents)]
        if shared:
            self.placement_args += ["--shared-path", str(shared)]
        self.log_path = pathlib.Path(log_dir) / f"daemon{index}.log"
        self.proc = None
        self.paused = False
        self.id = None

    def start(self, wait=20):
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        log.write(f"--- start at {time.time():.3f}\n")
        log.flush()
        self.proc = subprocess.Popen(
            [str(self.binary), "daemon", "--provider", "stand-in", "--backend", "native",
             "--lease", str(self.lease), "--state", self.url, "--policies", str(self.policies),
             "--state-dir", str(self.state_dir)] + self.placement_args,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env={**os.environ, "SUBSTRAT_LOG": "info,rmcp=error"},
            start_new_session=True,
        )
        log.close()
        self.paused = False
        control = self.state_dir / "control.sock"
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if control.exists():
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(str(control))
                    break
                except OSError:
                    pass
            time.sleep(0.05)
        else:
            return False
        id_file = self.state_dir / "daemon.id"
        if id_file.exists():
            self.id = id_file.read_text().strip()
        return True

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self):
        if self.paused:
            self.signal(signal.SIGCONT)
            self.paused = False
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def pause(self):
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self):
        if not self.alive():
            return
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def agent_cli(self, *args, timeout=10):
        """`substrat-sandbox agent ARGS --json` through this daemon:
        (exit code, stdout, stderr); exit code None on a timeout."""
        try:
            out = subprocess.run(
                [str(self.binary), "agent", *args, "--json", "--state-dir", str(self.state_dir)],
                capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None, "", "timed out"
        return out.returncode, out.stdout, out.stderr
