"""Tables shaped like the three papers' (``PAPER_TABLES``, in report order), built from the study's variants.

Each builder returns a ``Table`` or a string saying why the study cannot fill it. Variants are placed by their
profile's ``arch``; one whose profile is missing is named in the notes instead (IBiT's tables fall back to the
model name). MaiT Tables 2-4, LSA Tables 3 and 5, IBiT Tables 3 and 4, and data efficiency by training
fraction. MaiT Table 4, LSA Table 3 and IBiT Tables 3-4 show the paper's own row beside each variant that is a
model of the table on the paper's dataset (``locvit.report.reported``): per number, its value and ours minus
it; IBiT's rows match only a variant whose CutMix setting agrees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from locvit.report.render import Missing, Table
from locvit.report.reported import QUANTITIES, paper_cells, paper_columns, paper_formats, paper_row
from locvit.report.study import PROTOCOL_TEXT, Acc, Study, Variant, masked, missing_text, size_key

ACC_NOTE = (
    "Test top-1 (%): mean ± sample std over seeds (n = seeds found); (Δ [95 % interval], verdict) = the "
    "difference of the mean to the study's baseline variant"
)
SCHEME_ORDER = ("sch1", "sch2", "sch3", "mixed", "all")
SCHEME_NAMES = {"sch1": "Sch.1", "sch2": "Sch.2", "sch3": "Sch.3", "mixed": "mixed", "all": "all heads"}


def _size_labels(keys) -> dict[tuple, str]:
    """``192-d, 12 layers, 3 heads``; the patch size is named only where rows differ in it."""
    show_patch = len({k[3] for k in keys}) > 1
    return {k: f"{k[0]}-d, {k[1]} layers, {k[2]} heads" + (f", patch {k[3]}" if show_patch else "") for k in keys}


def _placed(study: Study, families: tuple[str, ...]) -> tuple[list[Variant], list[str]]:
    """Variants of ``families`` with a profile, and a note for each one without."""
    found, notes = [], []
    for v in study.variants.values():
        if v.family in families:
            if v.arch:
                found.append(v)
            else:
                notes.append(
                    f"not placed: {v.name} ({missing_text(v.name, [], 'profile')}, so its architecture is unknown)"
                )
    return found, notes


def _why(reason: str, notes: list[str]) -> str:
    """Why a table is not written, naming the variants that missing profiles kept out."""
    return reason + "".join(f"; {n}" for n in notes)


def _mask(v: Variant) -> dict | None:
    return v.arch["mask"] if masked(v.arch) else None


def _kernel(mask: dict) -> str:
    return "x".join(map(str, mask["kernel"]))


def _grid(study: Study, name: str, title: str, caption: str, entries: list[tuple], notes: list[str]) -> Table:
    """Rows = model sizes, columns = DeiT then MaiT kinds; each MaiT cell the study's comparison with DeiT of
    its size (``Study.size_reference``).

    ``entries``: (size key, column label, column sort key, variant). Two variants that land
    in one cell get a column each, labelled with their names.
    """
    cells: dict[tuple, list[Variant]] = defaultdict(list)
    sort_of = {}
    for key, label, order, v in entries:
        cells[(key, label)].append(v)
        sort_of[label] = order
    columns: dict[str, tuple] = {}
    placed: dict[tuple, Variant] = {}
    for (key, label), vs in cells.items():
        for v in vs:
            col = label if len(vs) == 1 else f"{label} · {v.name}"
            columns[col] = (sort_of[label], col)
            placed[(key, col)] = v
    cols = sorted(columns, key=lambda c: columns[c])
    keys = sorted({k for k, _ in placed})
    labels = _size_labels(keys)
    rows, sources = [], []
    for key in keys:
        row = [labels[key]]
        for col in cols:
            v = placed.get((key, col))
            ref = study.size_reference(v) if v is not None and not col.startswith("DeiT") else None
            row.append(None if v is None else study.compared(v, ref) if ref else v.acc())
            if v is not None:
                sources.append(f"{labels[key]} / {col}: {v.name}")
        rows.append(row)
    notes = [
        "Test top-1 (%): mean ± sample std over seeds (n = seeds found); (Δ [95 % interval], verdict) = the "
        "difference to DeiT of the same size (the study's comparison: its Holm family is named below).",
        "Cells: " + "; ".join(sources),
    ] + notes
    return Table(name, title, caption, ["Model size"] + cols, rows, notes)


def _mait_rows(study: Study, keep: Callable[[dict], tuple | None]) -> tuple[list[tuple], list[str], int]:
    """Entries of MaiT variants that ``keep`` labels (mask -> (label, sort)), plus DeiT of their sizes."""
    mait, notes = _placed(study, ("mait",))
    deit, deit_notes = _placed(study, ("deit",))
    entries = []
    for v in mait:
        mask = _mask(v)
        kind = keep(mask) if mask else None
        if kind:
            entries.append((size_key(v.arch), kind[0], (1, kind[1]), v))
    sizes = {e[0] for e in entries}
    entries += [(size_key(v.arch), "DeiT", (0, ()), v) for v in deit if size_key(v.arch) in sizes]
    return entries, notes + deit_notes, sum(1 for e in entries if e[1] != "DeiT")


def mait_table2(study: Study) -> Table | str:
    def kind(mask: dict):
        mode = ", restrict" if mask.get("mode") == "restrict" else ""
        if mask["type"] == "hard" and all(h == 1 for h in mask["heads_per_layer"]):
            return f"MaiT({_kernel(mask)}{mode})", (0, mask["kernel"], mode)
        if mask["type"] == "soft":
            return f"MaiT+({_kernel(mask)})", (1, mask["kernel"], mode)
        return None

    entries, notes, n_mait = _mait_rows(study, kind)
    if not n_mait or len(entries) < 2:
        return _why(
            "needs a MaiT variant with one hard-masked head per layer or a soft (MaiT+) variant, and a "
            f"second variant to compare (DeiT of the same size or another MaiT); found {len(entries)}",
            notes,
        )
    caption = (
        "Top-1 by attention-mask shape: DeiT, MaiT with one hard-masked head in every layer (kh x kw "
        "neighbourhood), and MaiT+ with soft masks (learned alpha), per model size."
    )
    return _grid(study, "mait_table2", "MaiT Table 2: top-1 by mask shape", caption, entries, notes)


def scheme_label(mask: dict) -> tuple[str, tuple]:
    """``MaiT(Sch.2)``, ``MaiT(all heads, soft)``, ``MaiT(heads/layer 3-1-0)`` and its sort key."""
    spec = mask.get("masked_heads")
    if isinstance(spec, str) and spec in SCHEME_NAMES:
        name, order = SCHEME_NAMES[spec], SCHEME_ORDER.index(spec)
    else:
        name, order = "heads/layer " + "-".join(map(str, mask["heads_per_layer"])), len(SCHEME_ORDER)
    soft_default = spec == "sch3"
    extras = [] if (mask["type"] == "soft") == soft_default and mask["type"] != "random" else [mask["type"]]
    if tuple(mask["kernel"]) != (3, 3):
        extras.append(_kernel(mask))
    if mask.get("mode") == "restrict":
        extras.append("restrict")
    type_order = {"hard": 0, "random": 1, "soft": 2}[mask["type"]]
    return f"MaiT({', '.join([name] + extras)})", (type_order == 2 and not soft_default, order, type_order, extras)


def mait_table3(study: Study) -> Table | str:
    entries, notes, n_mait = _mait_rows(study, scheme_label)
    if not n_mait or len(entries) < 2:
        return _why(
            "needs a masked MaiT variant and a second variant to compare (DeiT or another scheme); "
            f"found {len(entries)}",
            notes,
        )
    caption = (
        "Top-1 by masking scheme per model size: Sch.1 one hard head in every layer, Sch.2 H-1 heads in the "
        "first third and one in the middle, Sch.3 soft masks in the first 7/8 of the layers, mixed every head "
        "in the first third and one after, custom per-layer lists (e.g. from the ALS search), soft masks last."
    )
    return _grid(study, "mait_table3", "MaiT Table 3: top-1 by masking scheme", caption, entries, notes)


def _params_m(v: Variant):
    n = v.n_params()
    return n / 1e6 if n is not None else Missing(f"{v.name} eval and profile")


def mait_table4(study: Study) -> Table | str:
    variants = list(study.variants.values())
    if not any(v.family in ("mait", "mait_cait") for v in variants) or len(variants) < 2:
        return "needs a MaiT (or masked CaiT) variant and a second variant"
    rows, notes = [], [f"{ACC_NOTE}."]
    ordered = sorted(variants, key=lambda v: (v.n_params() is None, v.n_params() or 0))
    for v in ordered:
        star = "*" if v.arch and v.family.startswith("mait") and v.arch.get("layer_scale") else ""
        profile = v.profile
        rows.append(
            [
                v.name + star,
                v.display,
                v.arch["depth"] if v.arch else Missing(f"{v.name} profile"),
                _params_m(v),
                profile["gmacs"] if profile else Missing(f"{v.name} profile"),
                study.acc(v),
            ]
        )
    if any(row[0].endswith("*") for row in rows):
        notes.append("* = MaiT with LayerScale (MaiT* in the paper).")
    sizes = sorted({tuple(v.profile["input_size"]) for v in variants if v.profile})
    shape = ", ".join("x".join(map(str, s)) for s in sizes) or "the input size (no profile found)"
    notes.append(
        f"GMACs: multiply-accumulates for one image of {shape}, attention matmuls included (the MaiT "
        "paper's 'GFLOPs' are these MACs, as timm counts them)."
    )
    caption = "Layers (attention blocks), parameters, compute and top-1 of every variant of the study, by size."
    header, formats = ["Model", "Family", "Layers", "Params (M)", "GMACs", "Top-1 (%)"], {3: ".3f", 4: ".3f"}
    header, formats = _beside_the_paper(
        study,
        "MaiT",
        ordered,
        rows,
        header,
        formats,
        notes,
        lambda v, row: dict(top1=row[5].mean, params_m=row[3], gflops=row[4]),
    )
    return Table("mait_table4", "MaiT Table 4: layers, params, GMACs, top-1", caption, header, rows, notes, formats)


def _beside_the_paper(
    study: Study,
    paper: str,
    variants: list[Variant],
    rows: list[list],
    header: list[str],
    formats: dict[int, str],
    notes: list[str],
    ours: Callable[[Variant, list], dict],
    table: int | None = None,
):
    """Append ``paper``'s columns to ``rows`` (one per variant, in order) where a variant is a model of the
    paper's tables (of its ``table``, when given) on the study's dataset, trained with the recipe the row names
    (``locvit.report.reported.paper_row``); ``ours(v, row)``: our value of each quantity. Returns the new
    header and formats; nothing changes when no variant matches."""
    found = [
        paper_row(paper, v.model, v.model_kwargs, study.config["data"]["source"], v.fraction, v.recipe, table)
        for v in variants
    ]
    if not any(found):
        return header, formats
    quantities = tuple(q for q, _, _ in QUANTITIES if any(r is not None and r.get(q) is not None for r in found))
    for v, row, match in zip(variants, rows, found):
        mine = ours(v, row)
        row += paper_cells(match, {q: mine.get(q) for q in quantities})
    notes.append(
        f"Paper columns: what the {paper} paper reports for the variant's model on {study.dataset} "
        "(src/locvit/report/papers_reported.yaml names each value's table and row); Δ = ours minus the "
        "paper's (top-1 in points, from the mean over seeds). The paper measured throughput on its own GPU; "
        "its GFLOPs are multiply-accumulates, as our GMACs. '–': not in the paper's table, or not given."
    )
    return header + paper_columns(quantities), {**formats, **paper_formats(len(header), quantities)}


def lsa_table3(study: Study) -> Table | str:
    variants = list(study.variants.values())
    if not any(v.family == "lsa" for v in variants) or len(variants) < 2:
        return "needs an LSA variant and a baseline"
    measured = study.throughput or {}
    devices = sorted({row["device"] for row in measured.values()})
    rows = []
    ordered = sorted(variants, key=lambda v: v.family == "lsa")  # baselines first, as the paper lists them
    for v in ordered:
        row = measured.get(v.name)
        through = Missing(f"{v.name} in report/throughput.csv") if row is None else row["img_s_median"]
        ratio = Missing(f"{v.name} in report/throughput.csv") if row is None else row["ratio_vs_baseline"]
        rows.append([v.name, v.display, _params_m(v), through, ratio, study.acc(v)])
    batch = study.config["profile_batch"]
    head = f"Throughput (img/s, {devices[0]}, batch {batch})" if len(devices) == 1 else "Throughput (img/s)"
    caption = (
        f"Parameters, inference throughput and test accuracy on {study.dataset} of the LSA variants and the "
        "baselines of the study."
    )
    rounds = sorted({row["rounds"] for row in measured.values()})
    note = (
        (
            f"Throughput: inference images/s, the median of {', '.join(map(str, rounds))} rounds in which the "
            "throughput job timed every variant side by side in one process, alone on the machine; the ratio to "
            f"the baseline ({study.baseline or 'none'}) is the median of the rounds' ratios "
            "(report/throughput.csv has each variant's lowest and highest round)."
        )
        if measured
        else "Throughput: report/throughput.csv is missing (the throughput job has not run)."
    )
    notes = [f"{ACC_NOTE}.", note]
    header, formats = _beside_the_paper(
        study,
        "LSA",
        ordered,
        rows,
        ["Method", "Family", "#Params (M)", head, "× baseline", f"{study.dataset} (%)"],
        {2: ".3f", 3: ".1f", 4: ".3f"},
        notes,
        lambda v, row: dict(
            top1=row[5].mean, params_m=row[2], throughput=row[3], gflops=v.profile["gmacs"] if v.profile else None
        ),
    )
    return Table("lsa_table3", f"LSA Table 3: accuracy on {study.dataset}", caption, header, rows, notes, formats)


def lsa_table5(study: Study) -> Table | str:
    lsa, notes = _placed(study, ("lsa",))
    if len(lsa) < 2:
        return _why(f"needs at least two LSA variants with profiles to compare; found {len(lsa)}", notes)
    rows = []
    for v in study.variants.values():  # the nested baseline row first, as in the paper
        if v.family == "nest":
            rows.append([f"baseline {v.name}", 0, None, None, False, _params_m(v), study.acc(v)])
    for v in sorted(lsa, key=lambda v: v.arch["lsa"]["num_shifts"]):
        cfg = v.arch["lsa"]
        shifted = cfg["num_shifts"] > 1  # "none" keeps only the unshifted image: no local block
        rows.append(
            [
                v.name,
                cfg["num_shifts"] if shifted else 0,
                cfg["shift_mode"] if shifted else None,
                cfg["pos_embed"] if shifted else None,
                shifted,
                _params_m(v),
                study.acc(v),
            ]
        )
    caption = (
        "The LSA ablation: number of shifted variants, how they are made (conv = a conv per variant, "
        "translate = pre-shifted images and one conv), positional embedding per variant or shared, and "
        "whether the local block attends over the variants."
    )
    return Table(
        "lsa_table5",
        "LSA Table 5: ablation",
        caption,
        ["Variant", "#Shifting", "Shift mode", "Pos. embed.", "Local block", "#Params (M)", f"{study.dataset} (%)"],
        rows,
        [f"{ACC_NOTE}."] + notes,
        {5: ".3f"},
    )


def ibit_table3(study: Study) -> Table | str:
    order = {"ibit": 0, "deit": 1, "convit": 2}
    chosen = sorted((v for v in study.variants.values() if v.family in order), key=lambda v: order[v.family])
    if not any(v.family == "ibit" for v in chosen) or len(chosen) < 2:
        return "needs an IBiT variant and a DeiT or ConViT variant"
    rows = [[v.display, v.name, study.acc(v), _params_m(v)] for v in chosen]
    caption = "IBiT against DeiT and ConViT: test top-1 and parameters."
    notes = [f"{ACC_NOTE}."]
    header, formats = _beside_the_paper(
        study,
        "IBiT",
        chosen,
        rows,
        ["Model type", "Variant", "Top-1 (%)", "#Params (M)"],
        {3: ".3f"},
        notes,
        lambda v, row: dict(top1=row[2].mean, params_m=row[3]),
        table=3,
    )
    if len(header) > 4:
        notes.append(
            "The paper trains IBiT without CutMix and DeiT with it: an IBiT variant trained with CutMix, "
            "or a DeiT without, has no paper row here (the paper's Table 4 has IBiT with CutMix)."
        )
    return Table("ibit_table3", "IBiT Table 3: IBiT vs DeiT vs ConViT", caption, header, rows, notes, formats)


def ibit_table4(study: Study) -> Table | str:
    chosen = [v for v in study.variants.values() if v.family in ("ibit", "deit")]
    if not any(v.family == "ibit" for v in chosen) or len(chosen) < 2:
        return "needs an IBiT variant and a second IBiT or DeiT variant"
    chosen.sort(key=lambda v: (v.family != "ibit", v.recipe["cutmix"] > 0, v.recipe["mixup"] > 0))
    rows = [
        [
            f"{chr(ord('A') + i)} ({v.display})",
            v.name,
            v.family == "ibit",
            v.recipe["cutmix"] > 0,
            v.recipe["mixup"] > 0,
            study.acc(v),
        ]
        for i, v in enumerate(chosen)
    ]
    caption = (
        "The IBiT ablation: learned masks (IBiT) or plain attention (DeiT), trained with or without "
        "CutMix (and MixUp), from each variant's resolved recipe."
    )
    notes = [f"{ACC_NOTE}."]
    header, formats = _beside_the_paper(
        study,
        "IBiT",
        chosen,
        rows,
        ["Configuration", "Variant", "Learnable masks", "CutMix", "MixUp", "Top-1 (%)"],
        {},
        notes,
        lambda v, row: dict(top1=row[5].mean),
        table=4,
    )
    if len(header) > 6:
        notes.append(
            "The paper's row is the one with the variant's model (learned masks or not) and CutMix (on when "
            "the recipe's cutmix is > 0); the paper's Table 4 says nothing of MixUp, so it is not matched. "
            "Our configuration letters follow our variants, the paper's row its own."
        )
    return Table("ibit_table4", "IBiT Table 4: learned masks and CutMix", caption, header, rows, notes, formats)


def data_efficiency(study: Study) -> Table | str:
    """Test top-1 by training fraction (IBiT's data-fraction runs, MaiT's motivation): one row per
    base variant, one column per fraction, each cell tested against the baseline at that fraction."""
    fractions = study.fractions
    if len(fractions) < 2:
        return "needs variants trained on two or more fractions of the training split (train_fractions)"
    cells = {(v.base, v.fraction): v for v in study.variants.values()}
    bases = list(dict.fromkeys(v.base for v in study.variants.values()))
    rows = [[b] + [study.acc(cells[(b, f)]) if (b, f) in cells else None for f in fractions] for b in bases]
    ref = study.variants[study.baseline].base if study.baseline else None
    caption = (
        "Test top-1 (%) of every variant at each fraction of the training split "
        f"({PROTOCOL_TEXT[study.fraction_protocol]}), "
        "compared with the baseline at the same fraction."
    )
    return Table(
        "data_efficiency",
        f"Data efficiency on {study.dataset}: top-1 by training fraction",
        caption,
        ["Variant"] + [f"{100 * f:g}% of train" for f in fractions],
        rows,
        [
            "Test top-1 (%): mean ± sample std over seeds (n = seeds found); (Δ [95 % interval], verdict) = the "
            f"difference to {ref or 'the baseline'} at the same fraction (one Holm family per fraction)."
        ],
    )


def _spread(values: list[float], key: str) -> str:
    """``mean ± sample std`` of a locality measure over seeds, ALS to 3 decimals and distance (px) to 2."""
    mean = sum(values) / len(values)
    std = (sum((x - mean) ** 2 for x in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {std:.3f}" if key == "als_mean" else f"{mean:.2f} ± {std:.2f}"


def _over_seeds(v: Variant, key: str):
    """``mean ± std`` over seeds of an analysis file's scalar (``als_mean``, ``mad_mean``), or Missing; an ALS the
    kernel makes 1 by construction says so."""
    values = [a[key] for a in v.analyses.values() if a.get(key) is not None]
    if not values:
        if v.analyses and not v.no_locality:  # analysed, with maps, none of which this measure applies to
            return "not applicable to its maps"
        return v.no_locality or Missing(f"{v.name} analysis")
    trivial = key == "als_mean" and any(a.get("als_mean_by_construction") for a in v.analyses.values())
    return _spread(values, key) + (" (by construction)" if trivial else "")


def _first_analysis(v: Variant) -> dict | None:
    return v.analyses[min(v.analyses)] if v.analyses else None


def _scope(v: Variant) -> str:
    """The layers a variant's ALS and distance cells average, in words: all of them, some, or a pyramid's stage."""
    a = _first_analysis(v)
    if not a or "locality_layers" not in a or not a["locality_layers"]:
        return ""
    chosen, stages = set(a["locality_layers"]), a["stages"]
    hit = [k for k, stage in enumerate(stages) if chosen & set(stage["layers"])]
    inside = sum(len(stages[k]["layers"]) for k in hit)
    part = f", {len(chosen)} of their {inside} layers" if len(chosen) < inside else ""
    if len(stages) == 1:
        return f"all {inside} layers" if not part else f"{len(chosen)} of {inside} layers"
    if len(hit) == 1:
        grid = "x".join(map(str, stages[hit[0]]["grid"]))
        return f"stage {hit[0] + 1} of {len(stages)} ({grid} tokens){part}"
    return f"stages {', '.join(str(k + 1) for k in hit)} of {len(stages)}, mean over their layers{part}"


def _not_run_notes(variants: list[Variant]) -> list[str]:
    """A sentence per variant on the analyses over all layers that could not run on its maps, and why."""
    names = {"cross_layer_similarity": "no cross-layer similarity", "rollout": "no attention rollout"}
    notes = []
    for v in variants:
        why = (_first_analysis(v) or {}).get("not_run") or {}
        if why:
            notes.append(f"{v.name}: " + "; ".join(f"{names.get(k, k)}: {w}" for k, w in why.items()) + ".")
    return notes


def locality(study: Study) -> Table | str:
    """Every variant's locality prior, how local its attention is, and its top-1 (any family)."""
    variants = list(study.variants.values())
    if not any(v.analyses for v in variants):
        return "needs analysis files (the analyse step)"
    kernels = sorted({"x".join(map(str, a["als_kernel"])) for v in variants for a in v.analyses.values()})
    rows = [
        [
            v.name,
            v.display,
            v.arch["prior"] if v.arch and "prior" in v.arch else Missing(f"{v.name} profile"),
            _scope(v),
            _over_seeds(v, "als_mean"),
            _over_seeds(v, "mad_mean"),
            study.acc(v),
        ]
        for v in variants
    ]
    caption = (
        "How local each variant's attention is: the Attention Locality Score (MaiT Eq. 3, the share of "
        "a patch's attention inside its neighbourhood) and the mean attention distance in pixels (ViT Fig. 7), "
        "both averaged over the same layers and their heads, named under 'Measured on' (a pyramid's stage, or "
        "the mean over stages); tables/locality_stages.md has every stage. 'By construction': the kernel "
        "covers every key of those layers' attention (a window of 2 in a 3x3 kernel, a 2x2 last stage), so "
        "their ALS is 1, less any share of a class token, whatever the model learned; such layers are measured "
        "only where a variant has no others. A variant without attention layers (a CNN) says so."
    )
    return Table(
        "locality",
        "Locality: ALS and mean attention distance",
        caption,
        [
            "Variant",
            "Family",
            "Locality prior",
            "Measured on",
            f"ALS ({', '.join(kernels)})",
            "Mean attention distance (px)",
            "Top-1 (%)",
        ],
        rows,
        [
            "ALS and distance: mean ± sample std over seeds of each run's mean over the layers named and their "
            "heads, on the analysis images.",
            *_not_run_notes(variants),
            f"{ACC_NOTE}.",
        ],
    )


def locality_stages(study: Study) -> Table | str:
    """ALS and distance of each stage of every variant whose attention layers lie on grids of several sizes."""
    rows = []
    for v in study.variants.values():
        analyses = [a for a in v.analyses.values() if len(a.get("stages") or []) > 1]
        for k, stage in enumerate(analyses[0]["stages"] if analyses else []):
            cells = []
            for key in ("als_mean", "mad_mean"):
                values = [a["stages"][k][key] for a in analyses if a["stages"][k][key] is not None]
                trivial = key == "als_mean" and analyses[0]["stages"][k]["als_by_construction"]
                cells.append(_spread(values, key) + (" (by construction)" if trivial else "") if values else "—")
            rows.append([v.name, f"{k + 1} of {len(analyses[0]['stages'])}", "x".join(map(str, stage["grid"]))])
            rows[-1] += [", ".join(map(str, stage["layers"])), *cells]
    if not rows:
        return "needs a variant whose attention layers lie on token grids of several sizes (a pyramid)"
    return Table(
        "locality_stages",
        "Locality per stage",
        "ALS and mean attention distance of each stage of a pyramid (the layers on one token grid), mean ± sample "
        "std over seeds; '—': no layer of the stage has that measure (keys on a pooled grid have a distance but "
        "no ALS). 'By construction': the kernel covers every key of the stage's attention, so its ALS is 1, "
        "less any share of a class token.",
        ["Variant", "Stage", "Grid (tokens)", "Layers", "ALS", "Mean attention distance (px)"],
        rows,
    )


PAPER_TABLES: dict[str, Callable[[Study], Table | str]] = {
    "locality": locality,
    "locality_stages": locality_stages,
    "mait_table2": mait_table2,
    "mait_table3": mait_table3,
    "mait_table4": mait_table4,
    "lsa_table3": lsa_table3,
    "lsa_table5": lsa_table5,
    "ibit_table3": ibit_table3,
    "ibit_table4": ibit_table4,
    "data_efficiency": data_efficiency,
}


def all_accs(table: Table) -> list[Acc]:
    return [c for row in table.rows for c in row if isinstance(c, Acc)]
