"""A trial's private workspace: a fresh copy of one world's files, removed when the trial ends.

Every trial of a world starts from the same `WORLD/files/` tree. The agent must be free to edit,
delete and create files without any trace reaching the shared world or a sibling trial, so the
tree is *copied* (`shutil.copytree`, which follows symlinks and writes new inodes). A hard link
would share the inode, and an in-place write by the agent would then change the world for every
later trial; reflinks would be safe but cannot be checked portably, so we do not use them.

Layout of one trial (everything under one temporary root, removed on exit, also on error):

    ROOT/workspace/   the agent's working directory (a copy of WORLD/files)
    ROOT/logs/agent/answer.md          the agent's final answer, as Harbor keeps it
    ROOT/logs/verifier/reward.json     the grade, as Harbor keeps it

The logs sit beside the workspace, not inside it, so the grader's snapshot of the workspace never
sees them and an agent cannot overwrite them by accident. Pass `logs_dir` to keep them after the
trial (they then live there instead of under ROOT).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any


class WorkspaceError(RuntimeError):
    """The workspace could not be created or removed (a sandbox failure, not the agent's)."""


class Workspace:
    """Context manager: `with Workspace(world_dir) as ws:` gives `ws.path` and `ws.logs`."""

    def __init__(
        self, world_dir: Path, logs_dir: Path | None = None, parent: Path | None = None
    ) -> None:
        self.world_files = Path(world_dir) / "files"
        self._kept_logs = Path(logs_dir) if logs_dir is not None else None
        self._parent = parent
        self.root: Path | None = None

    @property
    def path(self) -> Path:
        """The directory the agent works in."""
        return self._require_root() / "workspace"

    @property
    def logs(self) -> Path:
        """Where the trial's answer and reward are written (beside the workspace)."""
        if self._kept_logs is not None:
            return self._kept_logs
        return self._require_root() / "logs"

    def _require_root(self) -> Path:
        if self.root is None:
            raise WorkspaceError("the workspace is not open: use it as a context manager")
        return self.root

    def __enter__(self) -> Workspace:
        return self.open()

    def open(self) -> Workspace:
        """Create the temporary root and copy the world's files in; on failure, remove it."""
        if self.root is not None:
            raise WorkspaceError(f"the workspace is already open at {self.root}")
        if not self.world_files.is_dir():
            raise WorkspaceError(f"world files not found at {self.world_files}")
        self.root = Path(tempfile.mkdtemp(prefix="kwrl-trial-", dir=self._parent))
        try:
            shutil.copytree(self.world_files, self.path)
            for sub in ("agent", "verifier"):
                (self.logs / sub).mkdir(parents=True, exist_ok=True)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Remove the temporary root; idempotent. Raises WorkspaceError if anything is left."""
        root, self.root = self.root, None
        if root is None or not root.exists():
            return
        try:
            shutil.rmtree(root, onerror=_make_writable_and_retry)
        except OSError as exc:
            raise WorkspaceError(f"could not remove trial workspace {root}: {exc}") from exc


def _make_writable_and_retry(func: Any, path: str, _exc_info: Any) -> None:
    """An agent may leave read-only directories behind; grant write access and retry once."""
    parent = os.path.dirname(path)
    for target in (parent, path):
        if os.path.lexists(target) and not os.path.islink(target):
            os.chmod(target, stat.S_IRWXU)
    func(path)
