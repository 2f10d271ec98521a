"""Deterministic writers that render `kwrl.worlds.docmodel` into real files.

Every writer is `(model, path) -> None` and byte-for-byte reproducible: the same model gives the
same bytes in any process at any time, so a world's files can be hashed, cached and diffed.
Wall-clock leaks are closed per format (see `ooxml` for docx/xlsx/pptx, `pdf`, `messages`).
"""

from kwrl.worlds.writers.messages import write_chat, write_eml, write_ics, write_mbox
from kwrl.worlds.writers.pdf import write_pdf
from kwrl.worlds.writers.slides import write_pptx
from kwrl.worlds.writers.spreadsheet import write_xlsx
from kwrl.worlds.writers.text import write_csv, write_markdown, write_text
from kwrl.worlds.writers.word import write_docx

__all__ = [
    "write_chat",
    "write_csv",
    "write_docx",
    "write_eml",
    "write_ics",
    "write_markdown",
    "write_mbox",
    "write_pdf",
    "write_pptx",
    "write_text",
    "write_xlsx",
]
