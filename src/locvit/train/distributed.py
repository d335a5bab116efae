"""Distributed state from the environment, nanoGPT's way: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK.

One process per GPU (or per CPU slot with gloo). Without those variables there is
one process and every helper here is a no-op, so the training loop reads the same
either way. Every side effect (MLflow, files, printing) is rank 0's; the helpers
below are what the ranks need to agree on numbers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes files, logs to MLflow and prints."""
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        """More than one process: DDP, FFCV's distributed loader, reductions.

        ``torchrun --nproc_per_node 1`` is a plain run (no DDP wrapper), so its data order
        and numbers equal ``python -m locvit``'s.
        """
        return self.world_size > 1


def from_env() -> Dist:
    if int(os.environ.get("RANK", -1)) == -1:
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]))


@contextlib.contextmanager
def distributed() -> Iterator[Dist]:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU); leave it together.

    On success every rank waits at a barrier before leaving, so no rank exits while
    another still needs it. On an error there is no barrier (the others may be stuck
    in a collective): torchrun ends the other processes when one fails.
    """
    state = from_env()
    joined = "RANK" in os.environ and not dist.is_initialized()
    if joined:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(state.local_rank)  # before any collective: NCCL uses the current device
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield state
        barrier(state)
    finally:
        if joined:
            dist.destroy_process_group()


def current() -> Dist:
    """The distributed state of this process; the group must be joined (``distributed``)."""
    state = from_env()
    if state.ddp and not dist.is_initialized():
        raise RuntimeError(
            f"WORLD_SIZE={state.world_size} but no process group was joined; "
            "run through `locvit train` (it joins the group torchrun describes)"
        )
    return state


def barrier(state: Dist) -> None:
    if dist.is_initialized():
        dist.barrier()


def all_sum(values: list[float], state: Dist, device: torch.device) -> list[float]:
    """Element-wise sum over the ranks (float64, so counts stay exact)."""
    if not state.ddp:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)  # NCCL reduces device tensors only
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def gather(obj: Any, state: Dist) -> list[Any]:
    """``obj`` of every rank, in rank order, on every rank (small objects only: pickled)."""
    if not state.ddp:
        return [obj]
    out: list[Any] = [None] * state.world_size
    dist.all_gather_object(out, obj)
    return out


def shard_size(n: int, state: Dist) -> int:
    """Samples of an ``n``-sample split that are really this rank's under FFCV's distributed order.

    FFCV's distributed orders use torch's ``DistributedSampler(drop_last=False)``: it pads
    the order to a multiple of the world size by repeating the first samples and gives
    rank r positions r, r + W, ...; the padded positions (>= n) come last on their
    ranks. So the first ``len(range(r, n, W))`` samples a rank sees are its own, and
    evaluation counts only those: every sample exactly once over all ranks.
    """
    return len(range(state.rank, n, state.world_size))
