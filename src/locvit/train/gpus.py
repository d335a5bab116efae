"""A local run's sizes, and each local training job's own GPUs.

Without the cluster profile, training jobs are sized by this machine (``locvit.device.machine``) and
Snakemake runs as many at once as there are GPUs (a ``gpu`` resource). Snakemake does not say which GPU a job
gets, so a job starts through ``python -m locvit.train.gpus [COUNT] -- COMMAND...`` (``CLAIM``, on with
``CLAIM_ENV``): it takes COUNT free GPUs (default: the processes COMMAND starts) by a lock file per GPU, held
until COMMAND and its children exit, sets ``CUDA_VISIBLE_DEVICES`` and runs COMMAND in its place. A shell
expansion, not a rule param, it leaves Snakemake's records the same on every machine.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from locvit.device import visible
from locvit.errors import InputError, configure_logging

log = logging.getLogger(__name__)

#: Seconds between two looks for free GPUs while other jobs (another study's) hold them.
POLL_S = 5.0
#: Set (to 1) in a local run on a machine with GPUs: training jobs then take their GPUs through ``CLAIM``.
CLAIM_ENV = "LOCVIT_CLAIM_GPUS"
#: What a training rule's command starts with: ``python -m locvit.train.gpus --`` where ``CLAIM_ENV`` is
#: set, nothing elsewhere (bash's ``${VAR:+...}``).
CLAIM = f'${{{CLAIM_ENV}:+"$LOCVIT_PYTHON" -m locvit.train.gpus --}}'


def local_resources(sizes: dict, here: dict[str, int]) -> dict[str, int | str | None]:
    """A training job's resources in a local run (the keys of ``locvit.train.launch.slurm_resources``):
    the variant's ``resources`` (locvit.config.run.train_resources) cut to what ``here`` has, on one
    machine (several nodes' GPUs become this machine's), with no time limit."""
    return {
        "nodes": None,
        "gpu": min(sizes["nodes"] * sizes["gpus"], here["gpus"]),
        "gres": None,
        "mpi": None,
        "tasks": None,
        "tasks_per_gpu": None,
        "cpus_per_task": min(sizes["cpus"], here["cpus"]),
        "mem_mb": min(sizes["mem_mb"], here["mem_mb"]),
        "runtime": None,
    }


def lock_dir() -> Path:
    """Where the GPUs' lock files are: one folder per user on this machine."""
    folder = Path(tempfile.gettempdir()) / f"locvit-gpus-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def claim(count: int, devices: list[str], folder: Path, poll_s: float = POLL_S) -> list[tuple[str, int]]:
    """``count`` of ``devices`` that no other process holds, each with its locked file descriptor (the
    lock lasts while a process holds the descriptor); waits while fewer are free."""
    if not 0 < count <= len(devices):
        raise InputError(
            f"gpus: a job of {count} GPU(s) on a machine where this process sees {len(devices)} "
            f"({', '.join(devices) or 'none'}; CUDA_VISIBLE_DEVICES, torch.cuda.device_count)"
        )
    waited = False
    while True:
        held = []
        for device in devices:
            fd = os.open(folder / f"gpu{re.sub(r'[^A-Za-z0-9._-]', '_', device)}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((device, fd))
            if len(held) == count:
                return held
        for _, fd in held:
            os.close(fd)
        if not waited:
            log.info(f"locvit: waiting for {count} of the GPUs {', '.join(devices)}: other jobs hold them")
            waited = True
        time.sleep(poll_s)


def processes(command: list[str]) -> int:
    """How many processes ``command`` starts on this machine: torchrun's ``--nproc_per_node``, else one."""
    for i, arg in enumerate(command):
        if arg in ("--nproc_per_node", "--nproc-per-node") and i + 1 < len(command):
            return int(command[i + 1])
        if arg.startswith(("--nproc_per_node=", "--nproc-per-node=")):
            return int(arg.split("=", 1)[1])
    return 1


def main(argv: list[str] | None = None) -> None:
    """``[COUNT] -- COMMAND...``: run COMMAND on COUNT GPUs of its own (see the module's docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else -1
    if split not in (0, 1) or split == len(argv) - 1 or (split == 1 and not argv[0].isdigit()):
        raise SystemExit("usage: python -m locvit.train.gpus [COUNT] -- COMMAND [ARGS...]")
    command = argv[split + 1 :]
    held = claim(int(argv[0]) if split else processes(command), visible(), lock_dir())
    for _, fd in held:
        os.set_inheritable(fd, True)  # COMMAND (and its children) keep the locks until they exit
    devices = ",".join(device for device, _ in held)
    print(f"locvit: GPU {devices} for this job (CUDA_VISIBLE_DEVICES)", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, {**os.environ, "CUDA_VISIBLE_DEVICES": devices})


if __name__ == "__main__":
    configure_logging()
    main()
