"""Write a composed world's document models to real files, choosing the writer by file suffix."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from kwrl.worlds import docmodel as dm
from kwrl.worlds import writers


def write_model(model: object, path: Path) -> None:
    """Render one model to `path`; the suffix picks the format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".mbox":
        writers.write_mbox(model, path)
    elif suffix == ".ics":
        writers.write_ics(model, path)
    elif suffix == ".json":
        writers.write_chat(model, path)
    elif suffix == ".csv" and isinstance(model, dm.Table):
        writers.write_csv(model, path)
    elif suffix == ".xlsx" and isinstance(model, dm.Workbook):
        writers.write_xlsx(model, path)
    elif suffix == ".pptx" and isinstance(model, dm.Deck):
        writers.write_pptx(model, path)
    elif isinstance(model, dm.Document) and suffix in _DOCUMENT_WRITERS:
        _DOCUMENT_WRITERS[suffix](model, path)
    else:
        raise ValueError(f"no writer for {type(model).__name__} as {suffix} ({path})")


_DOCUMENT_WRITERS = {
    ".pdf": writers.write_pdf,
    ".docx": writers.write_docx,
    ".md": writers.write_markdown,
    ".txt": writers.write_text,
}


def render_files(files: Mapping[str, object], root: Path) -> None:
    for rel, model in sorted(files.items()):
        write_model(model, root / rel)


def render_bytes(rel: str, model: object) -> bytes:
    """The exact bytes `model` renders to as `rel` (used for oracle edits)."""
    with tempfile.TemporaryDirectory(prefix="kwrl-render-") as tmp:
        path = Path(tmp) / Path(rel).name
        write_model(model, path)
        return path.read_bytes()
