"""The throughput job's CSV (``report/throughput.csv``): its columns, written and read back.

The throughput job (:mod:`locvit.analysis.throughput`) measures with torch and writes this file;
the report reads it. The format lives here, below both, so that reading it imports neither torch
nor the models (the layers: :mod:`locvit`).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from locvit.errors import InputError, MissingFileError
from locvit.io import write_text

COLUMNS = ("variant", "img_s_median", "img_s_low", "img_s_high", "ratio_vs_baseline", "rounds", "device")


def _format(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_throughput(path: str | Path, rows: list[tuple]) -> None:
    """Write the CSV atomically: one row per variant, ``(variant, median, low, high, ratio or None, rounds,
    device)`` in :data:`COLUMNS`' order."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for variant, median, low, high, ratio, rounds, device in rows:
        writer.writerow([variant, *map(_format, (median, low, high, ratio)), rounds, device])
    write_text(path, text.getvalue())


def read_throughput(path: str | Path) -> dict[str, dict]:
    """The throughput CSV: variant -> row; images/s and the ratio as floats (the ratio None when empty),
    ``rounds`` as int. A missing or corrupt file raises an error naming it."""
    path = Path(path)
    fix = "Delete it and run the throughput job again (snakemake --cores all all)."
    if not path.is_file():
        raise MissingFileError(f"throughput file {path} does not exist. {fix}")

    def corrupt(why: str) -> InputError:
        return InputError(f"throughput file {path} is corrupt ({why}). {fix}")

    try:
        lines = list(csv.reader(path.read_text().splitlines()))
    except (UnicodeDecodeError, csv.Error) as err:
        raise corrupt(str(err)) from err
    if not lines or tuple(lines[0]) != COLUMNS:
        raise corrupt(f"its header is {lines[0] if lines else 'missing'}, expected {list(COLUMNS)}")
    if len(lines) == 1:
        raise corrupt("it has no rows")
    rows = {}
    for n, line in enumerate(lines[1:], start=2):
        if len(line) != len(COLUMNS):
            raise corrupt(f"line {n} has {len(line)} fields, expected {len(COLUMNS)}")
        row = dict(zip(COLUMNS, line))
        try:
            for key in COLUMNS[1:4]:
                row[key] = float(row[key])
            row["ratio_vs_baseline"] = float(row["ratio_vs_baseline"]) if row["ratio_vs_baseline"] else None
            row["rounds"] = int(row["rounds"])
        except ValueError as err:
            raise corrupt(f"line {n}: {err}") from err
        if row["variant"] in rows:
            raise corrupt(f"line {n}: variant {row['variant']!r} appears twice")
        rows[row["variant"]] = row
    return rows
