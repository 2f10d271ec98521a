"""A generated task runs the Harbor way: `solution/solve.sh`, then `tests/test.sh`, as real bash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kwrl.worlds.split import generate_split
from kwrl.worlds.taskdir import load_task, task_dirs

TIMEOUT_S = 120


def _run(script: Path, workspace: Path, logs: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"KWRL_WORKSPACE": str(workspace), "KWRL_LOGS": str(logs),
                        "KWRL_PYTHON": sys.executable}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def test_solve_then_test_writes_a_full_reward_and_no_solve_a_lower_one(tmp_path):
    split = generate_split("test", 15, 5, tmp_path / "split", files_per_world=30)
    deliverable = next(d for d in task_dirs(split) if load_task(d).tier == 4)
    task = load_task(deliverable)
    for name, solve in (("oracle", True), ("null", False)):
        workspace = Path(shutil.copytree(task.world_dir / "files", tmp_path / name / "workspace"))
        logs = tmp_path / name / "logs"
        if solve:
            assert _run(deliverable / "solution" / "solve.sh", workspace, logs).returncode == 0
        verified = _run(deliverable / "tests" / "test.sh", workspace, logs)
        assert verified.returncode == 0, verified.stderr
        reward = json.loads((logs / "verifier" / "reward.json").read_text())
        if solve:
            assert reward["reward"] == 1.0 and reward["passed"]
        else:
            assert reward["reward"] < 1.0 and not reward["passed"]
            assert all(c["reason"] for c in reward["criteria"])
