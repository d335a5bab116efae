"""The papers' reported numbers (``papers_reported.yaml``, package data) and the rows of a study they match.

The paper-shaped tables (``locvit.report.papers``) put a paper's numbers beside each variant that
is the paper's model on the paper's dataset (and, where a row says, trained with or without CutMix as the
paper's): ``paper_row`` finds the row, ``paper_cells`` gives
its cells (the paper's value and ours minus it) for the columns a table shows.
"""

from __future__ import annotations

import functools
from importlib.resources import files

import yaml

from locvit.errors import InputError

#: Keywords that set a model to a dataset or a recipe, not its architecture: a variant that differs from
#: a paper's model only in these is the paper's model (e.g. DeiT-T with 4 x 4 patches at 32 px).
SETTING_KEYS = frozenset(
    {
        "img_size",
        "num_classes",
        "in_chans",
        "patch_size",
        "window_size",
        "drop_rate",
        "drop_path_rate",
        "drop_path_schedule",
        "attn_drop_rate",
        "proj_drop_rate",
        "pos_drop_rate",
    }
)
#: The numbers a row may give, in column order: (key, column label, format of the value and of Δ).
QUANTITIES = (
    ("top1", "top-1 (%)", ".2f"),
    ("params_m", "params (M)", ".2f"),
    ("gflops", "GFLOPs", ".1f"),
    ("throughput", "throughput (img/s)", ".1f"),
)
#: Recipe conditions a row may set: key -> what it means of the variant's recipe (``Variant.recipe``,
#: locvit.config.jobs.REPORT_RECIPE_KEYS). ``cutmix: true``: the row is of a model trained with CutMix (alpha > 0).
RECIPE_FIELDS = {"cutmix": lambda recipe: recipe["cutmix"] > 0}
FIELDS = (
    {"paper", "table", "row", "dataset", "model", "kwargs", "layers"} | {q[0] for q in QUANTITIES} | set(RECIPE_FIELDS)
)


@functools.cache
def reported() -> tuple[dict, ...]:
    """Every row of ``papers_reported.yaml`` (checked: each names its paper, table, row and dataset)."""
    data = yaml.safe_load(files("locvit.report").joinpath("papers_reported.yaml").read_text())
    rows = tuple(data["rows"])
    for i, row in enumerate(rows):
        unknown = set(row) - FIELDS
        if unknown or not {"paper", "table", "row", "dataset"} <= set(row) or row["paper"] not in data["papers"]:
            raise InputError(
                f"papers_reported.yaml: rows[{i}] ({row}): needs paper (one of "
                f"{', '.join(data['papers'])}), table, row and dataset; unknown keys: "
                f"{', '.join(sorted(unknown)) or 'none'}; allowed keys: {', '.join(sorted(FIELDS))}"
            )
        for key in set(RECIPE_FIELDS) & set(row):
            if not isinstance(row[key], bool):
                raise InputError(
                    f"papers_reported.yaml: rows[{i}] ({row['paper']} Table {row['table']}: "
                    f"{row['row']}): {key} must be true or false, not {row[key]!r}"
                )
    return rows


def paper_row(
    paper: str,
    model: str,
    kwargs: dict,
    dataset: str,
    train_fraction: float = 1.0,
    recipe: dict | None = None,
    table: int | None = None,
) -> dict | None:
    """The first row of ``paper`` (of its ``table``, when given) that is ``model`` built with ``kwargs`` on all
    of ``dataset`` (module and data-file docstrings), or None. A row that sets a recipe condition
    (``RECIPE_FIELDS``, e.g. ``cutmix``) matches only a ``recipe`` (the variant's) that meets it; without
    a recipe such a row never matches."""
    if train_fraction < 1:
        return None
    own = {k: v for k, v in kwargs.items() if k not in SETTING_KEYS}
    for row in reported():
        listed = row.get("kwargs") or {}
        if (
            (row["paper"], row["dataset"], row["model"]) == (paper, dataset, model)
            and table in (None, row["table"])
            and all(k in listed and listed[k] == v for k, v in own.items())
            and all(
                recipe is not None and test(recipe) == row[key] for key, test in RECIPE_FIELDS.items() if key in row
            )
        ):
            return row
    return None


def paper_columns(quantities: tuple[str, ...]) -> list[str]:
    """``Paper row``, then per quantity ``Paper <label>`` and ``Δ <label> vs paper``."""
    labels = {key: label for key, label, _ in QUANTITIES}
    return ["Paper row"] + [c for q in quantities for c in (f"Paper {labels[q]}", f"Δ {labels[q]} vs paper")]


def paper_formats(first: int, quantities: tuple[str, ...]) -> dict[int, str]:
    """Column formats of ``paper_columns`` placed from column ``first``: values plain, Δ signed."""
    fmt = {key: f for key, _, f in QUANTITIES}
    out = {}
    for i, q in enumerate(quantities):
        out[first + 1 + 2 * i] = fmt[q]
        out[first + 2 + 2 * i] = "+" + fmt[q]
    return out


def paper_cells(row: dict | None, ours: dict) -> list:
    """The cells of ``paper_columns`` for ``ours`` (quantity -> our value or None, in column order):
    the paper's row (``LSA Table 3: WRN28-10``), each paper value and ours minus it (None where either is
    unknown)."""
    if row is None:
        return [None] * (1 + 2 * len(ours))
    cells = [f"{row['paper']} Table {row['table']}: {row['row']}"]
    for key, value in ours.items():
        theirs = row.get(key)
        cells += [theirs, value - theirs if isinstance(value, (int, float)) and theirs is not None else None]
    return cells
