"""Training batches ready for the model, prepared ahead of the training step.

After FFCV's uint8 batches: RandAugment, normalisation, channels_last, random erasing. With ``ahead`` > 0 a
background thread (and with ``workers`` > 1 a pool) prepares the next batches while the step runs, on the
step's CUDA stream (no synchronisation needed); ``ahead`` = 0 prepares each in the training thread. FFCV
reuses ``batches_ahead + 2`` pinned buffers whose device copies it does not wait for, so taking batches is
``bounded``: the host waits on a CUDA event ring size - 1 batches back (free on a device that keeps up). A
batch's draws depend only on (seed, rank, step), so results are bitwise the same whatever ``ahead``/``workers``.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

_DONE = object()  # the end of the loader's epoch
FFCV_BATCHES_AHEAD = 3  # FFCV Loader's default batches_ahead


def ring_size(loader: Any) -> int:
    """The number of buffers FFCV's loader cycles through (``batches_ahead + 2``), found on ``loader`` or on the
    loader it wraps (``.loader``); FFCV's default where neither says."""
    while loader is not None:
        if hasattr(loader, "batches_ahead"):
            return int(loader.batches_ahead) + 2
        loader = getattr(loader, "loader", None)
    return FFCV_BATCHES_AHEAD + 2


def bounded(loader: Iterable, ring: int | None = None, new_event: Callable[[], Any] | None = None) -> Iterator:
    """``loader``'s batches, taken no further ahead of the device than its buffer ring allows.

    After the consumer is done with a batch (it asks for the next: the batch's kernels are queued) an event
    (``new_event()``, recorded on the current stream) marks it; before batch k is taken, the host waits on batch
    k - (ring - 1)'s (``event.synchronize()``). ``new_event`` None: ``torch.cuda.Event`` where the batches are on
    CUDA, else no events (on the CPU a batch is consumed when the consumer returns). ``ring``: ``ring_size``.
    """
    lag = (ring or ring_size(loader)) - 1
    events: collections.deque = collections.deque()
    batches = iter(loader)
    while True:
        if len(events) >= lag:
            events.popleft().synchronize()  # batch k - lag's kernels (its copy before them) have run
        try:
            batch = next(batches)
        except StopIteration:
            return
        if new_event is None:
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            new_event = torch.cuda.Event if getattr(images, "is_cuda", False) else (lambda: None)
        yield batch
        event = new_event()
        if event is not None:
            event.record()
            events.append(event)


class TrainFeed:
    """Iterate ``loader`` (uint8 (B, 3, H, W), labels) as (x, labels), x the model's float input.

    ``augment``: ``locvit.data.augment.TrainAugment`` or None; ``compute``:
    ``locvit.train.engine.Compute`` (normalisation and memory format); ``first_step``:
    the global step of the epoch's first batch (the augmentations draw from it); ``ahead``
    (``train.feed_ahead``) and ``workers`` (``train.feed_workers``): see the module.
    """

    def __init__(
        self,
        loader: Iterable,
        augment: Any,
        compute: Any,
        mean,
        std,
        first_step: int,
        ahead: int = 2,
        workers: int = 1,
        new_event: Callable[[], Any] | None = None,
    ):
        if ahead < 0:
            raise ValueError(f"train.feed_ahead must be 0 or more batches, not {ahead}")
        if workers < 1:
            raise ValueError(f"train.feed_workers must be 1 or more threads, not {workers}")
        self.loader, self.augment, self.compute = loader, augment, compute
        self.mean, self.std, self.first_step = mean, std, int(first_step)
        self.ahead, self.workers = int(ahead), int(workers)
        self.new_event = new_event  # ``bounded``'s (None: CUDA events where the batches are on CUDA)

    def _batches(self) -> Iterator:
        return bounded(self.loader, ring_size(self.loader), self.new_event)

    def __len__(self) -> int:
        return len(self.loader)

    def prepare(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """One batch: RandAugment on uint8, normalisation (and memory format), random erasing."""
        if self.augment is not None:
            images = self.augment.before_normalise(images, step)
        x = self.compute.inputs(images, self.mean, self.std)
        if self.augment is not None:
            x = self.augment.after_normalise(x, step)
        return x

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.ahead == 0:
            for step, (images, labels) in enumerate(self._batches(), self.first_step):
                yield self.prepare(images, step), labels
            return
        yield from self._ahead()

    def _ahead(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ready: queue.Queue = queue.Queue(maxsize=self.ahead)
        stop = threading.Event()
        threads = torch.get_num_threads()  # a new thread starts with torch's default: give it the run's
        # A new thread's current CUDA device is 0: give it the training thread's (DDP's rank's GPU), whose
        # current stream FFCV's loader synchronises with and the kernels here are queued on.
        cuda = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

        def adopt() -> None:
            torch.set_num_threads(threads)
            if cuda is not None:
                torch.cuda.set_device(cuda)

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        pool = None
        if self.workers > 1:
            pool = ThreadPoolExecutor(self.workers, thread_name_prefix="locvit-feed-pool", initializer=adopt)

        def work() -> None:
            adopt()
            try:
                for step, (images, labels) in enumerate(self._batches(), self.first_step):
                    # FFCV reuses its batch buffers a few batches later: keep no reference to them.
                    # prepare() makes new tensors (a pool's batch is copied first, as it waits); labels are copied.
                    if pool is not None:
                        x = pool.submit(self.prepare, images.clone(), step)
                    else:
                        x = self.prepare(images, step)
                    if not put((x, labels.clone())):
                        return
                put(_DONE)
            except BaseException as err:  # handed to the training thread, which raises it
                put(err)

        worker = threading.Thread(target=work, name="locvit-feed", daemon=True)
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                x, labels = item
                yield (x.result() if isinstance(x, Future) else x), labels
        finally:
            stop.set()  # the consumer stopped early (an error, a break): the worker puts nothing more
            worker.join()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
