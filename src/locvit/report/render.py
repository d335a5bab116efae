"""One table model, rendered as Markdown (with MLflow links), CSV and LaTeX: every table locvit writes.

A cell is text, a number, a bool (✓/✗), ``None`` ("–"), a ``Missing`` file or an ``Acc`` (test top-1 over
seeds, maybe compared with a reference, its numbers set once by ``Study.comparisons``: one Holm family per
reference, so a comparison reads the same in every table). An accuracy cell is compact
(``97.10 ± 0.50 (n=3) (+1.20 [-0.50, +2.90], undecided)``) or, in a ``detail`` table, columns; in the CSV
always numeric columns (``acc_csv_names``), read back without parsing.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from locvit.report import stats
from locvit.report.study import Acc, missing_text

# run id -> MLflow UI link, or None where the run's experiment is unknown.
RunLink = Callable[[str], "str | None"]
# What an accuracy cell holds, in the CSV order of the papers' tables (their names: acc_csv_names).
ACC_FIELDS = (
    "mean",
    "std",
    "n_seeds",
    "ci95_low",
    "ci95_high",
    "reference",
    "delta_vs_baseline",
    "delta_ci95_low",
    "delta_ci95_high",
    "p_vs_baseline",
    "p_holm",
    "p_equivalence_holm",
    "mde80",
    "verdict",
    "mlflow_run_ids",
    "missing_seeds",
    "delta_ci90_low",
    "delta_ci90_high",
    "equivalence_margin_min",
    "p_improvement",
    "within_margin",
    "holm_family",
)


def points(x: float) -> str:
    """``1 point``, ``0.5 points``."""
    return f"{x:g} point" + ("" if x == 1 else "s")


def verdicts_note(families: dict[str, int], margin: float | None) -> str:
    """What the verdicts mean and which Holm families the table's comparisons belong to."""
    groups = "; ".join(f"{ref} ({m} comparison{'s' if m != 1 else ''})" for ref, m in families.items())
    within = f"± {points(margin)}" if margin is not None else "± the margin"
    return (
        f"Δ: difference of the means to the reference with its 95 % interval (seeds and the shared test images, "
        f"each counted once); verdict: better/worse = the t-test below {stats.ALPHA:g} after Holm's correction, "
        f"equivalent = within {within} by two one-sided tests after Holm's (they read the 90 % interval, shown "
        f"as 90 %: an equivalent row's lies inside {within}), else undecided; "
        f"'(within {within})' marks a difference shown that is also inside the margin. MDE: the smallest "
        "difference the comparison could detect with 80 % power at Holm's strictest level; min. margin: the "
        "smallest margin it could show equivalence within, at the estimated standard error; P(>ref): the share "
        "of seed pairs in which the variant beats the reference (ties ½), without an interval (no standard one "
        "holds its coverage at a few seeds, docs/statistics.md). MDE over 100 points: no difference is "
        "detectable. Holm families (the "
        f"comparisons against one reference, over the whole study): {groups}."
    )


@dataclass
class Missing:
    """A cell whose input file is absent, e.g. ``Missing("lsa profile")``."""

    what: str = ""

    def __str__(self) -> str:
        return f"missing: {self.what}" if self.what else "missing"


@dataclass
class Table:
    name: str  # file stem, e.g. "mait_table2"
    title: str  # "MaiT Table 2: ..."
    caption: str
    header: list[str]
    rows: list[list]
    notes: list[str] = field(default_factory=list)
    formats: dict[int, str] = field(default_factory=dict)  # column -> float format (default ".2f")
    keys: list[str] | None = None  # CSV column names (default: the header)
    detail: bool = False  # accuracy cells as six columns (n, mean ± std, CI, delta, p, Holm p)
    # With one accuracy column: ACC_FIELDS -> CSV column name, in the CSV's order (default: acc_csv_names).
    acc_csv: dict[str, str] | None = None

    def __post_init__(self) -> None:
        """Name the Holm families of the table's compared cells (their numbers come from the study), and
        mark an uncompared cell whose variant is the reference of another ``baseline``."""
        self.rows = [list(row) for row in self.rows]
        compared = [cell for row in self.rows for cell in row if isinstance(cell, Acc) and cell.test is not None]
        families: dict[str, int] = {}
        for cell in compared:
            families.setdefault(cell.reference, cell.family_size or 0)
        for r, row in enumerate(self.rows):
            for c, cell in enumerate(row):
                if isinstance(cell, Acc) and cell.test is None and cell.variant in families:
                    self.rows[r][c] = replace(cell, verdict="baseline")
        if families:
            margins = {cell.test.margin for cell in compared} - {None}
            note = verdicts_note(families, margins.pop() if len(margins) == 1 else None)
            self.notes = [*[n for n in self.notes if not n.startswith("Δ: difference")], note]

    @property
    def acc_columns(self) -> list[int]:
        return [i for i in range(len(self.header)) if any(isinstance(row[i], Acc) for row in self.rows)]


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3g}"


def delta_text(acc: Acc) -> str:
    """``+1.20``: the difference to the reference."""
    return "–" if acc.delta is None else f"{acc.delta:+.2f}"


def delta_ci_text(acc: Acc) -> str:
    """``[-0.50, +2.90]``: the 95 % interval of the difference."""
    t = acc.test
    return "–" if t is None or t.ci_low is None else f"[{t.ci_low:+.2f}, {t.ci_high:+.2f}]"


def delta_ci90_text(acc: Acc) -> str:
    """``[-0.30, +0.70]``: the 90 % interval of the difference (the one two one-sided tests read)."""
    t = acc.test
    return "–" if t is None or t.ci90_low is None else f"[{t.ci90_low:+.2f}, {t.ci90_high:+.2f}]"


def verdict_text(acc: Acc) -> str:
    """``better``, or ``better (within ±1)`` for a difference shown that is also inside the margin."""
    if not acc.verdict:
        return "–"
    if acc.within_margin and acc.test is not None and acc.test.margin is not None:
        return f"{acc.verdict} (within ±{acc.test.margin:g})"
    return acc.verdict


def comparison_text(acc: Acc) -> str:
    """``+1.20 [-0.50, +2.90], undecided``: difference, interval and verdict; an equivalent (or within the
    margin) one adds its 90 % interval: ``+0.10 [-0.60, +0.80], 90 % [-0.45, +0.65], equivalent``."""
    if acc.test is None:
        return ""
    text = delta_text(acc)
    if acc.test.ci_low is not None:
        text += " " + delta_ci_text(acc)
        if acc.verdict == "equivalent" or acc.within_margin:
            text += ", 90 % " + delta_ci90_text(acc)
    return text + (f", {verdict_text(acc)}" if acc.verdict else "")


def acc_text(acc: Acc, pm: str = "±") -> str:
    """``72.60 ± 0.30 (n=2) (+0.40 [-1.10, +1.90], undecided)``; seeds whose file is absent are named, never filled."""
    if not acc.n:
        return missing_text(acc.variant, acc.missing)
    text = f"{acc.mean:.2f}" + (f" {pm} {acc.std:.2f}" if acc.std is not None else "") + f" (n={acc.n})"
    if acc.test is not None:
        text += f" ({comparison_text(acc)})"
    if acc.missing:
        text += f"; {missing_text(acc.variant, acc.missing)}"
    return text


DETAIL_COLUMNS = 12


def _detail_header(name: str, reference: str) -> list[str]:
    return [
        "n",
        name,
        "95% CI",
        f"Δ vs {reference}" if reference else "Δ",
        "Δ 95% CI",
        "Δ 90% CI (TOST)",
        "p (Holm)",
        "MDE",
        "min. margin",
        "P(>ref)",
        "verdict",
        "Holm family",
    ]


def _number(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def mde_text(mde: float | None) -> str:
    """The MDE in points; above 100 points no difference of accuracies is detectable."""
    return "none detectable" if mde is not None and mde > 100 else _number(mde)


def improvement_text(acc: Acc) -> str:
    """``0.89``: the probability of improvement (no interval: ``stats.probability_of_improvement``)."""
    t = acc.test
    return "–" if t is None or t.p_improvement is None else f"{t.p_improvement:.2f}"


def _detail_cells(acc: Acc, pm: str = "±") -> list[str]:
    if not acc.n:
        return ["0", missing_text(acc.variant, acc.missing)] + ["–"] * (DETAIL_COLUMNS - 2)
    s = acc.summary
    mean = f"{s.mean:.2f}" + (f" {pm} {s.std:.2f}" if s.std is not None else "")
    if acc.missing:
        mean += f"; {missing_text(acc.variant, acc.missing)}"
    ci = "–" if s.ci_low is None else f"[{s.ci_low:.2f}, {s.ci_high:.2f}]"
    family = f"{acc.family} ({acc.family_size})" if acc.family else "–"
    return [
        str(s.n),
        mean,
        ci,
        delta_text(acc),
        delta_ci_text(acc),
        delta_ci90_text(acc),
        _p(acc.p_holm),
        mde_text(acc.mde),
        _number(acc.equivalence_bound),
        improvement_text(acc),
        verdict_text(acc),
        family,
    ]


def _plain(cell, fmt: str) -> str:
    if isinstance(cell, bool):
        return "✓" if cell else "✗"
    if cell is None:
        return "–"
    if isinstance(cell, float):
        return format(cell, fmt)
    return str(cell)


def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


def _run_refs(acc: Acc, link: RunLink | None) -> str:
    refs = []
    for seed, run_id in sorted(acc.run_ids.items()):
        url = link(run_id) if link else None
        refs.append(f"[s{seed}]({url})" if url else f"`{run_id[:8]}`")
    return " ".join(refs)


def _numeric_columns(table: Table) -> list[bool]:
    """Right-align columns of numbers and accuracies (the first, the row label, never)."""
    kinds = (Acc, Missing, int, float, type(None))
    return [
        i > 0 and all(isinstance(row[i], kinds) and not isinstance(row[i], bool) for row in table.rows)
        for i in range(len(table.header))
    ]


def _reference(table: Table, column: int) -> str:
    refs = {row[column].reference for row in table.rows if isinstance(row[column], Acc) and row[column].reference}
    return refs.pop() if len(refs) == 1 else ""


def _grid(
    table: Table, pm: str, runs: bool, link: RunLink | None = None
) -> tuple[list[str], list[bool], list[list[str]]]:
    """Header, right-alignment and text cells, with accuracy columns expanded in a ``detail`` table;
    ``runs``: name each cell's MLflow runs (linked where ``link`` knows them)."""
    right, accs = _numeric_columns(table), set(table.acc_columns)
    header, align = [], []
    for i, name in enumerate(table.header):
        if table.detail and i in accs:
            header += _detail_header(name, _reference(table, i)) + (["MLflow runs"] if runs else [])
            align += [True] * (DETAIL_COLUMNS - 2) + [False, False] + ([False] if runs else [])
        else:
            header.append(name)
            align.append(right[i])
    rows = []
    for row in table.rows:
        cells = []
        for i, c in enumerate(row):
            if table.detail and i in accs:
                acc = c if isinstance(c, Acc) else None
                cells += _detail_cells(acc, pm) if acc else ["–"] * DETAIL_COLUMNS
                if runs:
                    cells.append(_run_refs(acc, link) if acc else "")
            elif isinstance(c, Acc):
                refs = _run_refs(c, link) if runs else ""
                cells.append(acc_text(c, pm) + (" " + refs if refs else ""))
            else:
                cells.append(_plain(c, table.formats.get(i, ".2f")))
        rows.append(cells)
    return header, align, rows


def to_markdown(table: Table, link: RunLink | None = None, level: int = 2) -> str:
    """The table as a Markdown section; ``link`` turns run ids into MLflow UI links (without: short ids)."""
    header, align, rows = _grid(table, "±", True, link)
    lines = [
        f"{'#' * level} {table.title}",
        "",
        table.caption,
        "",
        "| " + " | ".join(map(_md_escape, header)) + " |",
        "|" + "|".join("---:" if right else "---" for right in align) + "|",
    ]
    lines += ["| " + " | ".join(map(_md_escape, cells)) + " |" for cells in rows]
    if table.notes:
        lines += [""] + [f"- {_md_escape(n)}" for n in table.notes]
    return "\n".join(lines) + "\n"


def acc_csv_names(table: Table, column: int) -> dict[str, str]:
    """ACC_FIELDS -> CSV column of an accuracy column, in CSV order: the table's ``acc_csv`` where it gives
    one (the results table's contract), else ``<key>`` (the mean), then ``<key> <field>`` (``<key> std``, ...)."""
    if table.acc_csv:
        return dict(table.acc_csv)
    key = (table.keys or table.header)[column]
    suffixes = (
        "",
        " std",
        " n",
        " ci95_low",
        " ci95_high",
        " reference",
        " delta",
        " delta_ci95_low",
        " delta_ci95_high",
        " p",
        " p_holm",
        " p_equivalence_holm",
        " mde80",
        " verdict",
        " mlflow_run_ids",
        " missing",
        " delta_ci90_low",
        " delta_ci90_high",
        " min_margin",
        " p_improvement",
        " within_margin",
        " holm_family",
    )
    return {field: key + suffix for field, suffix in zip(ACC_FIELDS, suffixes)}


def _acc_csv_values(acc: Acc | None, order) -> list:
    """The values of ``ACC_FIELDS`` for one cell, in ``order`` (the fields in CSV order)."""
    if acc is None:
        return [None] * len(order)
    s = acc.summary
    t = acc.test
    values = {
        "n_seeds": acc.n,
        "mean": s.mean if s else None,
        "std": s.std if s else None,
        "ci95_low": s.ci_low if s else None,
        "ci95_high": s.ci_high if s else None,
        "reference": acc.reference,
        "delta_vs_baseline": acc.delta,
        "delta_ci95_low": t.ci_low if t else None,
        "delta_ci95_high": t.ci_high if t else None,
        "p_vs_baseline": t.p if t else None,
        "p_holm": acc.p_holm,
        "p_equivalence_holm": acc.p_equivalent_holm,
        "mde80": acc.mde,
        "verdict": acc.verdict,
        "mlflow_run_ids": " ".join(acc.run_ids[k] for k in sorted(acc.run_ids)),
        "missing_seeds": missing_text(acc.variant, acc.missing) if acc.missing else "",
        "delta_ci90_low": t.ci90_low if t else None,
        "delta_ci90_high": t.ci90_high if t else None,
        "equivalence_margin_min": acc.equivalence_bound,
        "p_improvement": t.p_improvement if t else None,
        "within_margin": ("yes" if acc.within_margin else "no") if t and t.p is not None else None,
        "holm_family": acc.family,
    }
    return [values[f] for f in order]


def to_csv(table: Table) -> str:
    accs = set(table.acc_columns)
    header, fields = [], {}
    for i, name in enumerate(table.keys or table.header):
        if i in accs:
            fields[i] = acc_csv_names(table, i)
            header += fields[i].values()
        else:
            header.append(name)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out = []
        for i, c in enumerate(row):
            if i in accs:
                out += _acc_csv_values(c if isinstance(c, Acc) else None, fields[i])
            else:
                out.append("yes" if c is True else "no" if c is False else str(c) if isinstance(c, Missing) else c)
        writer.writerow(["" if v is None else v for v in out])
    return buf.getvalue()


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "×": r"$\times$",
    "–": "--",
    "Δ": r"$\Delta$",
    "✓": r"\checkmark{}",
    "✗": r"$\times$",
    "·": r"$\cdot$",
}


def tex_escape(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def to_latex(table: Table) -> str:
    header, align, rows = _grid(table, "±", False)
    cols = "".join("r" if right else "l" for right in align)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{tex_escape(table.title)}. {tex_escape(table.caption)}}}",
        rf"\label{{tab:{table.name.replace('_', '-')}}}",
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in header) + r" \\",
        r"\midrule",
    ]
    for cells in rows:
        lines.append(" & ".join(tex_escape(c) for c in cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines += [r"\par\smallskip\footnotesize", r" \\ ".join(tex_escape(n) for n in table.notes)]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
