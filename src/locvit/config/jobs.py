"""Each job's part of params.yaml, resolved and written to a small file it takes as input.

A job's config file (``StudyLayout.job_config``) is rewritten only when its content changes, so a params
change re-runs exactly the jobs whose part changed, in Snakemake (by file times, in a fresh clone too) and DVC
(by hash). A plan (``snakemake -n``) writes none: it reads copies in Snakemake's folder (``write_plan_copies``).
Strict JSON: NaN or infinity is an error. Every job reads its file and nothing else of params.yaml, as a
``locvit.io.JobConfig``, so a key its file lacks fails by name (``tests/test_job_configs.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from locvit.config.run import data_folders, folder_data, run_config, variant_seeds
from locvit.io import write_text
from locvit.layout import StudyLayout

#: The analysis section's keys that only the throughput job reads; the others are the analyse jobs'.
THROUGHPUT_KEYS = ("profile_batch", "profile_repeats", "throughput_rounds")


def job_configs(params: dict) -> dict[Path, object]:
    """Every job's resolved config of a validated study, by the file it goes to."""
    layout = StudyLayout.of(params)
    variants = list(params["variants"])
    runs = {(v, s): run_config(params, v, s) for v in variants for s in variant_seeds(params, v)}
    configs: dict[Path, object] = {}
    for name, (fraction, split_seed) in data_folders(params).items():
        configs[layout.job_config("prepare", name)] = folder_data(params, fraction) | {"split_seed": split_seed}
    for (variant, seed), cfg in runs.items():
        configs[layout.train_config(variant, seed)] = cfg
    configs[layout.job_config("analyse")] = {k: v for k, v in params["analysis"].items() if k not in THROUGHPUT_KEYS}
    configs[layout.job_config("throughput")] = throughput_config(params, runs)
    configs[layout.job_config("report")] = report_config(params, runs)
    search = params.get("mask_search")
    if search:
        configs[layout.job_config("search")] = search
        configs[layout.job_config("search_train")] = run_config(params, search["variant"], search["seed"])
        configs[layout.job_config("search_table")] = search_table_config(params)
    return configs


def _first_runs(params: dict, runs: dict | None) -> dict[str, dict]:
    """Each variant's run config of its first seed (the model, the recipe and the fraction do not depend on it)."""
    return {
        v: (runs or {}).get((v, variant_seeds(params, v)[0])) or run_config(params, v, variant_seeds(params, v)[0])
        for v in params["variants"]
    }


def throughput_config(params: dict, runs: dict | None = None) -> dict:
    """What the throughput job reads (``locvit.analysis.throughput``): its rounds, batch and repeats, the
    baseline and each variant's model on its device, with its run's precision and memory format. Another
    model, device, precision or baseline re-runs it, another recipe otherwise does not (the same model at
    random weights)."""
    return {
        "analysis": {k: params["analysis"][k] for k in THROUGHPUT_KEYS},
        "baseline": params["baseline"],
        "models": {
            v: {
                "model": c["model"],
                "model_kwargs": c["model_kwargs"],
                "device": c["train"]["device"],
                "amp": c["train"]["amp"],
                "channels_last": c["train"]["channels_last"],
                "model_modules": c.get("model_modules", []),
            }
            for v, c in _first_runs(params, runs).items()
        },
    }


#: The recipe keys the report reads of each variant (the IBiT tables' CutMix and MixUp columns).
REPORT_RECIPE_KEYS = ("cutmix", "mixup")


def report_config(params: dict, runs: dict | None = None) -> dict:
    """What the report reads (``locvit.report.study.load_study``): the study, the baseline and margin, the
    dataset's name and fraction, the tracking UI's address, the batch the profiles were measured at, and per
    variant its model, seeds, fraction and the recipe keys its tables show."""
    return {
        "study": params["study"],
        "baseline": params["baseline"],
        "equivalence_margin": params["equivalence_margin"],
        "data": {"source": params["data"]["source"], "train_fraction": params["data"]["train_fraction"]},
        "profile_batch": params["analysis"]["profile_batch"],
        "ui_url": params["tracking"]["ui_url"],
        "fraction_protocol": params["fraction_protocol"],  # the captions say how the fractions trained
        "order": list(params["variants"]),  # the tables' row order: params.yaml's (the file's keys are sorted)
        "variants": {
            v: {
                "model": c["model"],
                "description": params["variants"][v].get("description", ""),
                "seeds": variant_seeds(params, v),
                "train_fraction": c["data"]["train_fraction"],
                "base": params["variants"][v].get("base", v),
                "model_kwargs": c["model_kwargs"],
                "model_modules": c.get("model_modules", []),
                "recipe": {k: c["train"][k] for k in REPORT_RECIPE_KEYS},
            }
            for v, c in _first_runs(params, runs).items()
        },
    }


def search_table_config(params: dict) -> dict:
    """What the mask search's table reads: the study's name and the search's section."""
    return {"study": params["study"], "mask_search": params["mask_search"]}


def encode(config: object) -> str:
    """A config file's text: strict JSON (a NaN or an infinity raises ValueError; validated params hold none)."""
    return json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n"


def changed_job_configs(params: dict) -> dict[Path, str]:
    """The job config files that are missing or hold other content than ``params`` gives them: path -> text.
    Reads only."""
    changed = {}
    for path, config in job_configs(params).items():
        text = encode(config)
        if not path.is_file() or path.read_text() != text:
            changed[path] = text
    return changed


def write_job_configs(params: dict, changed: dict[Path, str] | None = None) -> list[Path]:
    """Write every job's config file whose content changed (atomically; ``changed``: the
    ``changed_job_configs`` of ``params``, when found before); the files written."""
    changed = changed_job_configs(params) if changed is None else changed
    for path, text in changed.items():
        write_text(path, text)
    return list(changed)


def write_plan_copies(changed: dict[Path, str], folder: Path) -> dict[Path, Path]:
    """A plan's copies of the ``changed`` configs (``changed_job_configs``) under ``folder``, which they
    replace: path -> its copy, at the path's place under ``folder``. A plan that takes a changed config from
    its copy (written now: newer than every output) plans the jobs that read it, and leaves the study as it was."""
    shutil.rmtree(folder, ignore_errors=True)
    copies = {}
    for path, text in changed.items():
        copies[path] = folder / Path(path).relative_to(Path(path).anchor)  # results_dir is inside the working dir
        copies[path].parent.mkdir(parents=True, exist_ok=True)
        copies[path].write_text(text)  # a plan's scratch: no need for write_text's atomic rename and fsync
    return copies
