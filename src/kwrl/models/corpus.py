"""Text to train the tiny tokenizer on: generated worlds, their tasks, and chats in the template.

BPE learns merges only from what it sees, so the corpus looks like what the agent will read and
write: the text of every world document (names, tables, numbers), the task instructions and
answers, and one chat per task rendered with kwrl's template, so that the tool-call JSON
(`{"name": "`, `", "arguments": {"path": "`) and the ChatML framing tokenize compactly.

The chats are format examples, not demonstrations: their tool calls come from the task's oracle
plan when it has one (`solution/plan.json`), otherwise from the file the instruction names, and
their tool results are excerpts of that file's extracted text.
"""

from __future__ import annotations

import random
import re
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kwrl.graders.extract import extract
from kwrl.models.tokenizer import bare_tokenizer, wrap
from kwrl.types import Task
from kwrl.worlds.split import generate_split
from kwrl.worlds.taskdir import TaskFormatError, load_plan, load_task, task_dirs


def _tool(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    """An OpenAI-style function schema; `params` maps a name to (JSON type, description)."""
    properties = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


EXAMPLE_TOOLS: tuple[dict[str, Any], ...] = (
    _tool("list_files", "List the files under a folder of the workspace.",
          path=("string", "Folder, relative to the workspace root.")),
    _tool("read_file", "Read a file's text (spreadsheets, PDFs, slides and mail are extracted).",
          path=("string", "File, relative to the workspace root.")),
    _tool("search_file", "Return only the lines of a file that contain the query.",
          path=("string", "File, relative to the workspace root."),
          query=("string", "Words to look for.")),
)  # fmt: skip
"""Generic file tools for format examples (the real tool schemas come from `kwrl.tools`)."""
SYSTEM_PROMPT = (
    "You are an analyst. The workspace holds the client's files. Use the tools to find the "
    "facts you need, then give a short final answer that states the figure or name asked for."
)
EXCERPT_LINES = 12


def world_corpus(n_tasks: int = 90, seed: int = 0, files_per_world: int = 40) -> list[str]:
    """Texts from a freshly generated split (6 worlds for 90 tasks), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kwrl-corpus-") as tmp:
        root = generate_split("tokenizer", n_tasks, seed, Path(tmp) / "split", files_per_world)
        documents = {path: extract(path).text()
                     for path in sorted((root / "worlds").glob("*/files/**/*")) if path.is_file()}
        texts = [text for text in documents.values() if text]
        for task_dir in task_dirs(root):
            task = load_task(task_dir)
            answer = (task_dir / "solution" / "answer.md").read_text().strip()
            texts += [task.instruction, answer]
            texts.append(render_chat(example_chat(task, answer, documents), EXAMPLE_TOOLS))
    return texts


def render_chat(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as text in kwrl's template (before any vocabulary exists)."""
    rendered = wrap(bare_tokenizer()).apply_chat_template(
        [dict(m) for m in messages], tools=[dict(t) for t in tools], tokenize=False
    )
    return str(rendered)


def example_chat(task: Task, answer: str, documents: Mapping[Path, str]) -> list[dict[str, Any]]:
    """System, user, tool-calling assistant turns with their results, and the final answer."""
    rng = random.Random(zlib.crc32(task.task_id.encode()))
    files_root = task.world_dir / "files"
    calls = _planned_calls(task.task_dir) or _guessed_calls(task, files_root, rng)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.instruction},
    ]
    for k, (name, arguments) in enumerate(calls):
        thought = f"<think>\nI need the figure from {arguments.get('path', 'the files')}.\n</think>"
        messages.append({
            "role": "assistant",
            # Rendered as `</think>\n\n<tool_call>`, the way Qwen3 writes a reasoning turn.
            "content": thought + "\n" if k == 0 and rng.random() < 0.5 else "",
            "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments}}],
        })
        messages.append({"role": "tool",
                         "content": _tool_result(name, arguments, files_root, documents, rng)})
    messages.append({"role": "assistant", "content": answer})
    return messages


def _tool_result(name: str, arguments: Mapping[str, Any], files_root: Path,
                 documents: Mapping[Path, str], rng: random.Random) -> str:
    """What a file tool would plausibly return: a listing, matching lines, or an excerpt."""
    target = files_root / str(arguments.get("path", "."))
    if name == "list_files":
        listed = sorted(p.relative_to(files_root).as_posix() for p in target.glob("*"))
        return "\n".join(listed) or "The folder is empty."
    lines = [line for line in documents.get(target, "").splitlines() if line.strip()]
    query = str(arguments.get("query", "")).lower()
    if query:
        lines = [line for line in lines if query in line.lower()] or ["No line matches."]
    start = rng.randrange(max(1, len(lines) - EXCERPT_LINES))
    return "\n".join(lines[start:start + EXCERPT_LINES]) or "The file has no text."


def _planned_calls(task_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        calls, _ = load_plan(task_dir)
    except TaskFormatError:
        return []
    return [(c.tool, dict(c.arguments)) for c in calls]


def _guessed_calls(task: Task, files_root: Path, rng: random.Random
                   ) -> list[tuple[str, dict[str, Any]]]:
    """list_files, then read or search the file the instruction names (or a random one)."""
    paths = sorted(p.relative_to(files_root).as_posix() for p in files_root.rglob("*")
                   if p.is_file())
    named = [p for p in paths if p in task.instruction]
    path = named[0] if named else rng.choice(paths)
    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    words = re.findall(r"[A-Z][a-z]+", task.instruction)
    second: tuple[str, dict[str, Any]] = (
        ("search_file", {"path": path, "query": rng.choice(words)}) if words and rng.random() < 0.5
        else ("read_file", {"path": path})
    )
    return [("list_files", {"path": folder}), second]


def sample_corpus(n: int = 40, seed: int = 0) -> list[str]:
    """A small world-like corpus built in milliseconds, for tests and smoke runs.

    Tables of segment figures, a memo line, an instruction and a tool-calling chat per company:
    enough text for a few hundred merges, with the same shapes as `world_corpus`.
    """
    rng = random.Random(seed)
    stems = ["Whitcombe", "Harlow", "Brightwater", "Castell", "Dunmore", "Ellery", "Fenwick"]
    kinds = ["Logistics", "Holdings", "Analytics", "Partners", "Energy"]
    segments = ["Hardware", "Licensing", "Consulting", "Cloud", "Services"]
    texts: list[str] = []
    for _ in range(n):
        company = f"{rng.choice(stems)} {rng.choice(kinds)}"
        period = f"Q{rng.randint(1, 4)} {rng.choice((2024, 2025))}"
        rows = [f"{s} | {rng.uniform(10, 900):,.1f} | {rng.uniform(1, 90):.1f}" for s in segments]
        table = "\n".join([f"{company} segment results {period}",
                           "Segment | Revenue ($m) | EBITDA ($m)", *rows])
        path = f"Finance/{company.replace(' ', '_')}_{period.replace(' ', '_')}.xlsx"
        question = f"What was the revenue of the Cloud segment of {company} in {period}?"
        answer = f"Cloud revenue in {period} was ${rows[3].split(' | ')[1]}m."
        memo = (f"Memo: the board of {company} approved the {period} results on "
                f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}.")
        chat = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
            {"role": "assistant",
             "content": "<think>\nThe figures are in the workbook.\n</think>\n",
             "tool_calls": [{"type": "function", "function": {
                 "name": "search_file", "arguments": {"path": path, "query": "Cloud"}}}]},
            {"role": "tool", "content": rows[3]},
            {"role": "assistant", "content": answer},
        ]
        texts += [table, memo, question, render_chat(chat, EXAMPLE_TOOLS)]
    return texts
