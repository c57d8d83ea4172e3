"""Runs of several ranks in tests: torchrun (torch.distributed.run) as users start it, on this
machine (several "hosts" are several torchruns meeting at a rendezvous on 127.0.0.1), and the
ranks' processes, to kill or stop one."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def env(**extra: str) -> dict[str, str]:
    """The environment of a rank: this checkout importable, one thread each (2-core CI)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def host_args(hosts: int, host: int, port: int, per_host: int = 1) -> list[str]:
    """torchrun's flags for one of `hosts` hosts meeting at 127.0.0.1:port."""
    return ["--nnodes", str(hosts), "--node-rank", str(host), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", str(per_host)]


def hosts(count: int, *command: str, per_host: int = 1) -> list[Launched]:
    """`count` torchruns meeting at a rendezvous on 127.0.0.1, as `count` hosts would: host 0
    first, which then holds the rendezvous (its store), as the host named by --rdzv-endpoint
    does; the rest once it listens."""
    port = free_port()
    started = [Launched(torchrun(*host_args(count, 0, port, per_host), *command))]
    deadline = time.monotonic() + 60
    while not _listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return started + [Launched(torchrun(*host_args(count, host, port, per_host), *command))
                      for host in range(1, count)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Launched:
    """A torchrun started in the background, its output read as it comes."""

    def __init__(self, command: list[str], **kwargs):
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=kwargs.pop("env", env()), **kwargs)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.out, self.err = [], []
        for name, stream, kept in (("out", self.proc.stdout, self.out),
                                   ("err", self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(name, stream, kept), daemon=True).start()

    def _read(self, name: str, stream, kept: list[str]) -> None:
        for line in stream:
            kept.append(line)
            self.lines.put((name, line))

    def wait_for(self, text: str, timeout_s: float = 120) -> str:
        """The first stdout line holding text (AssertionError if the run ends without one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                name, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            if name == "out" and text in line:
                return line
        raise AssertionError(f"no line with {text!r}; stdout:\n{''.join(self.out)}\n"
                             f"stderr:\n{''.join(self.err)}")

    def finish(self, timeout_s: float = 180) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once it ends; killed and failed past timeout_s."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"still running after {timeout_s} s: it hangs; stdout:\n"
                                 f"{''.join(self.out)}\nstderr:\n{''.join(self.err)}") from None
        time.sleep(0.2)  # the readers' last lines
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def ranks(self) -> list[int]:
        """The pids of its ranks (torchrun's child processes)."""
        return children(self.proc.pid)

    def kill_all(self) -> None:
        for pid in self.ranks():
            self.signal(pid, 9)
        self.proc.kill()

    @staticmethod
    def signal(pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
