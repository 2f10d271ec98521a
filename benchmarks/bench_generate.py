"""Benchmark: generating the 480-task test split (target: under 5 minutes on a 2-core machine).

The machine is shared and noisy, so the run also measures a baseline in the same process: the
bare cost of writing files with the document libraries directly (one small PDF, XLSX, DOCX and
PPTX each, no kwrl code). The ratio of kwrl's per-file cost to that baseline is what to compare
across runs; the absolute time is what the target is stated in.

    .venv/bin/python benchmarks/bench_generate.py [--tasks 480]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 300.0


def bare_library_seconds_per_file(root: Path, rounds: int = 20) -> float:
    import docx
    import openpyxl
    import pptx
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate

    styles = getSampleStyleSheet()
    start = time.perf_counter()
    for i in range(rounds):
        SimpleDocTemplate(str(root / f"{i}.pdf"), pagesize=A4).build(
            [Paragraph("Quarterly report " * 40, styles["BodyText"])])
        wb = openpyxl.Workbook()
        for r in range(20):
            wb.active.append([f"row {r}", r, r * 2.5])
        wb.save(root / f"{i}.xlsx")
        d = docx.Document()
        d.add_paragraph("Memo " * 50)
        d.save(root / f"{i}.docx")
        p = pptx.Presentation()
        p.slides.add_slide(p.slide_layouts[1]).shapes.title.text = "Key figures"
        p.save(root / f"{i}.pptx")
    return (time.perf_counter() - start) / (4 * rounds)


def main() -> None:
    from kwrl.worlds.split import generate_split

    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=480)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kwrl-bench-") as tmp:
        root = Path(tmp)
        (root / "bare").mkdir()
        bare = bare_library_seconds_per_file(root / "bare")
        start = time.perf_counter()
        out = generate_split("test", args.tasks, 1, root / "split")
        elapsed = time.perf_counter() - start
        n_files = sum(1 for p in (out / "worlds").rglob("*") if p.is_file())
        n_tasks = sum(1 for p in (out / "tasks").iterdir())
        shutil.rmtree(out)
    per_file = elapsed / n_files
    print(f"generated {n_tasks} tasks, {n_files} world files in {elapsed:.1f} s "
          f"(target {TARGET_SECONDS:.0f} s: {elapsed / TARGET_SECONDS:.3f} of the budget)")
    print(f"baseline: bare library write {bare * 1e3:.1f} ms/file; kwrl {per_file * 1e3:.1f} "
          f"ms/world file incl. tasks and oracle edits; ratio {per_file / bare:.2f}")


if __name__ == "__main__":
    main()
