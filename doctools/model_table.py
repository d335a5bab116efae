"""Params and GMACs of every locvit entrypoint and of every baseline in the papers' tables, beside the papers'.

Writes ``benchmarks/results/model_table.csv``, which docs/models.md quotes (its
``<!-- table: models ... -->`` block, rendered by doctools/doc_tables.py); tests/test_docs.py
rebuilds the rows and compares them with the file. Each model is built on the meta device (no
memory, no compute) at the setting of the paper's row: locvit's entrypoints at their defaults
(224x224 with 1000 classes, or 32x32 with 10 for the CIFAR models), the CIFAR baselines of LSA's
Table 3 at 32x32 with 10 classes and the keywords shown, the ImageNet baselines at 224x224 with
1000 classes. GMACs as the analyse step counts them (:func:`locvit.analysis.profile.gmacs`) for one
image: matmuls and convolutions, attention matmuls included; element-wise work (softmax, norms,
LSA's per-token attention over its T variants) is not. The baselines' paper numbers come from
``locvit/report/papers_reported.yaml`` (the same numbers the report puts beside a study's rows).

Run from the repository root: ``python -m doctools.model_table`` (about a minute on one CPU).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

import locvit.models  # registers locvit's families; builds as the pipeline does
from locvit.analysis.profile import gmacs
from locvit.io import write_text
from locvit.report.reported import reported

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "model_table.csv"
COLUMNS = ("entrypoint", "keywords", "paper model", "input", "params (M)", "paper params (M)", "GMACs", "paper GFLOPs")

ENTRYPOINTS = {  # locvit's models: name -> (paper model, params and "GFLOPs" (= GMACs) in the paper)
    "mait_xtiny_d24_patch16_224": ("MaiT-XT*, 24 layers, Sch.2 (MaiT Table 4)", "6.3", "1.5"),
    "mait_tiny_patch16_224": ("MaiT-T / MaiT+ (soft, all heads)", "5.7 (DeiT-T)", "1.3 (DeiT-T)"),
    "mait_tiny_d24_patch16_224": ("MaiT-T, 24 layers, Sch.3 (soft) (MaiT Table 4)", "11", "2.5"),
    "mait_tiny_d36_patch16_224": ("MaiT-T, 36 layers, mixed", "-", "-"),
    "mait_xsmall_d24_patch16_224": ("MaiT-XS*, 24 layers, Sch.2 (MaiT Table 4)", "24.5", "5.3"),
    "mait_small_patch16_224": ("MaiT-S / MaiT+ (soft, all heads)", "22 (DeiT-S)", "4.6 (DeiT-S)"),
    "mait_small_d24_patch16_224": ("MaiT-S*, 24 layers, Sch.2 (MaiT Table 4)", "43.3", "9.1"),
    "mait_cait_xxs24_224": ("Masked CaiT-XXS24, Sch.1 (MaiT Table 4)", "12", "2.5"),
    "mait_cait_s24_224": ("Masked CaiT-S24, Sch.1 (MaiT Table 4)", "46.9", "9.4"),
    # LSA: Table 3 (CIFAR, 32x32, no FLOPs given) and Table 4 (ImageNet).
    "lsa_tiny_cifar": ("LSA Our-T, CIFAR (T=18) (LSA Table 3)", "10.2", "-"),
    "lsa_small_cifar": ("LSA Our-S, CIFAR (T=18) (LSA Table 3)", "36.2", "-"),
    "lsa_base_cifar": ("LSA Our-B, CIFAR (T=18) (LSA Table 3)", "115.8", "-"),
    "lsa_tiny_224": ("LSA Our-T, ImageNet (T=10) (LSA Table 4)", "9.9", "3.1"),
    "lsa_small_224": ("LSA Our-S, ImageNet (T=10) (LSA Table 4)", "22.0", "7.6"),
    # IBiT: Table 1 gives "6M" and no FLOPs.
    "ibit_tiny_patch16_224": ("IBiT-Ti, rank-9 learned masks (IBiT Table 1)", "6", "-"),
    "convit_tiny": ("ConViT-Ti (baseline, timm; IBiT Table 1)", "6", "-"),
}

CIFAR, IMAGENET = dict(img_size=32, num_classes=10), dict(img_size=224, num_classes=1000)
BASELINES = [  # (timm name, keywords beyond the setting, (paper, table, row) in papers_reported.yaml)
    # LSA Table 3: CIFAR, 32x32, 10 classes.
    ("pyramidnet164_a48", {}, ("LSA", 3, "Pyramid-164-48")),
    ("wrn_28_10", {}, ("LSA", 3, "WRN28-10")),
    ("deit_tiny_patch16_224", dict(patch_size=4), ("LSA", 3, "Deit-T")),
    ("deit_small_patch16_224", dict(patch_size=4), ("LSA", 3, "Deit-S")),
    ("deit_base_patch16_224", dict(patch_size=4), ("LSA", 3, "Deit-B")),
    ("pvt_v1_tiny", dict(patch_size=1), ("LSA", 3, "PVT-T")),
    ("pvt_v1_small", dict(patch_size=1), ("LSA", 3, "PVT-S")),
    ("pvt_v1_large", dict(patch_size=1), ("LSA", 3, "PVT-B")),
    ("swin_tiny_patch4_window7_224", dict(patch_size=1, window_size=4), ("LSA", 3, "Swin-T")),
    ("swin_small_patch4_window7_224", dict(patch_size=1, window_size=4), ("LSA", 3, "Swin-S")),
    ("swin_base_patch4_window7_224", dict(patch_size=1, window_size=4), ("LSA", 3, "Swin-B")),
    ("nest_tiny_cifar", {}, ("LSA", 3, "Nest-T")),
    # LSA Table 4 and MaiT Table 4: ImageNet, 224x224, 1000 classes.
    ("resnet50", {}, ("LSA", 4, "ResNet-50")),
    ("resnet101", {}, ("LSA", 4, "ResNet-101")),
    ("regnety_040", {}, ("LSA", 4, "RegNetY-4GF")),
    ("regnety_080", {}, ("LSA", 4, "RegNetY-8GF")),
    ("deit_tiny_patch16_224", {}, ("LSA", 4, "Deit-T")),
    ("deit_small_patch16_224", {}, ("LSA", 4, "Deit-S")),
    ("localvit_tiny_patch16_224", {}, ("MaiT", 4, "LocalViT-T")),
    ("localvit_small_patch16_224", {}, ("MaiT", 4, "LocalViT-S")),
    ("pvt_v1_tiny", {}, ("MaiT", 4, "PVT-T")),
    ("pvt_v1_small", {}, ("MaiT", 4, "PVT-S")),
    ("pvt_v1_medium", {}, ("MaiT", 4, "PVT-M")),
    ("swin_tiny_patch4_window7_224", {}, ("MaiT", 4, "Swin-T")),
    ("swin_small_patch4_window7_224", {}, ("MaiT", 4, "Swin-S")),
    ("twins_svt_small", {}, ("MaiT", 4, "Twins-SVT-S")),
    ("twins_svt_base", {}, ("MaiT", 4, "Twins-SVT-B")),
    ("cait_xxs24_224", {}, ("MaiT", 4, "CaiT-T")),
    ("cait_xs24_384", {}, ("MaiT", 4, "CaiT-XS")),
    ("cait_s24_224", {}, ("MaiT", 4, "CaiT-S")),
    ("nest_tiny", {}, ("LSA", 4, "Nest-T")),
    ("tnt_s_patch16_224", {}, ("LSA", 4, "TNT-S")),
]


def _num(x) -> str:
    return "-" if x is None else f"{x:g}"


def _paper(key: tuple) -> dict:
    found = [r for r in reported() if (r["paper"], r["table"], r["row"]) == key]
    if not found:
        raise KeyError(f"{key}: no such row in papers_reported.yaml")
    return found[0]


def _measure(name: str, kwargs: dict) -> tuple[int, float, int]:
    """(params, GMACs, input size) of ``name`` built on the meta device with ``kwargs``."""
    with torch.device("meta"):  # as the pipeline builds it: img_size only to models that take it
        model = locvit.models.create({"model": name, "model_kwargs": kwargs})
    size = kwargs.get("img_size") or model.pretrained_cfg["input_size"][-1]
    return sum(p.numel() for p in model.parameters()), gmacs(model, size), size


def rows() -> list[dict]:
    """The table's rows: locvit's entrypoints, then the baselines (module docstring)."""
    out = []
    for name, (label, params, flops) in ENTRYPOINTS.items():
        n, g, size = _measure(name, {})
        out.append(dict(zip(COLUMNS, (name, "", label, size, f"{n / 1e6:.2f}", params, f"{g:.2f}", flops))))
    for name, kwargs, key in BASELINES:
        paper = _paper(key)
        setting = CIFAR if paper["dataset"].startswith("cifar") else IMAGENET
        n, g, size = _measure(name, {**setting, **kwargs})
        shown = ", ".join(
            f"{k}={v}" for k, v in {**({"num_classes": 10} if setting is CIFAR else {}), **kwargs}.items()
        )
        out.append(
            dict(
                zip(
                    COLUMNS,
                    (
                        name,
                        shown,
                        f"{key[2]} ({key[0]} Table {key[1]})",
                        size,
                        f"{n / 1e6:.2f}",
                        _num(paper.get("params_m")),
                        f"{g:.2f}",
                        _num(paper.get("gflops")),
                    ),
                )
            )
        )
    return out


def as_csv(table: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buffer.getvalue()


def main() -> None:
    write_text(OUT, as_csv(rows()))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
