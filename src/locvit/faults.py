"""Fault injection for the reliability and cluster tests: kill or hold a process at a named point.

``LOCVIT_KILL_AT=<point>`` makes the process SIGKILL itself when it reaches that point
(no clean-up, no Python handlers run: as an OOM killer would). ``LOCVIT_HOLD_AT=<point>``
with ``LOCVIT_HOLD_FILE=<path>`` makes it wait there while that file exists, after
writing ``<path>.<pid>.json`` (the point, the run folder, the SLURM job id), so a test
can preempt it at a known moment (``scancel``) and then remove the file to let the
others go on. ``<point>@<text>`` limits either to runs whose folder contains ``<text>``
(e.g. ``after_epoch_1@runs/deit_a/seed0``). Unset, a point costs one dictionary lookup.

Points (``<where>`` is what ``@<text>`` is matched against):

* ``train_step_<n>``: training, right after optimiser step n (counted from 0 over the
  run), in the middle of an epoch (``<where>``: the run folder);
* ``eval_batch_<k>``: scoring batch k of a validation pass (in training: the run folder)
  or of ``locvit evaluate`` (the result file);
* ``after_epoch_<k>``: training, once epoch k's last.pt is written (the run folder);
* ``before_rename_<file name>``: any file written by ``locvit.io.atomic_path`` (a
  checkpoint, an FFCV file, a manifest, a result), written in full under its temporary
  name, not yet renamed into place (the file's path).

``LOCVIT_NAN_AT=<step>[,<step>...]`` turns the training loss of those optimiser steps
(counted from 0 over the run) into NaN, for the numerical-fault tests.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def _armed(variable: str, name: str, where: str) -> bool:
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    point, _, text = wanted.partition("@")
    return point == name and text in where


def kill_point(name: str, where: str | Path = "") -> None:
    if _armed("LOCVIT_KILL_AT", name, str(where)):
        os.kill(os.getpid(), signal.SIGKILL)


def hold_point(name: str, where: str | Path = "") -> None:
    if not _armed("LOCVIT_HOLD_AT", name, str(where)):
        return
    hold = Path(os.environ["LOCVIT_HOLD_FILE"])
    if not hold.exists():
        return
    marker = hold.with_name(f"{hold.name}.{os.getpid()}.json")
    marker.write_text(json.dumps({"point": name, "where": str(where), "pid": os.getpid(),
                                  "slurm_job_id": os.environ.get("SLURM_JOB_ID")}))
    print(f"fault injection: holding at {name} while {hold} exists", flush=True)
    while hold.exists():
        time.sleep(0.2)


def nan_step(step: int) -> bool:
    """Whether LOCVIT_NAN_AT asks for a NaN loss at this training step."""
    wanted = os.environ.get("LOCVIT_NAN_AT")
    return bool(wanted) and str(step) in wanted.split(",")
