"""The training feed: batches augmented and normalised ahead of the step, equal to those made inline."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import timm
import torch

from locvit.data.augment import TrainAugment
from locvit.data.feed import TrainFeed
from locvit.train.engine import Compute, EpochStart, train_one_epoch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _batches(n: int, b: int = 8, size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ((torch.rand(b, 3, size, size, generator=g) * 255).to(torch.uint8), torch.randint(0, 10, (b,), generator=g))
        for _ in range(n)
    ]


def _augment() -> TrainAugment:
    return TrainAugment(MEAN, STD, "rand-m9-mstd0.5-inc1", 0.25, seed=3)


class Recording:
    """A loader that notes which thread pulls each batch, and how many it has handed out."""

    def __init__(self, batches, fail_at: int | None = None):
        self.batches, self.fail_at, self.pulled, self.threads = batches, fail_at, 0, set()

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            if i == self.fail_at:
                raise OSError("the data file went away")
            self.threads.add(threading.current_thread().name)
            self.pulled += 1
            yield batch


@pytest.mark.parametrize("ahead, workers", [(1, 1), (3, 1), (2, 2), (3, 3)])
def test_ahead_gives_the_inline_batches_from_another_thread(ahead, workers):
    batches = _batches(6)
    inline = list(TrainFeed(batches, _augment(), Compute(), MEAN, STD, first_step=40, ahead=0))
    loader = Recording(batches)
    early = list(TrainFeed(loader, _augment(), Compute(), MEAN, STD, first_step=40, ahead=ahead, workers=workers))
    assert len(early) == len(inline) == 6
    for (x0, y0), (x1, y1) in zip(inline, early):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert loader.threads == {"locvit-feed"}
    shifted = list(
        TrainFeed(batches[1:], _augment(), Compute(), MEAN, STD, first_step=41, ahead=ahead, workers=workers)
    )
    assert torch.equal(shifted[0][0], inline[1][0])  # batch k at step s is the same tensor however the epoch began


def test_it_prepares_ahead_while_the_step_runs_and_no_further():
    loader = Recording(_batches(8))
    feed = iter(TrainFeed(loader, None, Compute(), MEAN, STD, first_step=0, ahead=2))
    next(feed)
    deadline = time.monotonic() + 10
    while loader.pulled < 4 and time.monotonic() < deadline:  # 1 taken + 2 queued + 1 waiting to be queued
        time.sleep(0.01)
    time.sleep(0.2)
    assert loader.pulled == 4
    feed.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_loader_error_reaches_the_training_thread(workers):
    feed = TrainFeed(
        Recording(_batches(4), fail_at=2), _augment(), Compute(), MEAN, STD, first_step=0, ahead=2, workers=workers
    )
    seen = []
    with pytest.raises(OSError, match="the data file went away"):
        for x, _ in feed:
            seen.append(x)
    assert len(seen) == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_stopping_early_ends_the_worker(workers):
    def ours() -> set:
        return {t for t in threading.enumerate() if t.name.startswith("locvit-feed")}

    before = ours()
    feed = iter(TrainFeed(_batches(20), _augment(), Compute(), MEAN, STD, first_step=0, ahead=2, workers=workers))
    next(feed)
    feed.close()  # what a `for` loop left by an exception does
    assert ours() == before


def test_an_augmentation_error_in_the_pool_reaches_the_training_thread():
    class Broken(TrainAugment):
        def before_normalise(self, images, step):
            if step == 2:
                raise RuntimeError("bad op at step 2")
            return super().before_normalise(images, step)

    feed = TrainFeed(
        _batches(5), Broken(MEAN, STD, "rand-m9-mstd0.5-inc1"), Compute(), MEAN, STD, first_step=0, ahead=2, workers=2
    )
    with pytest.raises(RuntimeError, match="bad op at step 2"):
        list(feed)


def test_bad_ahead_or_workers_are_refused_by_name():
    with pytest.raises(ValueError, match="train.feed_ahead"):
        TrainFeed([], None, Compute(), MEAN, STD, first_step=0, ahead=-1)
    with pytest.raises(ValueError, match="train.feed_workers"):
        TrainFeed([], None, Compute(), MEAN, STD, first_step=0, ahead=2, workers=0)


def test_training_fed_ahead_ends_with_the_weights_of_training_fed_inline():
    torch.manual_seed(0)
    model = timm.create_model(
        "deit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10
    )
    batches = _batches(5)
    weights = {}
    for ahead, workers in ((0, 1), (2, 1), (2, 2)):
        net = copy.deepcopy(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        compute = Compute(channels_last=True)
        feed = TrainFeed(batches, _augment(), compute, MEAN, STD, first_step=7, ahead=ahead, workers=workers)
        stats = train_one_epoch(net, feed, opt, lambda s: 1e-3, EpochStart(7), compute=compute)
        assert stats["steps"] == 12
        weights[ahead, workers] = net.state_dict()
    for other in ((2, 1), (2, 2)):
        assert all(torch.equal(weights[0, 1][k], weights[other][k]) for k in weights[0, 1])


def test_ffcvs_reused_buffers_do_not_reach_batches_held_ahead(prepared):
    from locvit.data.ffcv_io import make_loader

    def epoch(ahead: int, workers: int = 1) -> list:
        loader = make_loader(prepared["train"], 64, True, torch.device("cpu"), seed=0)
        feed = TrainFeed(loader, _augment(), Compute(), MEAN, STD, first_step=0, ahead=ahead, workers=workers)
        return [(x, y.clone()) for x, y in feed]

    inline = epoch(0)  # the engine takes each batch before the next: the labels are copied here to keep them
    for early in (epoch(4), epoch(4, workers=2)):  # 4 batches held: more than FFCV's buffers keep valid
        assert len(inline) == len(early) > 4
        assert all(torch.equal(a[1], b[1]) and torch.equal(a[0], b[0]) for a, b in zip(inline, early))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_feed_threads_work_on_the_training_threads_gpu():
    device = torch.cuda.device_count() - 1  # the last GPU: not the device a new thread starts on when there are two
    torch.cuda.set_device(device)
    seen = set()

    class Noting(TrainAugment):
        def before_normalise(self, images, step):
            seen.add(torch.cuda.current_device())
            return super().before_normalise(images, step)

    batches = [(x.cuda(), y.cuda()) for x, y in _batches(3)]
    inline = list(TrainFeed(batches, _augment(), Compute(), MEAN, STD, first_step=0, ahead=0))
    early = list(
        TrainFeed(
            batches,
            Noting(MEAN, STD, "rand-m9-mstd0.5-inc1", 0.25, seed=3),
            Compute(),
            MEAN,
            STD,
            first_step=0,
            ahead=2,
            workers=2,
        )
    )
    assert seen == {device}
    assert all(torch.equal(a[0], b[0]) for a, b in zip(inline, early))


class _Ring:
    """A loader with FFCV's ring (``batches_ahead``) that logs each batch it hands out; stand-in CUDA events
    (``record``, ``synchronize``) log into the same list, so the test reads the order the feed kept."""

    def __init__(self, batches, batches_ahead: int):
        self.batches, self.batches_ahead, self.log = batches, batches_ahead, []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            self.note("take", i)
            yield batch

    def note(self, what: str, i: int) -> None:
        with self.lock:
            self.log.append((what, i))

    def event(self):
        ring, count = self, sum(1 for what, _ in self.log if what == "record")

        class Event:
            def record(self):
                ring.note("record", count)

            def synchronize(self):
                ring.note("wait", count)

        return Event()


@pytest.mark.parametrize("ahead, workers", [(0, 1), (2, 1), (2, 2)])
def test_no_batch_is_taken_before_the_device_finished_the_one_whose_buffer_it_reuses(ahead, workers):
    """FFCV's ring of batches_ahead + 2 buffers: before batch k is taken, the feed has waited on the event
    recorded once batch k - (ring - 1) was consumed, and it records one event per batch consumed, in order;
    the batches are the inline ones. The same code path as on CUDA, with stand-ins for its events."""
    batches, ring = _batches(9), 3 + 2
    loader = _Ring(batches, batches_ahead=3)
    feed = TrainFeed(
        loader, None, Compute(), MEAN, STD, first_step=0, ahead=ahead, workers=workers, new_event=loader.event
    )
    got = [x for x, _ in feed]
    for x, (images, _) in zip(got, batches, strict=True):
        torch.testing.assert_close(x, Compute().inputs(images, MEAN, STD), rtol=0, atol=0)
    log = loader.log
    assert [i for what, i in log if what == "take"] == list(range(9))
    assert [i for what, i in log if what == "record"] == list(range(9))
    assert [i for what, i in log if what == "wait"] == list(range(9 - (ring - 1) + 1))  # the last take's too
    for k in range(ring - 1, 9):
        waited = log.index(("wait", k - (ring - 1)))
        assert log.index(("record", k - (ring - 1))) < waited < log.index(("take", k)), log
    for k in range(ring - 1):  # the first ring - 1 batches are taken without a wait
        assert not any(what == "wait" for what, _ in log[: log.index(("take", k))])
