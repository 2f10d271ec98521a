"""The pdf app: page text, tables as rows, and a search that returns table rows with their header.

pdfplumber's text extraction reads a page line by line across its full width, so on a
two-column page a table in one column comes out interleaved with the prose beside it: the row
`Retail 45.5 12.2` is split over lines that also hold half a sentence. `extract_tables` reads the
table from its ruling lines instead and gives clean rows. So `read_pages` flags every page that
has a table and points to `tables`, and `search` prints matching table rows as `Header=value`
pairs (the form a model can copy a number from), then matching sentences, rejoined across line
breaks with the table rows cut out of them (see `_sentences`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kwrl.tools.apps.base import (
    App,
    clean_text,
    corrupt,
    hit_list,
    matches,
    pairs,
    plural,
    terms,
)
from kwrl.tools.errors import ToolError
from kwrl.tools.truncate import truncate

Rows = list[list[str]]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[-A-Z0-9(\"'$])")
MAX_SENTENCE_CHARS = 400
PAGES_PER_READ = 20
"""Pages `read_pages` reads when no end is given: pdfplumber needs ~40 ms a page."""


@dataclass
class Page:
    number: int
    text: str
    tables: list[Rows]


def _cell(value: str | None) -> str:
    return " ".join((value or "").split())


def _load(path: Path, rel: str, first: int, last: int | None, text: bool, tables: bool,
          max_pages: int | None = None) -> tuple[list[Page], int]:
    """Pages `first`..`last` (1-based, inclusive; None = to the end, but at most `max_pages`)
    and the page count."""
    import pdfplumber

    try:
        with pdfplumber.open(path) as pdf:
            count = len(pdf.pages)
            if count == 0:
                raise ToolError(f"{rel} has no pages")
            end = min(count, last) if last is not None else \
                min(count, first + max_pages - 1) if max_pages else count
            _check_range(rel, first, end, count)
            pages = []
            for page in pdf.pages[first - 1:end]:
                body = clean_text(page.extract_text() or "") if text else ""
                # Tables are found from ruling lines: a page without any has none to find, and
                # skipping the search there halves the time spent on long text documents.
                ruled = bool(page.lines or page.rects)
                found = [[[_cell(c) for c in row] for row in table]
                         for table in page.extract_tables()] if tables and ruled else []
                pages.append(Page(page.page_number, body, [t for t in found if t]))
            return pages, count
    except ToolError:
        raise
    except Exception as exc:  # pdfminer raises many types on a damaged file
        raise corrupt(rel, "a PDF", exc) from exc


def _check_range(rel: str, first: int, last: int, count: int) -> None:
    if first < 1 or first > count:
        raise ToolError(f"{rel} has {plural(count, 'page')}; start must be between 1 and {count}")
    if last < first:
        raise ToolError(f"end ({last}) is before start ({first}); give end >= start")


def _table_block(page: int, index: int, table: Rows) -> str:
    width = max(len(row) for row in table)
    lines = [f"page {page}, table {index} ({len(table)} rows x {width} cols)"]
    lines += [" | ".join(row) for row in table]
    return "\n".join(lines)


class Pdf(App):
    """Read PDFs: text by page, tables as rows, search."""

    name = "pdf"
    suffixes = (".pdf",)

    def read_pages(self, path: str, start: int = 1, end: int | None = None) -> str:
        """Read the text of pages `start` to `end` (1-based, inclusive), each under `--- page N`.

        Text is read line by line across the page, so on two-column pages a table's rows get
        interleaved with the prose beside them: for numbers in tables use pdf_tables.

        Args:
            path: the PDF, relative to the workspace root.
            start: first page (1-based).
            end: last page (default: the last page, reading at most 20 pages).
        """
        file = self._file(path)
        pages, count = _load(file, path, start, end, text=True, tables=True,
                             max_pages=PAGES_PER_READ)
        blocks = []
        for page in pages:
            head = f"--- page {page.number} of {count} ---"
            if page.tables:
                n = len(page.tables)
                head += (f" ({n} table{'s' if n > 1 else ''}: pdf_tables with page={page.number} "
                         "gives clean rows)")
            blocks.append(f"{head}\n{page.text.strip() or '(no text on this page)'}")
        last = pages[-1].number
        if end is None and last < count:
            blocks.append(f"[pages {last + 1}-{count} not read: pdf_read_pages with "
                          f"start={last + 1}]")
        return truncate("\n".join(blocks), hint="use pdf_read_pages with start/end for fewer pages")

    def tables(self, path: str, page: int | None = None) -> str:
        """Extract the tables of one page (or every page) as pipe-separated rows, header first.

        This is the tool for tables beside prose (two-column layouts), where pdf_read_pages
        interleaves table rows with text. Tables are numbered from 1 on each page.

        Args:
            path: the PDF, relative to the workspace root.
            page: 1-based page number (default: all pages).
        """
        file = self._file(path)
        pages, count = _load(file, path, page or 1, page, text=False, tables=True)
        blocks = [_table_block(p.number, i, t) for p in pages for i, t in enumerate(p.tables, 1)]
        if not blocks:
            where = f"page {page} of {path}" if page else f"{path} ({plural(count, 'page')})"
            return (f"no tables found on {where}; tables without ruling lines read as text: "
                    "use pdf_read_pages or pdf_search")
        return truncate("\n\n".join(blocks), hint="use pdf_tables with page=N for one page")

    def search(self, path: str, query: str) -> str:
        """Find table rows and sentences containing all words of `query`, with page numbers.

        Table rows come as `page 1, table 1: Segment=Retail | Revenue ($m)=45.5`, text as
        `page 2: <the sentence>` (sentences are rejoined across line breaks).

        Args:
            path: the PDF, relative to the workspace root.
            query: words that must all appear in a table row (with its header) or a sentence.
        """
        words = terms(query)
        file = self._file(path)
        pages, _ = _load(file, path, 1, None, text=True, tables=True)
        hits: list[str] = []
        for page in pages:
            rows: list[str] = []
            for index, table in enumerate(page.tables, start=1):
                header = table[0]
                for row in table[1:]:
                    if matches(words, " ".join(header + row)):
                        hits.append(f"page {page.number}, table {index}: {pairs(header, row)}")
                    if any(row):
                        rows.append(" ".join(" ".join(row).split()))
            hits += [f"page {page.number}: {_around(sentence, words)}"
                     for sentence in _sentences(page.text, rows) if matches(words, sentence)]
        return truncate(hit_list(hits, query, path), hint="use more words to narrow the query")


def _sentences(text: str, rows: list[str]) -> list[str]:
    """The page's prose as sentences, table rows cut out; lines where there is no prose.

    A line holding a table row is the row again (the table hit gives it cleanly) or, on a
    two-column page, the row interleaved with a line of prose: cutting the row out leaves the
    prose, and rejoining lines restores sentences that the layout broke, so `notice.` on its own
    line is found inside "...terminate for convenience on 90 days' written notice." Text without
    sentence ends (lists, text tables) would join into one long run: it stays in lines.
    """
    kept = []
    for line in text.splitlines():
        flat = " ".join(line.split())
        for row in rows:
            flat = flat.replace(row, " ")
        if flat.strip():
            kept.append(" ".join(flat.split()))
    records = []
    for sentence in _SENTENCE_END.split("\n".join(kept)):
        if len(sentence) <= MAX_SENTENCE_CHARS:
            records.append(sentence.replace("\n", " "))
        else:
            records += sentence.split("\n")
    return [r for r in records if r.strip()]


def _around(sentence: str, words: list[str], width: int = MAX_SENTENCE_CHARS) -> str:
    """A long sentence cut to `width` characters around the first matching word."""
    if len(sentence) <= width:
        return sentence
    at = min((sentence.lower().find(w) for w in words if w in sentence.lower()), default=0)
    start = max(0, min(at - width // 3, len(sentence) - width))
    return ("..." if start else "") + sentence[start:start + width] + \
        ("..." if start + width < len(sentence) else "")
