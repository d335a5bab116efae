"""Stopping a run at a step boundary when the scheduler asks, so that it resumes exactly.

A SLURM job asks for a warning before its time limit (``sbatch --signal=URG@<seconds>``,
cluster/config.yaml). :func:`listen` makes SIGURG or SIGUSR1 set a flag; the epoch's batches ask it
every ``read_every`` optimiser steps (:class:`locvit.train.engine.EpochBatches`; :meth:`StopRequest.agreed`:
with several processes the flags are summed, so every rank stops after the same step), the loop writes
``last.pt`` with the epoch's position and raises :class:`Stopped`. ``locvit train`` then exits with
:data:`EXIT_STOPPED`; Snakemake's retry (or SLURM's requeue) starts the job again and
the run resumes at that step, as if it had never stopped.
"""

from __future__ import annotations

import signal

from locvit.errors import EXIT_STOPPED, Stopped  # noqa: F401  (raised and exited with here; defined with the errors)

#: The signals that ask a run to stop at its next step boundary. SLURM sends a job step's
#: warning to every process of the step: Snakemake's inner process and the rule's shell
#: too, which SIGUSR1 (default action: terminate) would kill and SIGURG (default: ignore)
#: leaves alone. So the cluster profile asks for SIGURG; SIGUSR1 is for a plain ``kill``.
STOP_SIGNALS = (signal.SIGURG, signal.SIGUSR1)


class StopRequest:
    """Whether one of :data:`STOP_SIGNALS` arrived (set by :func:`listen`'s handler)."""

    def __init__(self) -> None:
        self.requested = False

    def agreed(self, dist, device) -> bool:
        """True on every rank when any rank was asked to stop (one all-reduce per call under DDP)."""
        if not dist.ddp:
            return self.requested
        from locvit.train import distributed

        return distributed.all_sum([float(self.requested)], dist, device)[0] > 0


REQUEST = StopRequest()


def listen() -> None:
    """Let :data:`STOP_SIGNALS` set :data:`REQUEST` (call from the main thread)."""

    def handler(signum, frame) -> None:
        REQUEST.requested = True  # nothing else here: the loop reports it (a print could re-enter one)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
