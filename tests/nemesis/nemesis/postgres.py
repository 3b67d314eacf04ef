"""A PostgreSQL server of the run's own (initdb in the run's directory,
on a free loopback port), so restarting it disturbs nobody else. As root
it runs as the `postgres` account, as anyone else as themselves."""

import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import time

BIN = pathlib.Path("/usr/lib/postgresql/15/bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "postgres" if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name

    def _as_owner(self, *args, **kw):
        cmd = [str(a) for a in args]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, **kw)

    @staticmethod
    def available():
        """None, or why this host cannot run one."""
        if not (BIN / "initdb").is_file():
            return f"{BIN}/initdb is missing (scripts/setup installs postgresql 15)"
        if os.getuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "no `postgres` account to run the server as"
        return None

    def init(self):
        self.root.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres")
        out = self._as_owner(BIN / "initdb", "-D", self.data, "-U", self.user, "--auth=trust", "-E", "UTF8")
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr}")
        # Trust on loopback: a throwaway server of this run's. fsync off:
        # the nemesis kills processes, never the machine, and the OS keeps
        # what a killed server wrote.
        (self.data / "postgresql.auto.conf").write_text(
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.root}'\nfsync = off\nmax_connections = 200\n"
        )

    def start(self):
        out = self._as_owner(BIN / "pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-w", "-t", "30", "start")
        if out.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {out.stderr}{out.stdout}")

    def stop(self, mode="fast"):
        self._as_owner(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "30", "stop")

    def url(self, port=None):
        """libpq's URL for the daemons, through `port` (a proxy) or direct."""
        return f"postgresql://{self.user}@127.0.0.1:{port or self.port}/postgres"

    def query_json(self, sql, timeout=30):
        """The rows of `sql` as a list of dicts, read directly (no proxy)."""
        wrapped = f"SELECT COALESCE(json_agg(q), '[]'::json) FROM ({sql}) q"
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "postgres", "-XAtq", "-c", wrapped],
            capture_output=True, text=True, timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql: {out.stderr.strip()}")
        import json

        return json.loads(out.stdout)

    def wait_ready(self, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            out = subprocess.run([str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True)
            if out.returncode == 0:
                return True
            time.sleep(0.2)
        return False
