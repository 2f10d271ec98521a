"""Contamination check between two splits: shared worlds and near-duplicate prompts.

Train and test must never share a world (a simulated company and its files) or a prompt. World
ids come from each split's `split.json`, or, where it is missing, from the `metadata.world_id` of
every `task.toml`.

Near-duplicate prompts are found with word shingles: the set of all runs of `n` consecutive
words of an `instruction.md` (lower-cased, punctuation dropped, numbers such as `4.5` or `1,200`
kept whole). Tasks generated from one template share boilerplate ("Answer in millions of
dollars, rounded to one decimal place."), so two unrelated tasks of the same template overlap
in their boilerplate. Two measures keep that from reading as a duplicate:

* `n = 8` by default: a shingle that touches any specific word (a company, a segment, a number)
  differs between tasks, and 8 words rarely fit between two specific words of one sentence.
* Boilerplate removal: a shingle found in `boilerplate_df` (3) or more prompts of the two splits
  together, or in two prompts of one split, is template text, not task content, and is ignored.
  A prompt leaked from one split into the other appears once in each, so its specific shingles
  survive, while a template used twice in a split shows its boilerplate. (A template used only
  once in each split cannot show it; its two prompts are then judged on 8-word shingles alone.)

Same question, other subject: two prompts that ask the same thing about different companies
("What EBITDA did Dunmore Logistics's Energy segment...", "...Silverline Logistics's...") differ
in one word yet are different tasks, answered in different worlds. So a pair is a near-duplicate
only if both prompts name the same things: the same set of capitalised words that do not start a
sentence (companies, segments, people, file names). Prompts without such names are judged on
their shingles alone.

Similarity is containment over the remaining ("specific") shingles, |A & B| / min(|A|, |B|),
so a prompt copied into a longer one still scores 1; Jaccard is reported beside it. Prompts with
identical normalized text are always reported, with similarity 1.0.

Cost: shingles of split B are indexed in a dict (shingle -> task indices); each prompt of A only
visits the B prompts it shares a shingle with, so 2,000 x 500 tasks take well under a second,
instead of a million pairwise set intersections.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kwrl.worlds.taskdir import task_dirs

_WORD = re.compile(r"[^\W_]+(?:[.,'][^\W_]+)*")


@dataclass(frozen=True)
class PromptPair:
    """Two prompts, one from each split, whose specific content overlaps."""

    task_a: str
    task_b: str
    similarity: float
    """Containment of the specific shingles, |A & B| / min(|A|, |B|), in [0, 1]."""
    jaccard: float
    """|A & B| / |A | B| over the same shingles (1.0 for identical texts)."""


@dataclass(frozen=True)
class SplitOverlap:
    """What `check_split` found; `clean` when the splits share neither worlds nor prompts."""

    split_a: str
    split_b: str
    n_tasks_a: int
    n_tasks_b: int
    shared_worlds: tuple[str, ...]
    near_duplicates: tuple[PromptPair, ...]
    """Sorted by similarity, highest first."""
    n: int
    threshold: float

    @property
    def clean(self) -> bool:
        return not self.shared_worlds and not self.near_duplicates


def check_split(
    a: Path, b: Path, n: int = 8, threshold: float = 0.5, boilerplate_df: int = 3
) -> SplitOverlap:
    """Compare split `a` with split `b` (directories of tasks, or split directories)."""
    a, b = Path(a), Path(b)
    for root in (a, b):
        if not root.is_dir():
            raise FileNotFoundError(f"split directory not found: {root}")
    prompts_a, prompts_b = read_prompts(a), read_prompts(b)
    shared = sorted(split_world_ids(a) & split_world_ids(b))
    pairs = near_duplicate_prompts(prompts_a, prompts_b, n, threshold, boilerplate_df)
    return SplitOverlap(
        split_a=str(a),
        split_b=str(b),
        n_tasks_a=len(prompts_a),
        n_tasks_b=len(prompts_b),
        shared_worlds=tuple(shared),
        near_duplicates=tuple(pairs),
        n=n,
        threshold=threshold,
    )


def split_world_ids(root: Path) -> set[str]:
    """World ids of a split: `split.json`'s `worlds`, else every task's `metadata.world_id`."""
    split_json = root / "split.json"
    if split_json.is_file():
        raw = json.loads(split_json.read_text())
        worlds = raw.get("worlds") if isinstance(raw, dict) else None
        if isinstance(worlds, list):
            return {str(w) for w in worlds}
    ids: set[str] = set()
    for task_dir in task_dirs(root):
        try:
            meta = tomllib.loads((task_dir / "task.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue  # a task whose metadata cannot be read names no world
        world_id = meta.get("metadata", {}).get("world_id")
        if isinstance(world_id, str) and world_id:
            ids.add(world_id)
    return ids


def read_prompts(root: Path) -> dict[str, str]:
    """task id -> instruction text, for every task of a split that has an `instruction.md`."""
    prompts: dict[str, str] = {}
    for task_dir in task_dirs(root):
        path = task_dir / "instruction.md"
        if path.is_file():
            prompts[task_dir.name] = path.read_text(errors="replace")
    return prompts


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(tokens: list[str], n: int) -> set[int]:
    """Hashes of all n-word runs; a prompt shorter than n words is one shingle."""
    if len(tokens) < n:
        return {hash(tuple(tokens))} if tokens else set()
    return {hash(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)}


def near_duplicate_prompts(
    prompts_a: dict[str, str],
    prompts_b: dict[str, str],
    n: int = 8,
    threshold: float = 0.5,
    boilerplate_df: int = 3,
) -> list[PromptPair]:
    """Pairs (task in a, task in b) whose specific shingles overlap by at least `threshold`."""
    ids_a, ids_b = list(prompts_a), list(prompts_b)
    words_a = [words(prompts_a[t]) for t in ids_a]
    words_b = [words(prompts_b[t]) for t in ids_b]
    sets_a = [shingles(w, n) for w in words_a]
    sets_b = [shingles(w, n) for w in words_b]
    if boilerplate_df > 0:
        # Template text shows either across both splits or twice within one split; a leaked
        # prompt shows once per split, so its specific shingles survive both filters.
        common = (_frequent([*sets_a, *sets_b], boilerplate_df)
                  | _frequent(sets_a, 2) | _frequent(sets_b, 2))
        sets_a = [s - common for s in sets_a]
        sets_b = [s - common for s in sets_b]
    found = _exact_duplicates(words_a, words_b)
    index: dict[int, list[int]] = {}
    for j, shingle_set in enumerate(sets_b):
        for shingle in shingle_set:
            index.setdefault(shingle, []).append(j)
    names_a = [proper_names(prompts_a[t]) for t in ids_a]
    names_b = [proper_names(prompts_b[t]) for t in ids_b]
    for i, shingle_set in enumerate(sets_a):
        shared = Counter(j for s in shingle_set for j in index.get(s, ()))
        for j, n_shared in shared.items():
            containment = n_shared / min(len(shingle_set), len(sets_b[j]))
            if containment >= threshold and (i, j) not in found and names_a[i] == names_b[j]:
                jaccard = n_shared / (len(shingle_set) + len(sets_b[j]) - n_shared)
                found[i, j] = (containment, jaccard)
    pairs = [PromptPair(ids_a[i], ids_b[j], s, jac) for (i, j), (s, jac) in found.items()]
    return sorted(pairs, key=lambda p: (-p.similarity, p.task_a, p.task_b))


_SENTENCE_START = re.compile(r"(?:^|[.!?:]\s+|\n\s*)([A-Z][\w'&-]*)")
_CAPITALISED = re.compile(r"\b[A-Z][\w'&-]*")


def proper_names(text: str) -> frozenset[str]:
    """Capitalised words that do not open a sentence: what a prompt is about."""
    openers = {m.start(1) for m in _SENTENCE_START.finditer(text)}
    return frozenset(m.group() for m in _CAPITALISED.finditer(text) if m.start() not in openers)


def _frequent(sets: Iterable[set[int]], min_df: int) -> set[int]:
    """Shingles that occur in at least `min_df` of the sets (template boilerplate)."""
    df = Counter(s for shingle_set in sets for s in shingle_set)
    return {s for s, count in df.items() if count >= min_df}


def _exact_duplicates(
    words_a: list[list[str]], words_b: list[list[str]]
) -> dict[tuple[int, int], tuple[float, float]]:
    """Identical normalized texts, found even when all their shingles count as boilerplate."""
    by_text: dict[tuple[str, ...], list[int]] = {}
    for j, tokens in enumerate(words_b):
        if tokens:
            by_text.setdefault(tuple(tokens), []).append(j)
    return {
        (i, j): (1.0, 1.0)
        for i, tokens in enumerate(words_a)
        for j in by_text.get(tuple(tokens), ())
    }
