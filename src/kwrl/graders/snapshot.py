"""Workspace snapshots and their differences, by content hash.

Archipelago's grader called a file modified only when its size changed (equal-size files were
compared only for spreadsheets), so an edit that kept the byte count vanished from the diff. Here a
file is modified iff its SHA-256 changed: hashing is the whole cost of a snapshot (~3 ms for 5 MB),
which is what lets one world's before-snapshot be reused by every trial and an after-snapshot be
taken per trial.

Content is extracted lazily and cached on the snapshot: only files a criterion asks about, or
files the diff must explain, are ever parsed, and a shared before-snapshot parses each of its files
at most once. A snapshot does not keep file bytes unless asked (`keep_content=True`); a lazy read
re-checks the hash, so a file that changed on disk after the snapshot is reported as such rather
than silently graded with the wrong content.

Every regular file is recorded; a symbolic link is recorded with its target and never followed
(its content is not the workspace's); other special files (FIFOs, sockets) are skipped, since
reading one could block the grader.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kwrl.graders.diff import Change, content_changes
from kwrl.graders.extract import Extracted, ExtractionError, extract_bytes, kind_of


@dataclass(frozen=True)
class FileEntry:
    """One recorded file."""

    size: int
    sha256: str
    """Of the file's bytes; of the link target for a symlink."""
    symlink_target: str | None = None
    """Set (and not followed) when the path is a symbolic link."""


def normalize_path(path: str) -> str:
    """A workspace-relative posix path: `./out//memo.md` and `/out/memo.md` -> `out/memo.md`."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts)


class Snapshot:
    """The files under a root at one moment: path -> size and hash, with lazy, cached extraction."""

    def __init__(
        self,
        root: Path,
        files: Mapping[str, FileEntry],
        contents: Mapping[str, bytes] | None = None,
    ) -> None:
        self.root = Path(root)
        self.files: dict[str, FileEntry] = dict(files)
        self._contents = dict(contents) if contents is not None else None
        self._extracted: dict[tuple[str, str | None], Extracted] = {}

    @classmethod
    def empty(cls, root: Path) -> Snapshot:
        return cls(root, {})

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and normalize_path(path) in self.files

    def __len__(self) -> int:
        return len(self.files)

    def __repr__(self) -> str:
        return f"Snapshot({str(self.root)!r}, {len(self.files)} files)"

    def matching(self, pattern: str) -> list[str]:
        """Recorded paths equal to `pattern` or matching it as a glob (`*` also crosses `/`)."""
        pattern = normalize_path(pattern)
        if pattern in self.files:
            return [pattern]
        return [p for p in self.files if fnmatch.fnmatchcase(p, pattern)]

    def read_bytes(self, path: str) -> bytes | ExtractionError:
        """The bytes the snapshot recorded for `path`, or why they are not available."""
        path = normalize_path(path)
        entry = self.files.get(path)
        if entry is None:
            return ExtractionError(path, "no such file")
        if entry.symlink_target is not None:
            return ExtractionError(path, f"is a symbolic link to {entry.symlink_target!r}")
        if self._contents is not None:
            return self._contents[path]
        try:
            data = (self.root / path).read_bytes()
        except OSError as exc:
            return ExtractionError(path, f"cannot read: {exc.strerror or exc}")
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            return ExtractionError(path, "changed on disk after the snapshot was taken")
        return data

    def extract(self, path: str, kind: str | None = None) -> Extracted:
        """Extracted content of `path` (by suffix, or as `kind`), computed once per snapshot."""
        path = normalize_path(path)
        key = (path, None if kind == kind_of(path) else kind)
        cached = self._extracted.get(key)
        if cached is None:
            data = self.read_bytes(path)
            if isinstance(data, ExtractionError):
                cached = data
            else:
                cached = extract_bytes(data, path, key[1])
            self._extracted[key] = cached
        return cached

    def to_json(self) -> dict[str, Any]:
        return {
            path: {"size": e.size, "sha256": e.sha256, "symlink_target": e.symlink_target}
            for path, e in self.files.items()
        }


def take_snapshot(root: Path, keep_content: bool = False) -> Snapshot:
    """Record every file under `root` (size, SHA-256); keep the bytes too if `keep_content`.

    Keep the bytes when the directory will change before the snapshot's content is read (a
    workspace snapshotted before the agent runs in it); a world's pristine `files/` need not.
    Raises OSError if `root` is not a readable directory.
    """
    root = Path(root)
    files: dict[str, FileEntry] = {}
    contents: dict[str, bytes] | None = {} if keep_content else None
    for rel, entry in _walk(root, ""):
        if entry.is_symlink():
            target = os.readlink(entry.path)
            digest = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()
            files[rel] = FileEntry(len(target), digest, symlink_target=target)
            continue
        with open(entry.path, "rb") as handle:
            if contents is None:  # stream: an agent may write a file larger than memory
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
                files[rel] = FileEntry(handle.tell(), digest)
                continue
            data = handle.read()
        files[rel] = FileEntry(len(data), hashlib.sha256(data).hexdigest())
        contents[rel] = data
    return Snapshot(root, dict(sorted(files.items())), contents)


def _walk(directory: Path | str, prefix: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
    with os.scandir(directory) as entries:
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                yield rel, entry
            elif entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path, rel + "/")


@dataclass
class SnapshotDiff:
    """What changed between two snapshots; located content changes are computed on demand."""

    before: Snapshot = field(repr=False)
    after: Snapshot = field(repr=False)
    created: tuple[str, ...]
    deleted: tuple[str, ...]
    modified: tuple[str, ...]
    """Present in both with a different content hash (equal-size edits included)."""
    _changes: dict[str, tuple[Change, ...]] = field(default_factory=dict, repr=False)

    @property
    def is_empty(self) -> bool:
        return not (self.created or self.deleted or self.modified)

    def changes(self, path: str) -> tuple[Change, ...]:
        """Located changes inside a modified file (`Sheet1!B7: 10 -> 12`), extracted once."""
        path = normalize_path(path)
        if path not in self.modified:
            return ()
        if path not in self._changes:
            changes = content_changes(self.before.extract(path), self.after.extract(path))
            # A rewrite that re-serialised a document without changing what it says.
            self._changes[path] = changes or (Change("bytes only", "same content", "re-saved"),)
        return self._changes[path]

    def describe(self, paths: list[str] | None = None, detail: int = 2) -> list[str]:
        """One line per changed path (all, or just `paths`), with up to `detail` located changes."""
        lines = []
        for path in self.created:
            if paths is None or path in paths:
                lines.append(f"created {path}")
        for path in self.deleted:
            if paths is None or path in paths:
                lines.append(f"deleted {path}")
        for path in self.modified:
            if paths is None or path in paths:
                lines.append(f"modified {path}" + self._detail(path, detail))
        return lines

    def _detail(self, path: str, detail: int) -> str:
        if detail <= 0:
            return ""
        changes = self.changes(path)
        shown = "; ".join(str(c) for c in changes[:detail])
        more = f"; +{len(changes) - detail} more" if len(changes) > detail else ""
        return f" ({shown}{more})"

    def to_json(self, max_changes: int = 50) -> dict[str, Any]:
        return {
            "created": list(self.created),
            "deleted": list(self.deleted),
            "modified": [
                {"path": p, "changes": [str(c) for c in self.changes(p)[:max_changes]]}
                for p in self.modified
            ],
        }


def diff_snapshots(before: Snapshot, after: Snapshot) -> SnapshotDiff:
    """Created, deleted and modified paths (by content hash) from `before` to `after`."""
    old, new = before.files, after.files
    return SnapshotDiff(
        before=before,
        after=after,
        created=tuple(p for p in new if p not in old),
        deleted=tuple(p for p in old if p not in new),
        modified=tuple(p for p in new if p in old and old[p] != new[p]),
    )
