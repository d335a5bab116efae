"""DVC and Snakemake keeping one record: the files each DVC stage stands for, the commit after a
Snakemake run, and ``locvit pull``.

Each stage in ``dvc.yaml`` runs its Snakemake targets (``snakemake ... $(locvit targets <stage>
[<variant>])``), so Snakemake records what it ran (params, code, inputs per output) whether a
user runs ``snakemake`` or ``dvc repro``: one executor, two records. A Snakemake run of the
study of ``params.yaml`` in a DVC repository ends with ``dvc commit -f`` (the Snakefile's
``onsuccess``, :func:`commit_after_snakemake`), so ``dvc.lock`` holds the hashes of what it
made and ``dvc status`` is clean; inside ``dvc repro`` the stages pass ``dvc_commit=false``
(DVC records the stage itself, and holds the repository's lock).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from locvit.config import variant_seeds
from locvit.errors import InputError, allowed
from locvit.layout import StudyLayout

STAGES = ("prepare", "train", "evaluate", "analyse", "report")
#: The one study dvc.yaml describes: its templating reads params.yaml.
DVC_PARAMS = "params.yaml"


def stage_targets(params: dict, stage: str, variant: str | None = None) -> list[Path]:
    """The Snakemake targets (files) of a DVC stage; ``variant`` for the per-variant stages."""
    layout = StudyLayout.of(params)
    allowed("stage", stage, STAGES)
    if stage in ("train", "evaluate", "analyse") and variant not in params["variants"]:
        raise InputError(f"variant: {variant!r} is not a variant of this study; defined: {', '.join(params['variants'])}")
    seeds = variant_seeds(params, variant) if variant else params["seeds"]
    if stage == "prepare":
        return list(layout.data_files().values())
    if stage == "train":
        return [layout.run_dir(variant, s) / name for s in seeds for name in ("best.pt", "metrics.json")]
    if stage == "evaluate":
        return [layout.eval_file(variant, s) for s in seeds]
    if stage == "analyse":
        return [layout.analysis_file(variant, s) for s in seeds] + [layout.maps_file(variant, s) for s in seeds] + \
            [layout.profile_file(variant)]
    return [layout.report / "results.md", layout.throughput_file]  # the report's stage holds the throughput job


def commit_after_snakemake(params_file: str, enabled: bool = True, root: Path = Path(".")) -> str:
    """``dvc commit -f`` after a Snakemake run of ``params.yaml``'s study in a DVC repository; what was done.

    Nothing for another study file (dvc.yaml does not describe it), outside a DVC repository,
    without a ``dvc`` command, or when ``enabled`` is false (inside ``dvc repro``). A failed
    commit is reported, not fatal: the study's files stand.
    """
    if not enabled:
        return "skipped: dvc_commit=false (a stage of dvc repro: DVC records it)"
    if Path(params_file) != Path(DVC_PARAMS):
        return f"skipped: {params_file} is not {DVC_PARAMS}, the study dvc.yaml describes"
    if not (root / ".dvc").is_dir():
        return "skipped: not a DVC repository"
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    if not Path(dvc).exists() and shutil.which(dvc) is None:
        return "skipped: no dvc command"
    proc = subprocess.run([dvc, "--wait-for-lock", "commit", "--force", "--quiet"], cwd=root, capture_output=True,
                          text=True)
    if proc.returncode:
        return (f"dvc.lock NOT updated (dvc commit failed: {(proc.stderr or proc.stdout).strip()[-800:]}); "
                "run `dvc commit -f` once every stage's outputs exist")
    return "dvc.lock records this run (dvc commit -f); `dvc status`: up to date"


def pull(params_file: str = DVC_PARAMS, root: Path = Path(".")) -> None:
    """``dvc pull``, then ``snakemake --touch all``: the pulled files get Snakemake's order of times.

    DVC restores files with new times in no particular order, and a fresh clone has no
    Snakemake records, so Snakemake (>= 9.18 re-runs a job whose input is newer than its
    output whatever the rerun triggers say) would plan everything again; the contents are
    DVC's, checked by ``dvc status``.
    """
    bin_dir = Path(sys.executable).parent
    for cmd in ([str(bin_dir / "dvc"), "pull"],
                [str(bin_dir / "snakemake"), "--touch", "--cores", "1", "all", "--config", f"params={params_file}",
                 "dvc_commit=false"]):
        proc = subprocess.run(cmd, cwd=root)
        if proc.returncode:
            raise SystemExit(f"locvit pull: `{' '.join(cmd)}` failed (exit {proc.returncode})")
