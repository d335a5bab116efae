"""The report's figures: PNG always, PDF too for the paper-style ones, each with a caption.

Drawn on matplotlib ``Figure`` objects with the Agg canvas (no pyplot, no global state) and saved atomically.
Per study: training curves, accuracy against depth (MaiT Fig. 4) and training fraction (IBiT Fig. 4). Per
variant: ALS (MaiT Fig. 3), cross-layer similarity (MaiT Figs. 7-9), rollout (IBiT Fig. 5) and each family
``Extra``. A builder returns a ``FigureFile`` or None (nothing to draw); captions name missing seeds.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from locvit.io import atomic_path
from locvit.report.papers import scheme_label
from locvit.report.study import PROTOCOL_TEXT, Study, Variant, missing_text

if TYPE_CHECKING:
    from locvit.models.family import Extra


@dataclass
class FigureFile:
    name: str
    caption: str
    png: Path
    pdf: Path | None = None
    variant: str | None = None  # set for per-variant figures (logged to that variant's MLflow runs)


def save(fig: Figure, out_dir: Path, name: str, caption: str, pdf: bool, variant: str | None = None) -> FigureFile:
    """Write ``<name>.png`` (and ``../pdf/<name>.pdf``) atomically: a temporary file, then a rename.

    The PNGs have ``out_dir`` to themselves: it is what ``dvc plots show`` and the
    Snakemake HTML report read, and both take every file in it for a figure.
    """
    paths = {}
    for fmt in ("png", "pdf") if pdf else ("png",):
        paths[fmt] = (out_dir if fmt == "png" else out_dir.parent / "pdf") / f"{name}.{fmt}"
        with atomic_path(paths[fmt]) as tmp:
            fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight")
    return FigureFile(name, caption, paths["png"], paths.get("pdf"), variant)


def _seeds_note(v: Variant, found: list[int]) -> str:
    missing = [s for s in v.seeds if s not in found]
    return f" ({missing_text(v.name, missing)})" if missing else ""


def _heatmap(fig: Figure, ax, data: np.ndarray, xlabels, ylabels, vmin=0.0, vmax=1.0, annotate=None):
    cmap = colormaps["viridis"].with_extremes(bad="lightgrey")
    image = ax.imshow(
        np.ma.masked_invalid(data), vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto", interpolation="nearest"
    )
    step = max(1, len(ylabels) // 12)
    ax.set_yticks(range(0, len(ylabels), step), [ylabels[i] for i in range(0, len(ylabels), step)])
    xstep = max(1, len(xlabels) // 12)
    ax.set_xticks(range(0, len(xlabels), xstep), [xlabels[i] for i in range(0, len(xlabels), xstep)])
    if annotate if annotate is not None else data.size <= 64:
        for (i, j), value in np.ndenumerate(data):
            if np.isfinite(value):
                ax.text(
                    j,
                    i,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if value < (vmin + vmax) / 2 else "black",
                )
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def _stack(arrays: list[np.ndarray]) -> np.ndarray | None:
    """Mean over seeds, NaN-aware; None when seeds disagree in shape (a changed model)."""
    if not arrays or len({a.shape for a in arrays}) != 1:
        return None
    stacked = np.stack(arrays)
    if not np.isfinite(stacked).any():
        return None
    with warnings.catch_warnings():  # an entry absent in every seed stays NaN (drawn grey)
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stacked, axis=0)


def _ragged(rows: list) -> np.ndarray:
    """[[float|None per head] or None per layer] -> (L, max heads) with NaN for absent entries."""
    width = max((len(r) for r in rows if r), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        for j, value in enumerate(r or []):
            out[i, j] = np.nan if value is None else value
    return out


def curves(study: Study, out_dir: Path) -> FigureFile | None:
    """Train loss and val top-1 per epoch: seeds as thin lines, their mean thick."""
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    palette = colormaps["tab10" if len(study.variants) <= 10 else "tab20"]
    missing, drawn = [], False
    for i, v in enumerate(study.variants.values()):
        color = palette(i % palette.N)
        missing += [missing_text(v.name, v.missing(v.metrics))] if v.missing(v.metrics) else []
        histories = [v.metrics[s]["history"] for s in sorted(v.metrics)]
        for ax, key, scale in ((axes[0], "train_loss", 1.0), (axes[1], "val_top1", 100.0)):
            runs = [([h["epoch"] for h in hist], [scale * h[key] for h in hist]) for hist in histories if hist]
            for x, y in runs:
                ax.plot(x, y, color=color, lw=0.7, alpha=0.5)
            if runs:
                n = min(len(x) for x, _ in runs)  # mean over the epochs every seed reached
                ax.plot(
                    runs[0][0][:n],
                    np.mean([y[:n] for _, y in runs], axis=0),
                    color=color,
                    lw=2,
                    label=f"{v.name} (n={len(runs)})" if key == "train_loss" else None,
                )
                drawn = True
    if not drawn:
        return None
    axes[0].set(xlabel="epoch", ylabel="train loss", title="Training loss")
    axes[1].set(xlabel="epoch", ylabel="val top-1 (%)", title="Validation top-1")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(loc="center left", bbox_to_anchor=(0.9, 0.5), fontsize=8)
    caption = (
        f"Training curves of study {study.name}: training loss and validation top-1 per epoch for every "
        "variant; thin lines are single seeds, thick lines their mean."
    )
    if missing:
        caption += " Not drawn: " + "; ".join(missing) + "."
    return save(fig, out_dir, "curves", caption, pdf=False)


def als(v: Variant, out_dir: Path) -> FigureFile | None:
    """ALS per layer x head, mean over seeds (MaiT Fig. 3); grey = head absent, layers without a grid skipped."""
    found, arrays, labels = [], [], None
    for seed in sorted(v.analyses):
        a = v.analyses[seed]
        keep = [i for i, row in enumerate(a["als"]) if row is not None]
        if not keep:
            continue
        arrays.append(_ragged([a["als"][i] for i in keep]))
        labels = [str(a["layers"][i].get("layer", i)) if i < len(a["layers"]) else str(i) for i in keep]
        found.append(seed)
    data = _stack(arrays)
    if data is None:
        return None
    fig = Figure(figsize=(1.2 + 0.7 * data.shape[1], 1.0 + 0.35 * data.shape[0]))
    ax = fig.subplots()
    _heatmap(fig, ax, data, [f"head {h}" for h in range(data.shape[1])], labels)
    ax.set(xlabel="head", ylabel="layer", title=f"ALS: {v.name}")
    caption = (
        f"Attention Locality Score of {v.name} per layer and head (MaiT Eq. 3, Fig. 3): the share of each "
        f"patch's attention inside its {'x'.join(map(str, v.analyses[found[0]]['als_kernel']))} "
        f"neighbourhood, mean over seeds {', '.join(map(str, found))}{_seeds_note(v, found)}. Layers "
        "without a patch grid (class attention, shift blocks) are left out."
    )
    return save(fig, out_dir, f"als_{v.name}", caption, pdf=True, variant=v.name)


def similarity(v: Variant, out_dir: Path) -> FigureFile | None:
    """Cross-layer attention similarity, one L' x L' map per head, mean over seeds (MaiT Figs. 7-9)."""
    found, arrays, layers = [], [], None
    for seed in sorted(v.analyses):
        a = v.analyses[seed]
        if a.get("cross_layer_similarity") is not None:
            arrays.append(np.asarray(a["cross_layer_similarity"], dtype=float))
            layers = [str(i) for i in a["als_layers"]]
            found.append(seed)
    data = _stack(arrays)
    if data is None:
        return None
    heads, n = data.shape[0], data.shape[1]
    labels = layers if len(layers) == n else [str(i) for i in range(n)]
    fig = Figure(figsize=(4.2 * heads, 3.6))
    for h, ax in enumerate(np.atleast_1d(fig.subplots(1, heads, gridspec_kw={"wspace": 0.35}))):
        _heatmap(fig, ax, data[h], labels, labels, annotate=False)
        ax.set(xlabel="layer", ylabel="layer" if h == 0 else None, title=f"head {h}")
    fig.suptitle(f"Cross-layer attention similarity: {v.name}", y=1.03)
    caption = (
        f"Cross-layer similarity of {v.name} per head (MaiT Eq. 5, Figs. 7-9): cosine similarity of the "
        "attention rows of two layers, averaged over tokens and images; mean over seeds "
        f"{', '.join(map(str, found))}{_seeds_note(v, found)}."
    )
    return save(fig, out_dir, f"similarity_{v.name}", caption, pdf=True, variant=v.name)


def _first_npz_with(v: Variant, key: str) -> tuple[int, dict] | None:
    for seed in sorted(v.npz):
        with np.load(v.npz[seed], allow_pickle=False) as data:
            if key in data.files:
                return seed, {k: data[k] for k in data.files}
    return None


def rollout(v: Variant, out_dir: Path, max_images: int = 8) -> FigureFile | None:
    """Attention rollout over the evaluation images (IBiT Fig. 5): images above, overlays below."""
    hit = _first_npz_with(v, "rollout")
    if hit is None:
        return None
    seed, data = hit
    images, maps = data["images"][:max_images], data["rollout"][:max_images]
    fig = Figure(figsize=(1.6 * len(images), 3.4))
    axes = np.asarray(fig.subplots(2, len(images), squeeze=False))
    for i, (img, m) in enumerate(zip(images, maps)):
        h, w = img.shape[:2]
        axes[0, i].imshow(img)
        axes[1, i].imshow(img)
        axes[1, i].imshow(
            m / max(float(m.max()), 1e-12),
            cmap="jet",
            alpha=0.5,
            vmin=0,
            vmax=1,
            extent=(-0.5, w - 0.5, h - 0.5, -0.5),
            interpolation="bilinear",
        )
        for ax in axes[:, i]:
            ax.set_axis_off()
    fig.suptitle(f"Attention rollout: {v.name}, seed {seed}")
    caption = (
        f"Attention rollout of {v.name} (seed {seed}) on {len(images)} evaluation images (IBiT Fig. 5): "
        "the class token's attention propagated through the layers, upsampled to the image and scaled to "
        "its maximum per image."
    )
    return save(fig, out_dir, f"rollout_{v.name}", caption, pdf=True, variant=v.name)


def extras(v: Variant, out_dir: Path) -> list[FigureFile]:
    """A figure per extra the variant's family declares (``locvit.models.family.Extra``) and its
    analyses hold: IBiT's learned masks (IBiT Fig. 6), MaiT's soft-mask alphas."""
    if not v.analyses and not v.npz:
        return []  # nothing analysed: no need to look the family up
    drawn = (
        _values(v, extra, out_dir) if extra.shape == "values" else _images(v, extra, out_dir) for extra in v.extras
    )
    return [fig for fig in drawn if fig]


def _values(v: Variant, extra: Extra, out_dir: Path) -> FigureFile | None:
    """An extra of one value per layer and head, mean over seeds; grey = a head without one."""
    found = [s for s in sorted(v.analyses) if v.analyses[s].get(extra.name) is not None]
    data = _stack([_ragged(v.analyses[s][extra.name]) for s in found])
    if data is None:
        return None
    vmin, vmax = extra.limits or (float(np.nanmin(data)), float(np.nanmax(data)))
    fig = Figure(figsize=(1.2 + 0.7 * data.shape[1], 1.0 + 0.35 * data.shape[0]))
    ax = fig.subplots()
    _heatmap(
        fig,
        ax,
        data,
        [f"head {h}" for h in range(data.shape[1])],
        [str(i) for i in range(data.shape[0])],
        vmin=vmin,
        vmax=vmax,
    )
    ax.set(xlabel="head", ylabel="layer", title=f"{extra.title}: {v.name}")
    caption = (
        f"{extra.caption} of {v.name} per layer and head, mean over seeds {', '.join(map(str, found))}"
        f"{_seeds_note(v, found)}; grey = a head without one."
    )
    return save(fig, out_dir, f"{extra.name}_{v.name}", caption, pdf=extra.pdf, variant=v.name)


def _images(v: Variant, extra: Extra, out_dir: Path) -> FigureFile | None:
    """An extra of one map per layer and head (the first seed that has it): layer x head panels."""
    hit = _first_npz_with(v, extra.name)
    if hit is None:
        return None
    seed, data = hit
    maps = data[extra.name]  # (L, H, gh, gw)
    layers, heads = maps.shape[:2]
    fig = Figure(figsize=(1.5 * heads + 0.5, 1.4 * layers + 0.5))
    axes = np.asarray(fig.subplots(layers, heads, squeeze=False))
    for (i, j), ax in np.ndenumerate(axes):
        ax.imshow(maps[i, j], cmap="viridis", interpolation="nearest")
        ax.set_xticks([]), ax.set_yticks([])
        if i == 0:
            ax.set_title(f"head {j}", fontsize=8)
        if j == 0:
            ax.set_ylabel(f"layer {i}", fontsize=8)
    fig.suptitle(f"{extra.title}: {v.name}, seed {seed}")
    caption = f"{extra.caption} of {v.name} (seed {seed}), per layer and head; each map has its own colour scale."
    return save(fig, out_dir, f"{extra.name}_{v.name}", caption, pdf=extra.pdf, variant=v.name)


def attention_distance(study: Study, out_dir: Path) -> FigureFile | None:
    """Mean attention distance per layer (ViT Fig. 7), one line per variant: mean over heads, then seeds."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    drawn = []
    for v in study.variants.values():
        per_seed = {}
        for seed, a in sorted(v.analyses.items()):
            layers = {i: float(np.mean(heads)) for i, heads in enumerate(a.get("mad") or []) if heads is not None}
            if layers:
                per_seed[seed] = layers
        if not per_seed:
            continue
        layers = sorted(set.intersection(*(set(d) for d in per_seed.values())))
        values = np.array([[d[i] for i in layers] for d in per_seed.values()])  # (seeds, layers)
        mean = values.mean(0)
        ax.plot(layers, mean, marker="o", markersize=3, label=f"{v.name} ({v.display})")
        if len(values) > 1:
            std = values.std(0, ddof=1)
            ax.fill_between(layers, mean - std, mean + std, alpha=0.15)
        drawn.append(v.name)
    if not drawn:
        return None
    ax.set(
        xlabel="attention layer (forward order)",
        ylabel="mean attention distance (px)",
        title=f"Mean attention distance per layer: {study.name}",
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    none = {v.name: v.no_locality for v in study.variants.values() if v.name not in drawn and v.no_locality}
    left = [v.name for v in study.variants.values() if v.name not in drawn and v.name not in none]
    caption = (
        f"Mean attention distance per layer in study {study.name} (ViT Fig. 7; Raghu et al. 2021): the "
        "attention-weighted mean distance in pixels between a query patch and the patches it attends to, "
        "mean over heads and analysis images, then over seeds (band: ± sample std over seeds). Layers "
        "without a patch grid (class attention, LSA's shift blocks) are left out."
    )
    for why in sorted(set(none.values())):
        caption += f" {why[0].upper()}{why[1:]}: " + ", ".join(n for n, w in none.items() if w == why) + "."
    if left:
        caption += " No analysis: " + ", ".join(left) + "."
    return save(fig, out_dir, "attention_distance", caption, pdf=True)


def _series(v: Variant) -> str:
    label = v.display
    mask = v.arch.get("mask")
    if mask:  # a masked family (MaiT, masked CaiT): its scheme names the line
        label = scheme_label(mask)[0].replace("MaiT", label, 1)
    return f"{label}, {v.arch['embed_dim']}-d"


def accuracy_vs_depth(study: Study, out_dir: Path) -> FigureFile | None:
    """Top-1 against depth (MaiT Fig. 4) of the families the study ran at two or more depths."""
    points = [(v, v.acc()) for v in study.variants.values() if v.arch and v.acc().n]
    depths = defaultdict(set)
    for v, _ in points:
        depths[v.family].add(v.arch["depth"])
    families = {f for f, d in depths.items() if len(d) > 1}
    names = {v.family: v.display for v, _ in points}
    if not families:
        return None
    series = defaultdict(list)
    for v, acc in points:
        if v.family in families:
            series[_series(v)].append((v.arch["depth"], acc))
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, pts in sorted(series.items()):
        pts.sort(key=lambda p: p[0])
        ax.errorbar(
            [d for d, _ in pts],
            [a.mean for _, a in pts],
            yerr=[a.std or 0.0 for _, a in pts],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set(xlabel="depth (attention blocks)", ylabel="test top-1 (%)", title=f"Top-1 against depth: {study.name}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    caption = (
        f"Test top-1 against depth in study {study.name} (MaiT Fig. 4): mean ± std over seeds, one line "
        "per family, masking scheme and width, for the families run at several depths ("
        + ", ".join(names[f] for f in sorted(families))
        + "). Variants without a profile or "
        "an evaluation are left out."
    )
    return save(fig, out_dir, "accuracy_vs_depth", caption, pdf=True)


def accuracy_vs_fraction(studies: list[Study], out_dir: Path) -> FigureFile | None:
    """Top-1 against the training-set fraction (IBiT Fig. 4): one line per base variant, over the
    fractions its copies trained on (train_fractions) and over other studies' data.train_fraction."""
    series = defaultdict(dict)
    for s in studies:
        for v in s.variants.values():
            if (acc := v.acc()).n:
                series[v.base].setdefault(100 * v.fraction, acc)
    series = {k: sorted(p.items()) for k, p in series.items() if len(p) > 1}
    if not series:
        return None
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for name, pts in series.items():
        summaries = [a.summary for _, a in pts]
        err = [
            [s.mean - s.ci_low if s.ci_low is not None else 0.0 for s in summaries],  # Wilson's: asymmetric
            [s.ci_high - s.mean if s.ci_high is not None else 0.0 for s in summaries],
        ]
        ax.errorbar(
            [x for x, _ in pts],
            [s.mean for s in summaries],
            yerr=err,
            marker="o",
            capsize=3,
            label=f"{name} (n={min(s.n for s in summaries)})",
        )
    ax.set(
        xlabel="training images (% of the training split)",
        ylabel="test top-1 (%)",
        title="Top-1 against training-set fraction",
        ylim=(0, 100),
    )
    ax.legend(fontsize=8, loc="lower right")
    names = ", ".join(s.name for s in studies)
    kinds = {s.fraction_protocol for s in studies}  # how each study trained its fractions
    how = (
        PROTOCOL_TEXT[kinds.pop()]
        if len(kinds) == 1
        else "; ".join(f"{s.name}: {PROTOCOL_TEXT[s.fraction_protocol]}" for s in studies)
    )
    caption = (
        "Test top-1 against the fraction of training images kept (IBiT Fig. 4), one line per variant: mean "
        "over seeds with its 95 % interval as error bars (n = seeds; inside 0-100 %, docs/statistics.md). "
        f"{how[0].upper()}{how[1:]}. "
        f"Studies: {names}."
    )
    return save(fig, out_dir, "accuracy_vs_fraction", caption, pdf=True)


VARIANT_FIGURES = (als, similarity, rollout)  # and the family's own: extras(v, out_dir)
