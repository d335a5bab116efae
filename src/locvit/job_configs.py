"""Each job's part of params.yaml, resolved and written to a small file it takes as input.

A job's config file (``<study>/config/``, :meth:`locvit.layout.StudyLayout.job_config`) is
rewritten only when its content changes, so a params change reaches exactly the jobs whose
part changed, through the two records that watch files: Snakemake re-runs a job whose input
is newer than its output (which holds in a fresh clone too, where Snakemake has no record of
past params), and DVC compares the file's hash (the ``configs`` stage writes them, the other
stages depend on their own). Like a source file under make, a param changed and changed back
before its jobs ran still re-runs them.

The training, data, analysis and mask-search jobs read their config file and nothing else of
params.yaml; the report and the throughput job read params.yaml, and their files hold what
they read of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from locvit.io import write_text
from locvit.layout import StudyLayout
from locvit.run_config import run_config, variant_fraction, variant_seeds

#: The analysis section's keys that only the throughput job reads; the others are the analyse jobs'.
THROUGHPUT_KEYS = ("profile_batch", "profile_repeats", "throughput_rounds")


def job_configs(params: dict) -> dict[Path, object]:
    """Every job's resolved config of a validated study, by the file it goes to."""
    layout = StudyLayout.of(params)
    variants = list(params["variants"])
    runs = {(v, s): run_config(params, v, s) for v in variants for s in variant_seeds(params, v)}
    configs: dict[Path, object] = {}
    for fraction in {variant_fraction(params, v) for v in variants}:
        configs[layout.job_config("prepare", layout.data_name(fraction))] = {**params["data"],
                                                                             "train_fraction": fraction}
    for (variant, seed), cfg in runs.items():
        configs[layout.train_config(variant, seed)] = cfg
    configs[layout.job_config("analyse")] = {k: v for k, v in params["analysis"].items() if k not in THROUGHPUT_KEYS}
    # The throughput job measures every variant's model side by side: another model, device or baseline
    # re-runs it, another recipe does not (the same model at random weights).
    first = {v: runs[v, variant_seeds(params, v)[0]] for v in variants}
    configs[layout.job_config("throughput")] = {
        "analysis": {k: params["analysis"][k] for k in THROUGHPUT_KEYS},
        "baseline": params["baseline"],
        "models": {v: {"model": c["model"], "model_kwargs": c["model_kwargs"], "device": c["train"]["device"],
                       "model_modules": c.get("model_modules", [])} for v, c in first.items()},
    }
    configs[layout.job_config("report")] = {
        "study": params["study"], "baseline": params["baseline"],
        "equivalence_margin": params["equivalence_margin"], "data": params["data"],
        "fraction_protocol": params["fraction_protocol"],  # the captions say how the fractions trained
        "variants": params["variants"], "seeds": {v: variant_seeds(params, v) for v in variants},
        "profile_batch": params["analysis"]["profile_batch"], "ui_url": params["tracking"]["ui_url"],
    }
    search = params.get("mask_search")
    if search:
        configs[layout.job_config("search")] = search
        configs[layout.job_config("search_train")] = run_config(params, search["variant"], search["seed"])
    return configs


def encode(config: object) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def write_job_configs(params: dict) -> list[Path]:
    """Write every job's config file whose content changed (atomically); the files written."""
    written = []
    for path, config in job_configs(params).items():
        text = encode(config)
        if not path.is_file() or path.read_text() != text:
            write_text(path, text)
            written.append(path)
    return written
