"""Workspace paths: relative to the trial's root, and never anything outside it.

Every tool that takes a path calls `resolve`. It refuses absolute paths, `..` that climbs out,
and symlinks (planted by an agent through bash, or present in the files) whose target leaves the
root, because the check is made on the fully resolved path. Errors are ToolErrors with a message
an agent can act on.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from kwrl.tools.errors import ToolError


def resolve(root: Path, rel: str, *, must_exist: bool = True, kind: str = "any") -> Path:
    """The real path of workspace-relative `rel` under `root`.

    `kind` is `file`, `dir` or `any`; `must_exist=False` is for writes (the caller creates
    missing folders: they are inside the root, since the check is on the resolved path).
    """
    root = Path(root).resolve()
    text = (rel or ".").strip()
    if "\x00" in text:
        raise ToolError("paths may not contain NUL bytes")
    pure = PurePosixPath(text)
    if pure.is_absolute() or text.startswith("~"):
        raise ToolError(f"'{rel}' is absolute; use a path relative to the workspace root")
    target = (root / pure).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"'{rel}' is outside the workspace; use a path inside it")
    if must_exist and not target.exists():
        raise ToolError(f"'{rel}' does not exist; list the folder to see what is there")
    if target.exists() and kind == "file" and not target.is_file():
        raise ToolError(f"'{rel}' is a folder, not a file")
    if target.exists() and kind == "dir" and not target.is_dir():
        raise ToolError(f"'{rel}' is a file, not a folder")
    return target


def relative(root: Path, path: Path) -> str:
    """How a tool names `path` back to the agent: POSIX, relative to the root."""
    return Path(path).resolve().relative_to(Path(root).resolve()).as_posix() or "."
