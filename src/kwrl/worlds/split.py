"""Generate a split: worlds rendered once, tasks drawn from templates, written in Harbor's layout.

Worlds are independent, so they are generated in parallel processes; each world's output depends
only on (split, seed, world index), never on scheduling, so a split is byte-identical however many
workers build it. Train and test derive world seeds from the split name: they never share a world.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kwrl.types import Domain
from kwrl.worlds.compose import Paths, compose_world
from kwrl.worlds.facts import WorldFacts, make_world
from kwrl.worlds.render import render_bytes, render_files
from kwrl.worlds.taskdir import TaskSpec, write_task
from kwrl.worlds.templates import Draft, Template, World, templates_for

TASKS_PER_WORLD = 15
TIER_WEIGHTS = (0.3, 0.3, 0.25, 0.15)
"""Share of tiers 1-4 among a world's tasks."""
DOMAINS = (Domain.CONSULTING, Domain.BANKING, Domain.LAW)
MAX_FILES_PER_WORLD = 400


def task_spec(world: World, tmpl: Template, draft: Draft, k: int) -> TaskSpec:
    f = world.facts
    return TaskSpec(
        task_id=f"{f.world_id}-t{k:02d}",
        instruction=draft.instruction,
        rubric=draft.rubric,
        domain=f.domain,
        tier=tmpl.tier,
        template=f"{f.domain.value}.{tmpl.name}",
        world_id=f.world_id,
        oracle_answer=draft.answer,
        oracle_files={rel: render_bytes(rel, m) for rel, m in draft.files.items()},
        distractor_answer=draft.distractor_answer,
        distractor_files={rel: render_bytes(rel, m) for rel, m in draft.distractor_files.items()},
        oracle_plan=draft.plan,
    )


def draw_tasks(world: World, count: int) -> list[TaskSpec]:
    """`count` distinct tasks for one world, tiers drawn by TIER_WEIGHTS."""
    rng = random.Random(world.facts.seed ^ 0x7A5C)
    specs: list[TaskSpec] = []
    seen: set[str] = set()
    used: Counter[str] = Counter()
    attempts = 0
    while len(specs) < count and attempts < count * 50:
        attempts += 1
        tier = rng.choices((1, 2, 3, 4), TIER_WEIGHTS)[0]
        candidates = templates_for(world.facts.domain, tier, world.distractors)
        # Spread a world's tasks over its templates: the least-used template of the tier goes next.
        fewest = min(used[t.name] for t in candidates)
        tmpl = rng.choice([t for t in candidates if used[t.name] == fewest])
        draft = tmpl.build(world, rng)
        used[tmpl.name] += 1
        if draft is None or draft.instruction in seen:
            continue
        seen.add(draft.instruction)
        specs.append(task_spec(world, tmpl, draft, len(specs)))
    return specs


def build_world(split: str, seed: int, index: int, n_tasks: int, files_per_world: int,
                out: Path, distractors: bool = True) -> tuple[str, list[str]]:
    """Render world `index` under `out/worlds/` and write its tasks; return (world id, task ids)."""
    facts = make_world(split, seed, index, DOMAINS[index % len(DOMAINS)])
    world_dir = out / "worlds" / facts.world_id
    files = compose_world(facts, files_per_world, distractors)
    render_files(files, world_dir / "files")
    (world_dir / "world.json").write_text(_facts_json(facts))
    world = World(facts, Paths(facts), files, distractors)
    specs = draw_tasks(world, n_tasks)
    for spec in specs:
        write_task(spec, out / "tasks", world_dir)
    return facts.world_id, [s.task_id for s in specs]


def _facts_json(facts: WorldFacts) -> str:
    return json.dumps(facts.to_json(), indent=1, sort_keys=True, default=str)


def generate_split(split: str, n_tasks: int, seed: int, out: Path, files_per_world: int = 60,
                   progress: Callable[[int, int], None] | None = None,
                   workers: int | None = None, distractors: bool = True) -> Path:
    """Write a split of `n_tasks` tasks to `out`; call `progress(done, total)` per world.

    `distractors=False` builds easier worlds without superseded drafts or look-alike notes.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", split):
        raise ValueError(f"split name must be lowercase letters, digits or _: {split!r}")
    if n_tasks < 1:
        raise ValueError("--tasks must be at least 1")
    if not 30 <= files_per_world <= MAX_FILES_PER_WORLD:
        raise ValueError(f"files per world must be 30-{MAX_FILES_PER_WORLD}: {files_per_world}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose a new output directory")
    out.mkdir(parents=True, exist_ok=True)
    n_worlds = math.ceil(n_tasks / TASKS_PER_WORLD)
    counts = [min(TASKS_PER_WORLD, n_tasks - i * TASKS_PER_WORLD) for i in range(n_worlds)]
    workers = workers or min(os.cpu_count() or 1, n_worlds)
    results: list[tuple[str, list[str]]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(build_world, split, seed, i, counts[i], files_per_world, out,
                               distractors)
                   for i in range(n_worlds)]
        for done, future in enumerate(futures, start=1):
            results.append(future.result())
            if progress:
                progress(done, n_worlds)
    manifest = {
        "split": split, "seed": seed, "files_per_world": files_per_world,
        "distractors": distractors,
        "worlds": [w for w, _ in results], "tasks": [t for _, ts in results for t in ts],
    }
    (out / "split.json").write_text(json.dumps(manifest, indent=1))
    return out
