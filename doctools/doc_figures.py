"""Find figures written into the docs' prose, where no file keeps them true.

A figure is a number with a unit (s, ms, min, h, %, ×, MiB, GB, images, img/s, tests, seeds, epochs);
``3 × 3`` is a size, not a ratio.
It may stand in README.md, docs/*.md and the READMEs of benchmarks/ and tests/ only where a file
keeps it true: inside a generated block (``<!-- table: ... -->``) or value span
(``<!-- value FILE KEY -->``), both rewritten from their files by ``doctools/doc_tables.py``; in
a fenced code block or an inline code span (a command, a setting, a file's contents); or on a line
that one of the patterns of ``ALLOWED`` matches, each with its reason (at most 20 patterns, each a
line pattern: no file is exempt as a whole). Prose describes; the files give the figures.

``python -m doctools.doc_figures`` lists every figure it finds outside those places and exits 1
when there is one (tests/test_doc_figures.py runs it in the fast lane).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

UNIT = (
    r"(?:ms|s|min|minutes?|seconds?|hours?|h|%|(?:×|x)(?!\s?\d)|MiB|GiB|KiB|MB|GB|images?|img/s|tests?|seeds?|epochs?)"
)
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.\-/#]){NUMBER}\s?(?:(?:-|–|to)\s?{NUMBER}\s?)?{UNIT}(?![\w/])")

# (line pattern, why a figure on such a line needs no file). At most 20; each matches lines, not files.
ALLOWED: list[tuple[str, str]] = [
    (
        r"\b(?:95|90) ?% (?:interval|CI|confidence)|\b(?:95|90) ?%\]|\[95 ?%|(?:95|90) ?% intervals?",
        "the level of an interval is a definition (locvit.report.stats.CONFIDENCE, TOST's 1 - 2 alpha), "
        "not a measurement",
    ),
    (r"\b80 ?% power|at 80 ?%|power of 80 ?%", "the MDE's power is a definition (locvit.report.stats.POWER)"),
    (
        r"\bgoals?\b[^.;]*(?:≥|≤|<|>|at least|under)",
        "a goal is the target its benchmark script sets and records in its file (`goals`, `goal_s`), not a measurement",
    ),
    (
        r"64 MiB|at most 10 minutes|15 minutes of device time",
        "the GPU node's limits (a command, a visit, the files carried), which the check's plans and the wheelhouse are "
        "sized to and tests/test_gpu_check.py and tests/test_wheelhouse.py check them against",
    ),
    (
        r"within \d+ ?% of the papers?'?",
        "a tolerance a test asserts against the papers' counts (tests/test_baselines.py), not a measurement",
    ),
    (
        r"SlurmdTimeout|KillWait|MinJobAge|URG@\d+|SIGURG \d+ s|LOCVIT_RDZV_TIMEOUT",
        "SLURM's documented defaults and the signal lead a site sets are configuration quoted with their names, "
        "not measurements",
    ),
]

GENERATED = (
    re.compile(r"<!-- table: .*?<!-- /table -->", re.S),
    re.compile(r"<!-- value .*?<!-- /value -->", re.S),
    re.compile(r"^```.*?^```", re.S | re.M),
    re.compile(r"`[^`\n]*`"),
)


def docs() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "README.md",
        ROOT / "tests" / "README.md",
    ]


def prose(text: str) -> str:
    """The text with its generated blocks, value spans and code blanked out (line breaks kept)."""
    for pattern in GENERATED:
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return text


def figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) of every figure in ``text``'s prose on a line no allowed pattern matches."""
    allowed = [re.compile(pattern) for pattern, _ in ALLOWED]
    found = []
    for number, (line, raw) in enumerate(zip(prose(text).splitlines(), text.splitlines()), 1):
        if any(p.search(raw) for p in allowed):
            continue
        found += [(number, m.group(0)) for m in FIGURE.finditer(line)]
    return found


def check(paths: list[Path] | None = None) -> list[str]:
    """Every figure outside a file's keeping, as ``path:line: figure``."""
    return [
        f"{path.relative_to(ROOT)}:{line}: {figure}"
        for path in (paths or docs())
        if path.is_file()
        for line, figure in figures(path.read_text())
    ]


def main() -> None:
    found = check()
    for line in found:
        print(line)
    if found:
        print(
            f"{len(found)} figures in prose: put each in a '<!-- value FILE KEY -->' span or a generated table, "
            "or describe without it (doctools/doc_figures.py)",
            file=sys.stderr,
        )
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
