"""Subprocesses with an owner: own process group, bounded time and output, always reaped.

An agent's command may hang, print gigabytes, fork children that outlive it, or ignore SIGTERM.
None of that may reach the trial that ran it. `run_process` therefore:

- starts the command in a new session, so it and everything it forks share one process group
  that can be signalled at once (a child that calls `setsid` itself leaves the group: under
  bubblewrap the pid namespace catches it, without bubblewrap nothing does);
- applies resource limits in the child before `exec` (`preexec_fn` calling only
  `resource.setrlimit`: it imports nothing and takes no lock another thread could hold, which is
  what makes `preexec_fn` unsafe in threaded programs in general);
- reads stdout and stderr (merged) incrementally and keeps only a head and a tail of the bytes,
  so a command printing 50 MB costs `output_limit_bytes` of memory, not 50 MB;
- waits with a deadline, and on timeout (or when `watch` reports a reason) sends SIGTERM to the
  group, waits `kill_grace_s`, then SIGKILL, and reaps the leader;
- after a normal exit, kills what is left of the group (background jobs), so nothing of one call
  survives into the next.

The leader's exit is observed through a pidfd (`os.pidfd_open`, Linux 5.3+) without reaping it,
so the group is killed while its id still belongs to it; without pidfds it falls back to polling
`waitid(WNOWAIT)` every 20 ms. Every wait is bounded; every fd is closed on every path.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_POLL_S = 0.02
"""How often the leader's exit is polled when pidfds are unavailable."""
_CHUNK = 65536

Rlimits = Mapping[int, tuple[int, int]]
"""`resource.RLIMIT_*` -> (soft, hard)."""


@dataclass(frozen=True)
class ProcessResult:
    """How a command ended and what it printed."""

    exit_code: int | None
    """The exit status; None when the process was ended by a signal."""
    output: str
    """stdout and stderr interleaved, decoded as UTF-8 with errors replaced; the middle of a long
    output is cut and replaced by a marker (see `truncated_bytes`)."""
    timed_out: bool
    """The deadline passed and the process group was killed."""
    killed_by_signal: int | None
    """The signal that ended the leader, if any (ours on timeout, or e.g. SIGXCPU)."""
    duration_s: float
    """Wall-clock seconds from start to reaping."""
    truncated_bytes: int = 0
    """Bytes of output that were dropped from the middle."""
    total_bytes: int = 0
    """Bytes of output the command wrote in all."""
    stopped_by: str | None = None
    """Why the owner killed the process early: 'timeout', or the reason `watch` returned."""


class OutputCapture:
    """Keeps the first and the last bytes of a stream within a fixed budget."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ValueError("limit_bytes must be positive")
        self.head_limit = limit_bytes * 2 // 3
        self.tail_limit = limit_bytes - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        if len(self.tail) > 2 * self.tail_limit:  # trim rarely: amortized O(1) per byte
            del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def dropped(self) -> int:
        return max(0, self.total - len(self.head) - min(len(self.tail), self.tail_limit))

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""
        if not self.dropped:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        marker = f"\n[... {self.dropped:,} bytes of output cut of {self.total:,} ...]\n"
        head = bytes(self.head).decode("utf-8", errors="replace")
        return head + marker + tail.decode("utf-8", errors="replace")


def run_process(
    argv: Sequence[str],
    *,
    timeout_s: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    rlimits: Rlimits | None = None,
    output_limit_bytes: int = 100_000,
    kill_grace_s: float = 1.0,
    watch: Callable[[], str | None] | None = None,
    watch_interval_s: float = 0.5,
) -> ProcessResult:
    """Run `argv` to completion or to `timeout_s`, whichever comes first; never leaves a process.

    `watch`, if given, is called every `watch_interval_s` while the command runs; a non-empty
    return value stops the command like a timeout and is reported as `stopped_by`.
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    limits = dict(rlimits or {})
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=(lambda: _apply_rlimits(limits)) if limits else None,
    )
    capture = OutputCapture(output_limit_bytes)
    pidfd = _open_pidfd(proc.pid)
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        stopped_by = _pump(proc, fd, pidfd, capture, start + timeout_s, watch, watch_interval_s)
        if stopped_by is not None:
            _terminate_group(proc, pidfd, kill_grace_s)
        else:
            _signal_group(proc.pid, signal.SIGKILL)  # leftovers: background jobs of the command
        _drain(fd, capture, time.monotonic() + kill_grace_s)
        returncode = _reap(proc, kill_grace_s)
    finally:
        if proc.returncode is None:  # an exception above: still never leave the group running
            _signal_group(proc.pid, signal.SIGKILL)
            _reap(proc, kill_grace_s)
        if pidfd is not None:
            os.close(pidfd)
        if proc.stdout is not None:
            proc.stdout.close()
    return ProcessResult(
        exit_code=returncode if returncode is not None and returncode >= 0 else None,
        output=capture.text(),
        timed_out=stopped_by == "timeout",
        killed_by_signal=-returncode if returncode is not None and returncode < 0 else None,
        duration_s=time.monotonic() - start,
        truncated_bytes=capture.dropped,
        total_bytes=capture.total,
        stopped_by=stopped_by,
    )


def _apply_rlimits(limits: Rlimits) -> None:
    """Runs in the child between fork and exec: only system calls, no imports, no locks."""
    for which, (soft, hard) in limits.items():
        resource.setrlimit(which, (soft, hard))


def _pump(
    proc: subprocess.Popen[bytes],
    fd: int,
    pidfd: int | None,
    capture: OutputCapture,
    deadline: float,
    watch: Callable[[], str | None] | None,
    watch_interval_s: float,
) -> str | None:
    """Read output until the leader exits; the reason to stop early, or None on a normal exit."""
    next_watch = time.monotonic() + watch_interval_s if watch else float("inf")
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ, "output")
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ, "exit")
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if watch is not None and now >= next_watch:
                reason = watch()
                if reason:
                    return reason
                next_watch = now + watch_interval_s
            if _has_exited(proc.pid):
                return None
            wait = min(deadline, next_watch) - now
            if pidfd is None:
                wait = min(wait, _POLL_S)
            for key, _ in selector.select(max(0.0, wait)):
                if key.data == "output" and not _read_into(fd, capture):
                    selector.unregister(fd)  # EOF: keep waiting for the leader's exit alone


def _read_into(fd: int, capture: OutputCapture) -> bool:
    """Read what is available; False at end of file."""
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return True
    if not chunk:
        return False
    capture.add(chunk)
    return True


def _drain(fd: int, capture: OutputCapture, deadline: float) -> None:
    """Read the rest of the output until end of file or `deadline` (a writer outside the group,
    e.g. a daemon that called setsid, may hold the pipe open)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if selector.select(left) and not _read_into(fd, capture):
                return


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    """Whether the leader has exited, without reaping it (its pid keeps naming the group)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _wait_exit(pid: int, pidfd: int | None, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the leader to exit, without reaping it."""
    deadline = time.monotonic() + timeout_s
    while not _has_exited(pid):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            with selectors.DefaultSelector() as selector:
                selector.register(pidfd, selectors.EVENT_READ)
                selector.select(left)
        else:
            time.sleep(min(left, _POLL_S))
    return True


def _terminate_group(proc: subprocess.Popen[bytes], pidfd: int | None, grace_s: float) -> None:
    """SIGTERM the group, give it `grace_s` to exit, then SIGKILL whatever is left."""
    _signal_group(proc.pid, signal.SIGTERM)
    _wait_exit(proc.pid, pidfd, grace_s)
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone, or holds only processes we may not signal


def _reap(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """Collect the leader's status; None only if it survives SIGKILL for `timeout_s` (D state)."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
