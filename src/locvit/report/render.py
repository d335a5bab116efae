"""One table model written three ways: Markdown (with MLflow links), CSV and LaTeX.

A cell is text, a number, a bool (✓/✗), ``None`` (not applicable: "–"), a
:class:`Missing` (a file the study defines is absent) or an :class:`~locvit.report.study.Acc`
(test top-1 mean ± std over seeds). In the CSV an accuracy column becomes six columns
(mean, std, n, delta, run ids, missing), so the numbers can be read back without parsing.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Callable

from locvit.report.study import Acc, missing_text

# run id -> MLflow UI link, or None where the run's experiment is unknown.
RunLink = Callable[[str], "str | None"]


@dataclass
class Missing:
    """A cell whose input file is absent, e.g. ``Missing("lsa profile")``."""

    what: str = ""

    def __str__(self) -> str:
        return f"missing: {self.what}" if self.what else "missing"


@dataclass
class Table:
    name: str                      # file stem, e.g. "mait_table2"
    title: str                     # "MaiT Table 2: ..."
    caption: str
    header: list[str]
    rows: list[list]
    notes: list[str] = field(default_factory=list)
    formats: dict[int, str] = field(default_factory=dict)   # column -> float format (default ".2f")


def acc_text(acc: Acc, pm: str = "±") -> str:
    """``72.60 ± 0.30 (n=2) (+0.40)``; seeds whose file is absent are named, never filled."""
    if not acc.n:
        return missing_text(acc.variant, acc.missing)
    text = f"{acc.mean:.2f}" + (f" {pm} {acc.std:.2f}" if acc.std is not None else "") + f" (n={acc.n})"
    if acc.delta is not None:
        text += f" ({acc.delta:+.2f})"
    if acc.missing:
        text += f"; {missing_text(acc.variant, acc.missing)}"
    return text


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


def _md_acc(acc: Acc, link: RunLink | None) -> str:
    text = acc_text(acc)
    refs = []
    for seed, run_id in sorted(acc.run_ids.items()):
        url = link(run_id) if link else None
        refs.append(f"[s{seed}]({url})" if url else f"`{run_id[:8]}`")
    return text + (" " + " ".join(refs) if refs else "")


def _numeric_columns(table: Table) -> list[bool]:
    """Right-align columns of numbers and accuracies (the first, the row label, never)."""
    kinds = (Acc, Missing, int, float, type(None))
    return [i > 0 and all(isinstance(row[i], kinds) and not isinstance(row[i], bool) for row in table.rows)
            for i in range(len(table.header))]


def to_markdown(table: Table, link: RunLink | None = None) -> str:
    lines = [f"## {table.title}", "", table.caption, "",
             "| " + " | ".join(map(_md_escape, table.header)) + " |",
             "|" + "|".join("---:" if right else "---" for right in _numeric_columns(table)) + "|"]
    for row in table.rows:
        cells = [_md_acc(c, link) if isinstance(c, Acc) else _md_escape(_plain(c, table.formats.get(i, ".2f")))
                 for i, c in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    if table.notes:
        lines += [""] + [f"- {_md_escape(n)}" for n in table.notes]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    acc_cols = {i for row in table.rows for i, c in enumerate(row) if isinstance(c, Acc)}
    header = []
    for i, name in enumerate(table.header):
        header += ([name, f"{name} std", f"{name} n", f"{name} delta", f"{name} mlflow_run_ids", f"{name} missing"]
                   if i in acc_cols else [name])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out = []
        for i, c in enumerate(row):
            if isinstance(c, Acc):
                out += [c.mean, c.std, c.n, c.delta, " ".join(c.run_ids[s] for s in sorted(c.run_ids)),
                        missing_text(c.variant, c.missing) if c.missing else ""]
            elif i in acc_cols:  # an accuracy column with a non-accuracy cell (e.g. none in this row)
                out += [None if c is None else str(c), None, None, None, None, None]
            else:
                out.append("yes" if c is True else "no" if c is False else str(c) if isinstance(c, Missing) else c)
        writer.writerow(["" if v is None else v for v in out])
    return buf.getvalue()


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "×": r"$\times$",
        "–": "--", "✓": r"\checkmark{}", "✗": r"$\times$", "·": r"$\cdot$"}


def tex_escape(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def to_latex(table: Table) -> str:
    cols = "".join("r" if right else "l" for right in _numeric_columns(table))
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{tex_escape(table.title)}. {tex_escape(table.caption)}}}",
             rf"\label{{tab:{table.name.replace('_', '-')}}}", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
             " & ".join(tex_escape(h) for h in table.header) + r" \\", r"\midrule"]
    for row in table.rows:
        cells = [tex_escape(acc_text(c) if isinstance(c, Acc) else _plain(c, table.formats.get(i, ".2f")))
                 for i, c in enumerate(row)]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines += [r"\par\smallskip\footnotesize", r" \\ ".join(tex_escape(n) for n in table.notes)]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
