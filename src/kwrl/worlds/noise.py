"""Noise files: the clutter of a real shared drive, up to the world's requested file count.

Noise is what makes "find the right file" a real skill: meeting notes that mention segments
without figures, admin memos, and research notes on the near-duplicate company (`lookalike`) with
plausible numbers that belong to nobody in the task. Formats are mixed like a real drive.
"""

from __future__ import annotations

import datetime as dt
import random

from kwrl.worlds import docmodel as dm
from kwrl.worlds.facts import WorldFacts

_TOPICS = ("vendor onboarding", "IT access review", "holiday rota", "printer fleet renewal",
           "data retention policy", "client satisfaction survey", "training plan",
           "office move", "travel policy", "knowledge management", "risk register review",
           "quality review", "pricing committee", "procurement calendar", "hiring plan")
_FOLDERS = ("Notes", "Admin", "Archive", "Research", "Misc")


def _note(f: WorldFacts, rng: random.Random, topic: str, date: dt.date) -> dm.Document:
    person = rng.choice(f.people)
    seg = rng.choice(f.segments)
    return dm.Document(f"Notes: {topic}", (
        dm.Paragraph(f"Attendees: {person.name}, {rng.choice(f.people).name}."),
        dm.Paragraph(f"Discussed {topic}. The {seg} team asked for an update next month."),
        dm.Paragraph(f"Action: {person.name.split()[0]} to circulate a short summary.", "bullet"),
    ), author=person.name, date=date)


def _lookalike_report(f: WorldFacts, rng: random.Random, year: int) -> dm.Document:
    rows = tuple((s, round(rng.uniform(20, 160), 1), round(rng.uniform(2, 40), 1))
                 for s in f.segments)
    return dm.Document(f"{f.lookalike}: annual review {year}", (
        dm.Paragraph(f"Research note on {f.lookalike} (not to be confused with {f.company})."),
        dm.Table(("Segment", "Revenue ($m)", "EBITDA ($m)"), rows,
                 caption=f"{f.lookalike} segment results {year}"),
    ), author="Research desk", date=dt.date(year, 12, 15))


def noise_files(f: WorldFacts, rng: random.Random, count: int, distractors: bool = True
                ) -> dict[str, object]:
    files: dict[str, object] = {}
    slug = f.lookalike.replace(" ", "_")
    for i in range(count):
        topic = _TOPICS[i % len(_TOPICS)]
        folder = _FOLDERS[i % len(_FOLDERS)]
        date = dt.date(2025, 1, 1) + dt.timedelta(days=rng.randint(0, 330))
        name = f"{folder}/{date:%Y-%m-%d}_{topic.replace(' ', '_')}_{i:03d}"
        kind = i % 10
        if kind in (0, 5) and i < 30 and distractors:
            year = 2023 + (i // 5) % 3
            version = "" if i < 15 else "_v2"
            files[f"Research/{slug}_Annual_Review_{year}{version}.pdf"] = _lookalike_report(
                f, rng, year)
        elif kind in (1, 6):
            files[name + ".docx"] = _note(f, rng, topic, date)
        elif kind == 2:
            files[name + ".txt"] = _note(f, rng, topic, date)
        elif kind == 3:
            rows = tuple((f"item {j}", rng.randint(1, 500)) for j in range(rng.randint(3, 8)))
            files[name + ".csv"] = dm.Table(("item", "count"), rows)
        else:
            files[name + ".md"] = _note(f, rng, topic, date)
    return files
