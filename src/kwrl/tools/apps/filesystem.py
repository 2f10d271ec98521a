"""The filesystem app: find files, see what they are, read and search the plain-text ones.

Every path an output names is workspace-relative, so a model can pass it straight to another
tool. Walks never follow a folder symlink and skip any file whose real path leaves the
workspace, so a link planted by the agent (through bash) cannot make `search` read outside it.
Office formats are not text: `read` says which app reads them, and `search` says which apps'
search tools look inside them, instead of matching on zip bytes.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path

from kwrl.tools.apps.base import App, app_hint, hit_list, matches, plural, terms
from kwrl.tools.errors import ToolError
from kwrl.tools.paths import resolve
from kwrl.tools.truncate import truncate

TEXT_SUFFIXES = {
    ".md", ".markdown", ".txt", ".csv", ".tsv", ".json", ".jsonl", ".ics", ".eml", ".mbox",
    ".log", ".yaml", ".yml", ".toml", ".xml", ".html", ".htm", ".rst", ".py", ".sh",
}  # fmt: skip
MAX_SEARCH_BYTES = 5_000_000
MAX_READ_BYTES = 20_000_000
MAX_LINE_CHARS = 500
OFFICE_SEARCH = "pdf_search, sheets_search, docs_search, slides_search"


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB" if n < 1024**2 else \
        f"{n / 1024**2:.1f} MB"


class Filesystem(App):
    """List, find, inspect, read and search the files of the workspace."""

    name = "filesystem"

    def list_files(self, path: str = ".") -> str:
        """List one folder: subfolders (ending in /) first, then files with their sizes.

        Args:
            path: folder relative to the workspace root ("." for the root).
        """
        folder = resolve(self.root, path, kind="dir")
        dirs, files = self._entries(folder)
        lines = [f"{self._rel(d)}/ ({plural(sum(1 for _ in self._walk(d)), 'file')})" for d in dirs]
        lines += [f"{self._rel(f)} | {_size(f.stat().st_size)}" for f in files]
        if not lines:
            return f"{self._rel(folder)}/ is empty"
        head = f"{self._rel(folder)}/: {plural(len(dirs), 'folder')}, {plural(len(files), 'file')}"
        return truncate("\n".join([head, *lines]), hint="list a subfolder, or use "
                        "filesystem_find with a name pattern")

    def tree(self, path: str = ".", depth: int = 3) -> str:
        """Show the folder tree under `path`, `depth` levels deep, with full relative paths.

        Args:
            path: folder relative to the workspace root.
            depth: how many levels of folders to open (1 = only `path`'s own entries).
        """
        folder = resolve(self.root, path, kind="dir")
        lines: list[str] = []
        self._tree_lines(folder, max(1, depth), 0, lines)
        if not lines:
            return f"{self._rel(folder)}/ is empty"
        return truncate("\n".join(lines), hint="use a smaller depth or a subfolder path")

    def find(self, pattern: str, path: str = ".") -> str:
        """Find files by name with a glob pattern, e.g. `*Q3*`, `*.pdf`, `Reports/*2025*`.

        Case-insensitive. A pattern without * or ? matches any name containing it. A pattern
        with / is matched against the whole relative path.

        Args:
            pattern: glob on file names (or on relative paths when it contains /).
            path: folder to search under (default: the whole workspace).
        """
        folder = resolve(self.root, path, kind="dir")
        glob = pattern.strip().lower()
        if not glob:
            raise ToolError("the pattern is empty; give a name pattern such as *Q3*")
        if not any(ch in glob for ch in "*?["):
            glob = f"*{glob}*"
        found = []
        for file in self._walk(folder):
            rel = self._rel(file)
            target = rel if "/" in glob else file.name
            if fnmatch.fnmatch(target.lower(), glob):
                found.append(f"{rel} | {_size(file.stat().st_size)}")
        if not found:
            return (f"no files match '{pattern}' under {self._rel(folder)}/; patterns are "
                    "globs on file names, e.g. *Q3*.pdf (try filesystem_tree to browse)")
        head = f"{plural(len(found), 'file')} match '{pattern}'"
        return truncate("\n".join([head, *found]), hint="use a more specific pattern")

    def search(self, query: str, path: str = ".") -> str:
        """Search the text files (md, txt, csv, json, ics, eml, mbox...) for lines with all words.

        Returns `path:line: text` for matching lines only. PDFs and office files are not
        searched here: use pdf_search, sheets_search, docs_search or slides_search on them.

        Args:
            query: words that must all appear in a line (case-insensitive).
            path: a folder or a single file, relative to the workspace root.
        """
        words = terms(query)
        start = resolve(self.root, path)
        files = [start] if start.is_file() else list(self._walk(start))
        hits = []
        for file in files:
            if file.suffix.lower() not in TEXT_SUFFIXES or file.stat().st_size > MAX_SEARCH_BYTES:
                continue
            for number, line in enumerate(_lines(file), start=1):
                if matches(words, line):
                    hits.append(f"{self._rel(file)}:{number}: {line.strip()[:MAX_LINE_CHARS]}")
        where = self._rel(start) if start.is_file() else f"the text files under {self._rel(start)}/"
        hint = f"PDFs and office files are searched by {OFFICE_SEARCH}"
        return truncate(hit_list(hits, query, where, hint), hint="narrow the query or the path")

    def info(self, path: str) -> str:
        """Describe a file or folder: type, size, modified date, and pages/sheets/slides if cheap.

        Args:
            path: file or folder relative to the workspace root.
        """
        target = resolve(self.root, path)
        stat = target.stat()
        modified = dt.datetime.fromtimestamp(stat.st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        if target.is_dir():
            count = sum(1 for _ in self._walk(target))
            return f"path={self._rel(target)}/ | type=folder | files={count} | modified={modified}"
        kind = target.suffix.lower().lstrip(".") or "file"
        parts = [f"path={self._rel(target)}", f"type={kind}", f"size={stat.st_size} bytes",
                 f"modified={modified}"]
        parts += _document_facts(target)
        hint = app_hint(target.suffix)
        return " | ".join(parts) + (f"\n{hint}" if hint else "")

    def read(self, path: str, offset: int = 0, limit: int = 200) -> str:
        """Read a text file by lines, numbered from 1: `limit` lines after skipping `offset`.

        For pdf, xlsx, docx and pptx this says which app reads them.

        Args:
            path: text file relative to the workspace root.
            offset: lines to skip from the start (0 = from line 1).
            limit: lines to return (at most 2000).
        """
        file = resolve(self.root, path, kind="file")
        suffix = file.suffix.lower()
        if suffix not in TEXT_SUFFIXES and suffix in {".pdf", ".xlsx", ".xlsm", ".docx", ".pptx"}:
            raise ToolError(f"{path} is a {suffix.lstrip('.')} file, not text; {app_hint(suffix)}")
        if file.stat().st_size > MAX_READ_BYTES:
            raise ToolError(f"{path} is {_size(file.stat().st_size)}, too large to read here; "
                            "use filesystem_search on it, or the code tools")
        data = file.read_bytes()
        if b"\x00" in data[:4096]:
            raise ToolError(f"{path} is a binary file ({len(data)} bytes); it has no text to read")
        lines = data.decode("utf-8", errors="replace").splitlines()
        offset, limit = max(0, offset), min(max(1, limit), 2000)
        if not lines:
            return f"{self._rel(file)} is empty (0 lines)"
        if offset >= len(lines):
            raise ToolError(f"{path} has {len(lines)} lines; use an offset below {len(lines)}")
        shown = lines[offset:offset + limit]
        body = [f"{offset + i + 1}: {line[:2000]}" for i, line in enumerate(shown)]
        last = offset + len(shown)
        head = f"{self._rel(file)} lines {offset + 1}-{last} of {len(lines)}"
        more = [f"[more: read with offset={last}]"] if last < len(lines) else []
        return truncate("\n".join([head, *body, *more]),
                        hint="read with a smaller limit, or a larger offset")

    def _entries(self, folder: Path) -> tuple[list[Path], list[Path]]:
        dirs, files = [], []
        for entry in sorted(folder.iterdir(), key=lambda p: p.name.lower()):
            if entry.name.startswith(".") or not entry.exists() or not self._inside(entry):
                continue
            (dirs if entry.is_dir() else files).append(entry)
        return dirs, files

    def _tree_lines(self, folder: Path, depth: int, level: int, out: list[str]) -> None:
        dirs, files = self._entries(folder)
        pad = "  " * level
        for d in dirs:
            out.append(f"{pad}{self._rel(d)}/ ({plural(sum(1 for _ in self._walk(d)), 'file')})")
            if level + 1 < depth and not d.is_symlink():
                self._tree_lines(d, depth, level + 1, out)
        out.extend(f"{pad}{self._rel(f)}" for f in files)

    def _walk(self, folder: Path) -> Iterator[Path]:
        """Files under `folder`, sorted, not hidden, not through folder links, inside the root."""
        for current, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                file = Path(current) / name
                if not name.startswith(".") and self._inside(file) and file.is_file():
                    yield file

    def _inside(self, path: Path) -> bool:
        real = path.resolve()
        return real == self.root or self.root in real.parents


def _lines(file: Path) -> list[str]:
    return file.read_bytes().decode("utf-8", errors="replace").splitlines()


def _document_facts(path: Path) -> list[str]:
    """Page, sheet or slide counts for office files, read from package metadata (cheap)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            from pypdf import PdfReader

            return [f"pages={len(PdfReader(path).pages)}"]
        if suffix in (".xlsx", ".xlsm"):
            import openpyxl

            book = openpyxl.load_workbook(path, read_only=True)
            try:
                return [f"sheets={', '.join(book.sheetnames)}"]
            finally:
                book.close()
        if suffix == ".pptx":
            import pptx

            return [f"slides={len(pptx.Presentation(str(path)).slides)}"]
        if suffix == ".docx":
            import docx

            document = docx.Document(str(path))
            return [f"paragraphs={len(document.paragraphs)}", f"tables={len(document.tables)}"]
    except Exception as exc:  # a corrupt file is still a file: say so instead of failing
        return [f"unreadable={type(exc).__name__}: {str(exc)[:120]}"]
    return []
