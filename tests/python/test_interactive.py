"""`run -it` through a real pseudo-terminal, as a person at a terminal uses
it: job control inside, Ctrl-C to the foreground job only, the window size
following, TIOCSTI still denied, the shell's exit status passed on."""

import fcntl
import os
import signal
import pty
import re
import select
import shutil
import struct
import termios
import time

import pytest

from conftest import REPO


class Session:
    def __init__(self, fd: int):
        self.fd = fd
        self.seen = b""

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 10.0) -> re.Match:
        deadline = time.time() + timeout
        regex = re.compile(pattern.encode())
        while True:
            found = regex.search(self.seen)
            if found:
                self.seen = self.seen[found.end():]
                return found
            left = deadline - time.time()
            assert left > 0, f"{pattern!r} not seen; output so far: {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"{pattern!r}: the terminal closed; output: {self.seen[-2000:]!r}"
                self.seen += chunk

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@pytest.mark.parametrize("backend", ["native", "bwrap"])
def test_run_it_gives_a_shell_with_job_control(substrat_bin, tmp_path, backend):
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("test_run_it_gives_a_shell_with_job_control[bwrap]: bubblewrap is not on PATH")
    probe = REPO / "target" / "debug" / "substrat-probe"
    assert probe.is_file(), f"{probe}: build the workspace first"
    shutil.copy(probe, tmp_path / "substrat-probe")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(tmp_path)
        os.environ["TERM"] = "dumb"
        # Launched as from a script's background (SIGINT and SIGQUIT
        # ignored): the command's own terminal still interrupts its jobs.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        argv = [str(substrat_bin), "run", "-it", "--backend", backend, "--policy", "worker", "--",
                "bash", "--norc", "--noprofile", "-i"]
        os.execv(argv[0], argv)
    s = Session(fd)
    s.resize(40, 100)
    s.send("PS1='READY> '\r")
    s.expect("READY> ")
    # Job control: bash is in monitor mode (it has a controlling terminal).
    s.send("echo flags:$-:\r")
    flags = s.expect(r"flags:([a-zA-Z]*):").group(1).decode()
    assert "m" in flags, flags
    s.send("sleep 60 & jobs\r")
    s.expect(r"\[1\]\+\s+Running\s+sleep 60")
    s.send("kill %1\r")
    s.expect("READY> ")
    # The window size, and a resize reaching the shell.
    s.send("stty size\r")
    s.expect("40 100")
    s.resize(50, 120)
    time.sleep(0.8)
    s.send("stty size\r")
    s.expect("50 120")
    s.expect("READY> ")
    # Ctrl-C stops the foreground job, not the sandbox.
    s.send("sleep 30\r")
    time.sleep(0.5)
    started = time.time()
    s.send("\x03")
    s.expect("READY> ")
    assert time.time() - started < 5
    s.send("echo alive-$((6*7))\r")
    s.expect("alive-42")
    # TIOCSTI on the terminal it controls is still denied (seccomp).
    s.send("./substrat-probe tiocsti\r")
    s.expect("errno:EPERM")
    # The shell's exit status is the launcher's.
    s.send("exit 7\r")
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7, status
    os.close(fd)


def test_piped_run_gets_no_terminal_unless_asked(substrat_bin, tmp_path):
    import subprocess
    script = "[ -t 0 ] && echo in-tty; [ -t 1 ] && echo out-tty; cut -d' ' -f7 /proc/self/stat"
    run = lambda *extra: subprocess.run(
        [str(substrat_bin), "run", *extra, "--policy", "worker", "--", "sh", "-c", script],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    plain = run()
    # No terminal, and none controlling (tty_nr 0).
    assert plain.returncode == 0 and plain.stdout == "0\n", plain
    for forced in (run("--tty", "always"), run("-t")):
        assert forced.returncode == 0, forced
        lines = forced.stdout.replace("\r", "").split("\n")
        assert lines[:2] == ["in-tty", "out-tty"] and lines[2] != "0", forced


def test_a_terminal_run_takes_a_large_piped_input_and_its_end(substrat_bin, tmp_path):
    import subprocess
    lines = "".join(f"{i}\n" for i in range(1, 50001))
    out = subprocess.run(
        [str(substrat_bin), "run", "-t", "--policy", "worker", "--", "sh", "-c", "wc -l; echo got-eof"],
        cwd=tmp_path, input=lines, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tail = out.stdout.replace("\r", "").strip().split("\n")[-2:]
    assert tail == ["50000", "got-eof"], tail
