"""Benchmark: tool-server latency and per-trial start-up (targets: a small read <= 3 ms round trip
over stdio; trial start to first tool call <= 500 ms; 64 concurrent trials with 0 errors and
nothing leaked).

Baselines are measured in the same run, because this machine is shared and noisy:
- round trip: a trivial `echo` tool on the same `kwrl mcp serve` process (the SDK's own cost),
  against reading a small text file (`bench_read`, and `filesystem_read` when the apps exist);
- trial start: a fresh `kwrl mcp serve` subprocess through the SDK's `stdio_client`, against a
  server forked from a warm `ToolHost`.
The concurrency run starts 64 `ToolClient`s on one event loop, makes a few calls in each, stops
them, and counts errors, left-over processes (children of the zygote) and open fds.

    .venv/bin/python benchmarks/bench_tools.py [--calls 300] [--trials 20] [--concurrent 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from kwrl.tools.paths import resolve

HERE = Path(__file__).resolve().parent
NOTE = "Segment revenue | 4,512\nSegment EBITDA | 1,020\n" * 10


class BenchApp:
    """The baseline tools: an echo (no work) and a small plain read (no document parse)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def echo(self, text: str) -> str:
        """Return `text` unchanged."""
        return text

    def read(self, path: str) -> str:
        """Read a small text file of the workspace."""
        return resolve(self.root, path, kind="file").read_text()


def _apps_available() -> bool:
    try:
        from kwrl.tools.apps import APPS  # noqa: F401
    except ImportError:
        return False
    return True


def _serve_command(root: Path, apps: list[str]) -> StdioServerParameters:
    """A fresh `kwrl mcp serve` process, as an MCP client configuration would start it."""
    script = Path(sys.executable).parent / "kwrl"
    launcher = [str(script)] if script.exists() else [sys.executable, "-c",
                                                      "from kwrl.cli import app; app()"]
    args = [*launcher[1:], "mcp", "serve", "--root", str(root)]
    for app in apps:
        args += ["--app", app]
    pythonpath = os.pathsep.join([str(HERE), *sys.path])
    return StdioServerParameters(command=launcher[0], args=args, env={"PYTHONPATH": pythonpath})


@asynccontextmanager
async def _stdio_session(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, read_timeout_seconds=60) as session,
    ):
        with anyio.fail_after(60):
            await session.initialize()
        yield session


def _stats(samples_s: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in samples_s)
    return statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


async def _time_calls(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def bench_round_trip(root: Path, calls: int) -> None:
    apps = ["bench=bench_tools:BenchApp"] + (["filesystem"] if _apps_available() else [])
    async with _stdio_session(_serve_command(root, apps)) as session:
        await session.list_tools()
        named = {
            "echo (baseline)": ("bench_echo", {"text": "ok"}),
            "small read": ("bench_read", {"path": "note.txt"}),
        }
        if "filesystem" in apps:
            named["filesystem_read"] = ("filesystem_read", {"path": "note.txt"})
        results: dict[str, list[float]] = {label: [] for label in named}
        for _ in range(2):  # interleaved halves, so drift hits every tool alike
            for label, (tool, args) in named.items():
                await _time_calls(lambda t=tool, a=args: session.call_tool(t, a), 20)  # warm-up
                results[label] += await _time_calls(
                    lambda t=tool, a=args: session.call_tool(t, a), calls // 2
                )
    base_median, _ = _stats(results["echo (baseline)"])
    print(f"\nround trip over stdio (kwrl mcp serve + stdio_client), {calls} calls each")
    print(f"{'tool':<18}{'median ms':>10}{'p90 ms':>9}{'x echo':>8}")
    for label, samples in results.items():
        median, p90 = _stats(samples)
        print(f"{label:<18}{median:>10.2f}{p90:>9.2f}{median / base_median:>8.2f}")
    print("target: small read <= 3 ms")


async def _first_call_fresh(root: Path, apps: list[str]) -> float:
    start = time.perf_counter()
    async with _stdio_session(_serve_command(root, apps)) as session:
        await session.call_tool("bench_echo", {"text": "ok"})
        return time.perf_counter() - start


async def _first_call_host(host: Any, root: Path, apps: dict[str, type] | None) -> float:
    from kwrl.tools.client import ToolClient

    start = time.perf_counter()
    async with ToolClient(host, root, apps) as tools:
        result = await tools.call_tool("bench_echo", {"text": "ok"})
        elapsed = time.perf_counter() - start
    assert not result.is_error, result.content
    return elapsed


async def bench_trial_start(host: Any, root: Path, trials: int, apps: dict[str, type]) -> None:
    specs = [f"{name}=bench_tools:BenchApp" if cls.__name__ == "BenchApp" else name
             for name, cls in apps.items()]
    fresh = [await _first_call_fresh(root, specs) for _ in range(max(3, trials // 4))]
    forked = [await _first_call_host(host, root, apps) for _ in range(trials)]
    fresh_median, fresh_p90 = _stats(fresh)
    host_median, host_p90 = _stats(forked)
    print(f"\ntrial start to first tool call ({len(apps)} apps: {', '.join(apps)})")
    print(f"{'path':<34}{'median ms':>10}{'p90 ms':>9}{'n':>4}")
    print(f"{'fresh kwrl mcp serve (baseline)':<34}{fresh_median:>10.1f}{fresh_p90:>9.1f}"
          f"{len(fresh):>4}")
    print(f"{'ToolHost fork + ToolClient':<34}{host_median:>10.1f}{host_p90:>9.1f}{len(forked):>4}")
    print(f"speed-up {fresh_median / host_median:.1f}x; target: host path <= 500 ms")


async def bench_host_round_trip(host: Any, root: Path, calls: int, apps: dict[str, type]) -> None:
    from kwrl.tools.client import ToolClient

    async with ToolClient(host, root, apps) as tools:
        echo, read = [], []
        for _ in range(2):
            await _time_calls(lambda: tools.call_tool("echo", {"text": "ok"}), 20)
            echo += await _time_calls(lambda: tools.call_tool("echo", {"text": "ok"}), calls // 2)
            await _time_calls(lambda: tools.call_tool("read", {"path": "note.txt"}), 20)
            read += await _time_calls(
                lambda: tools.call_tool("read", {"path": "note.txt"}), calls // 2
            )
    (echo_median, echo_p90), (read_median, read_p90) = _stats(echo), _stats(read)
    print(f"\nround trip over a forked server's socket (ToolClient), {calls} calls each")
    print(f"{'echo':<18}{echo_median:>10.2f}{echo_p90:>9.2f}{1:>8.2f}")
    ratio = read_median / echo_median
    print(f"{'small read':<18}{read_median:>10.2f}{read_p90:>9.2f}{ratio:>8.2f}")


def _zygote_children(host: Any) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += int(fields[1]) == host.zygote_pid
    return count


async def bench_concurrent(host: Any, root: Path, n: int, apps: dict[str, type]) -> None:
    from kwrl.tools.client import ToolClient

    errors: list[str] = []

    async def trial(i: int) -> None:
        try:
            async with ToolClient(host, root, apps) as tools:
                for j in range(4):  # one app: tool names are the method names
                    tool = "read" if j % 2 else "echo"
                    args = {"path": "note.txt"} if j % 2 else {"text": f"{i}-{j}"}
                    result = await tools.call_tool(tool, args)
                    if result.is_error:
                        errors.append(f"trial {i}: {tool}: {result.content}")
        except Exception as exc:
            errors.append(f"trial {i}: {type(exc).__name__}: {exc}")

    fds = len(os.listdir("/proc/self/fd"))
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(trial, i)
    wall = time.perf_counter() - start
    leaked_fds = len(os.listdir("/proc/self/fd")) - fds
    print(f"\n{n} concurrent trials (start, 4 calls, stop) on {os.cpu_count()} cores")
    print(f"errors {len(errors)}, wall {wall:.2f} s ({wall / n * 1000:.0f} ms per trial), "
          f"leaked processes {_zygote_children(host)}, leaked fds {leaked_fds}")
    for error in errors[:5]:
        print("  ", error)


async def main() -> None:
    from kwrl.tools.host import DEFAULT_PRELOAD, ToolHost

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kwrl-bench-tools-") as tmp:
        root = Path(tmp)
        (root / "note.txt").write_text(NOTE)
        await bench_round_trip(root, args.calls)
        sys.path.insert(0, str(HERE))
        import bench_tools  # the zygote unpickles app classes by module, and this one is __main__

        apps: dict[str, type] = {"bench": bench_tools.BenchApp}
        if _apps_available():
            from kwrl.tools.apps import APPS

            apps.update(APPS)
        start = time.perf_counter()
        with ToolHost(preload=(*DEFAULT_PRELOAD, "bench_tools")) as host:
            host.prepare(apps)
            print(f"\nToolHost warm-up (zygote imports + tool schemas, once per run): "
                  f"{time.perf_counter() - start:.2f} s")
            await bench_trial_start(host, root, args.trials, apps)
            await bench_host_round_trip(host, root, args.calls, {"bench": bench_tools.BenchApp})
            await bench_concurrent(host, root, args.concurrent, {"bench": bench_tools.BenchApp})


if __name__ == "__main__":
    anyio.run(main)
