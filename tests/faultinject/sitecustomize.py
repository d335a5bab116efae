"""Fault injection for the reliability and cluster tests, installed from outside locvit.

The tests put this folder on PYTHONPATH (``conftest.env_with_venv``), so every Python process
they start (the CLI, Snakemake's jobs, torchrun's workers, SLURM's jobs) imports it at
startup. Unless one of the variables below is set it does nothing; otherwise it patches
locvit's modules as they are imported (nothing in locvit knows about faults):

``LOCVIT_KILL_AT=<point>`` makes the process SIGKILL itself when it reaches that point
(no clean-up, no Python handlers run: as an OOM killer would). ``LOCVIT_HOLD_AT=<point>``
with ``LOCVIT_HOLD_FILE=<path>`` makes it wait there while that file exists, after writing
``<path>.<pid>.json`` (the point, the run folder, the SLURM job id), so a test can preempt
it at a known moment (``scancel``) and then remove the file to let the others go on.
``LOCVIT_STALL_AT=<point>`` with ``LOCVIT_STALL_FILE=<path>`` makes a training process wait
there until it is asked to stop (SIGURG/SIGUSR1, :mod:`locvit.train.state`), then removes the
file, so the resumed run goes on: a job that meets its time limit at a known moment.
``<point>@<text>`` limits any of them to runs whose folder (or file) contains ``<text>``.

Points (``<where>`` is what ``@<text>`` is matched against):

* ``train_step_<n>``: training, right after optimiser step n (counted from 0 over the run),
  in the middle of an epoch (``<where>``: the run folder);
* ``eval_batch_<k>``: scoring batch k of a validation pass (in training: the run folder) or
  of ``locvit evaluate`` (its result files);
* ``after_epoch_<k>``: training, once epoch k's last.pt is written (the run folder);
* ``before_rename_<file name>``: any file written by ``locvit.io.atomic_path``, written in
  full under its temporary name, not yet renamed into place (the file's path);
* ``run_created``: training, once its new MLflow run exists and its id is recorded, before
  the run's params and datasets are logged (the run folder).

``LOCVIT_NAN_AT=<step>[,<step>...]`` makes the model's output, and so the training loss,
NaN at those optimiser steps (counted from 0 over the run), for the numerical-fault tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import time
from pathlib import Path

VARIABLES = ("LOCVIT_KILL_AT", "LOCVIT_HOLD_AT", "LOCVIT_STALL_AT", "LOCVIT_NAN_AT")
_where = {"train": "", "evaluate": ""}  # the run folder being trained, the result files being scored


def _armed(variable: str, name: str, where: str) -> bool:
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    point, _, text = wanted.partition("@")
    return point == name and text in where


def kill_point(name: str, where) -> None:
    if _armed("LOCVIT_KILL_AT", name, str(where)):
        os.kill(os.getpid(), signal.SIGKILL)


def hold_point(name: str, where) -> None:
    if not _armed("LOCVIT_HOLD_AT", name, str(where)):
        return
    hold = Path(os.environ["LOCVIT_HOLD_FILE"])
    if not hold.exists():
        return
    marker = hold.with_name(f"{hold.name}.{os.getpid()}.json")
    marker.write_text(
        json.dumps(
            {"point": name, "where": str(where), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
        )
    )
    print(f"fault injection: holding at {name} while {hold} exists", flush=True)
    while hold.exists():
        time.sleep(0.2)


def stall_point(name: str, where) -> None:
    if not _armed("LOCVIT_STALL_AT", name, str(where)):
        return
    stall = Path(os.environ["LOCVIT_STALL_FILE"])
    if not stall.exists():
        return
    from locvit.train.state import REQUEST

    print(f"fault injection: stalling at {name} until asked to stop", flush=True)
    while not REQUEST.requested and stall.exists():
        time.sleep(0.2)
    stall.unlink(missing_ok=True)  # once: the resumed run goes on


def _nan_steps() -> set[int]:
    return {int(s) for s in os.environ.get("LOCVIT_NAN_AT", "").split(",") if s.strip()}


# The patches, one per locvit module, applied right after the module has run -------------------


def _patch_io(io) -> None:
    rename = io.rename_into_place

    def rename_into_place(tmp, path):
        kill_point(f"before_rename_{Path(path).name}", path)
        return rename(tmp, path)

    io.rename_into_place = rename_into_place


def _counted(loader, where_key: str):
    for k, batch in enumerate(loader):
        kill_point(f"eval_batch_{k}", _where[where_key])
        yield batch


def _patch_loop(loop) -> None:
    train_run, train_one_epoch, evaluate, save_epoch = (
        loop.train_run,
        loop.train_one_epoch,
        loop.evaluate,
        loop.save_epoch,
    )

    def traced_train_run(cfg, train_path, val_path, manifest_path, out_dir, *args, **kwargs):
        _where["train"] = str(out_dir)
        return train_run(cfg, train_path, val_path, manifest_path, out_dir, *args, **kwargs)

    def traced_train_one_epoch(model, loader, optimizer, lr_at, *args, on_step=None, **kwargs):
        nan_at, current = _nan_steps(), {}

        def tracked_lr(step):
            current["step"] = step
            return lr_at(step)

        def after_step(step, ok=None):  # step = optimiser steps done; ok: see engine.train_one_epoch
            if on_step is not None:
                on_step(step, ok)
            kill_point(f"train_step_{step - 1}", _where["train"])
            hold_point(f"train_step_{step - 1}", _where["train"])
            stall_point(f"train_step_{step - 1}", _where["train"])

        handle = (
            model.register_forward_hook(lambda m, a, out: out * float("nan") if current.get("step") in nan_at else None)
            if nan_at
            else None
        )
        try:
            return train_one_epoch(model, loader, optimizer, tracked_lr, *args, on_step=after_step, **kwargs)
        finally:
            if handle is not None:
                handle.remove()

    def traced_evaluate(model, loader, *args, **kwargs):
        return evaluate(model, _counted(loader, "train"), *args, **kwargs)

    def traced_save_epoch(run, p, improved, finished=False, **kwargs):
        save_epoch(run, p, improved, finished, **kwargs)
        if not finished and p.partial is None:  # an epoch's end, not a stop within one
            kill_point(f"after_epoch_{p.epoch - 1}", run.out_dir)
            hold_point(f"after_epoch_{p.epoch - 1}", run.out_dir)

    loop.train_run, loop.train_one_epoch, loop.evaluate, loop.save_epoch = (
        traced_train_run,
        traced_train_one_epoch,
        traced_evaluate,
        traced_save_epoch,
    )


def _patch_evaluate(module) -> None:
    evaluate_checkpoints, evaluate = module.evaluate_checkpoints, module.evaluate

    def traced_evaluate_checkpoints(checkpoints, outs, *args, **kwargs):
        _where["evaluate"] = " ".join(map(str, outs))
        return evaluate_checkpoints(checkpoints, outs, *args, **kwargs)

    def traced_evaluate(model, loader, *args, **kwargs):
        return evaluate(model, _counted(loader, "evaluate"), *args, **kwargs)

    module.evaluate_checkpoints, module.evaluate = traced_evaluate_checkpoints, traced_evaluate


def _patch_tracking_run(module) -> None:
    log_params = module.log_params

    def traced_log_params(run_id, params):
        kill_point("run_created", _where["train"])
        return log_params(run_id, params)

    module.log_params = traced_log_params


PATCHES = {
    "locvit.io": _patch_io,
    "locvit.train.loop": _patch_loop,
    "locvit.train.evaluate": _patch_evaluate,
    "locvit.tracking.run": _patch_tracking_run,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the modules in PATCHES so the patch runs after them."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if any(os.environ.get(v) for v in VARIABLES):
    sys.meta_path.insert(0, _PatchAfterImport())
