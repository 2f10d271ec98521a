"""Benchmark: grading throughput (targets: 100 tasks/s for answer tasks, 20 tasks/s for file
deliverables including the after-snapshot and the structured diff).

Oracle outputs are graded, so every criterion is evaluated to the end. Workspaces are prepared
before the clock starts (copying files is the sandbox's cost, not the grader's). Baselines
measured in the same run, because this machine is shared and noisy:
- answer tasks: loading the task directory (`load_task`), which every trial does anyway;
- deliverables: hashing every file of the workspace with sha256, the floor of any snapshot.

    .venv/bin/python benchmarks/bench_grade.py [--tasks 480]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path

ANSWER_TARGET, FILE_TARGET = 100.0, 20.0


def _hash_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            hashlib.sha256(path.read_bytes()).digest()


def _workspace(task, root: Path) -> Path:
    workspace = root / task.task_id
    shutil.copytree(task.world_dir / "files", workspace)
    solution = task.task_dir / "solution" / "files"
    if solution.is_dir():
        shutil.copytree(solution, workspace, dirs_exist_ok=True)
    return workspace


def main() -> None:
    from kwrl.graders import grade_task, needs_workspace, take_snapshot
    from kwrl.worlds.split import generate_split
    from kwrl.worlds.taskdir import load_task, task_dirs

    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=480)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kwrl-bench-") as tmp:
        split = generate_split("test", args.tasks, 1, Path(tmp) / "split")
        dirs = task_dirs(split)
        start = time.perf_counter()
        tasks = [load_task(d) for d in dirs]
        load_s = (time.perf_counter() - start) / len(tasks)
        befores = {t.world_dir: take_snapshot(t.world_dir / "files") for t in tasks}
        answers = {t.task_id: (t.task_dir / "solution" / "answer.md").read_text() for t in tasks}
        answer_tasks = [t for t in tasks if not needs_workspace(t.rubric)]
        file_tasks = [t for t in tasks if needs_workspace(t.rubric)]
        workspaces = {t.task_id: _workspace(t, Path(tmp) / "ws") for t in file_tasks}

        def grade_all(batch: list) -> float:
            start = time.perf_counter()
            for t in batch:
                workspace = workspaces.get(t.task_id, t.world_dir / "files")
                grade = grade_task(t, answers[t.task_id], befores[t.world_dir], workspace)
                assert grade.score == 1.0, (t.task_id, grade)
            return (time.perf_counter() - start) / len(batch)

        answer_s = grade_all(answer_tasks)
        file_s = grade_all(file_tasks)
        start = time.perf_counter()
        for t in file_tasks:
            _hash_tree(workspaces[t.task_id])
        hash_s = (time.perf_counter() - start) / len(file_tasks)
    print(f"answer tasks: {len(answer_tasks)} graded at {1 / answer_s:,.0f} tasks/s "
          f"(target {ANSWER_TARGET:.0f}: {1 / answer_s / ANSWER_TARGET:.1f}x); baseline "
          f"load_task {load_s * 1e3:.2f} ms/task; grade/load ratio {answer_s / load_s:.2f}")
    print(f"file deliverables: {len(file_tasks)} graded at {1 / file_s:,.1f} tasks/s "
          f"(target {FILE_TARGET:.0f}: {1 / file_s / FILE_TARGET:.1f}x); baseline sha256 of the "
          f"workspace {hash_s * 1e3:.1f} ms/task; grade/hash ratio {file_s / hash_s:.2f}")


if __name__ == "__main__":
    main()
