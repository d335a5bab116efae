"""No host sync per training step: what the GPU path relies on, checked on the CPU.

On CUDA a read of a device value (``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``, ``nonzero()``, a
0-dim tensor passed where torch takes a Python number) or a tensor built from host numbers
(``torch.tensor``) waits for the queued kernels. The engine keeps its sums, its bad-step count and the
bad-step skip on the device and reads them every ``read_every`` steps
(:class:`locvit.train.engine.StepRecipe`); MaiT finds its heads in buffers. Here those calls are counted
per step, at the aten ops a dispatch mode sees (so calls inside torch count too), while a fused AdamW
(the CUDA path's optimiser) trains on the CPU.
The CPU's own path (torch's default AdamW, which reads the flag at every step: no sync there)
keeps its numbers: any ``read_every`` gives the same weights and statistics.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math

import pytest
import timm
import torch
from helpers import locvit_families
from timm.utils import ModelEmaV3
from torch.utils._python_dispatch import TorchDispatchMode

import locvit.models  # noqa: F401  registers the families
from locvit.checkpoint import weights_digest
from locvit.data.augment import BatchMixup
from locvit.data.feed import TrainFeed
from locvit.data.ffcv_io import to_model_input
from locvit.train.engine import (
    Compute,
    EpochBatches,
    EpochStart,
    NonFiniteLoss,
    PartialEpoch,
    StepRecipe,
    _keep_implementation,
    param_groups,
    train_one_epoch,
    update_ema,
)
from locvit.train.loop import buffers_change

BUILDS = {name: family.small for name, family in locvit_families().items()}  # Family.small

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: Tensor methods that read a value to the host, called from Python (on a CPU tensor no aten op runs for them).
SYNC_METHODS = ("tolist", "numpy", "cpu")
#: aten ops that wait for the device on CUDA: a value read to the host (``item()``, ``bool()``, a 0-dim tensor
#: taken where torch wants a Python number), an output sized by the data, a tensor from host numbers (a copy).
SYNC_OPS = (
    "_local_scalar_dense",
    "is_nonzero",
    "equal",
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
    "lift_fresh",
)


class _SyncOps(TorchDispatchMode):
    def __init__(self, count):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.count(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting_syncs(where: dict):
    """Count the sync points met while inside (the aten ops of :data:`SYNC_OPS`, seen by a dispatch mode,
    and the methods of :data:`SYNC_METHODS`), by ``where["step"]`` (the step running then)."""
    counts: collections.Counter = collections.Counter()

    def count(name):
        counts[where.get("step"), name] += 1

    def counted(name, original):
        def wrapper(*args, **kwargs):
            count(name)
            return original(*args, **kwargs)

        return wrapper

    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(name, original))
        with _SyncOps(count):
            yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _batches(n: int, b: int = 8, size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ((torch.rand(b, 3, size, size, generator=g) * 255).to(torch.uint8), torch.randint(0, 10, (b,), generator=g))
        for _ in range(n)
    ]


def _mait(**kwargs) -> torch.nn.Module:
    """A small MaiT; layer 1 masks heads 0 and 2 of 3 (not the leading ones: the free heads are indexed)."""
    torch.manual_seed(0)
    args = dict(
        img_size=16,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=3,
        num_classes=10,
        masked_heads=[1, [0, 2]],
        mask_type="hard",
    )
    return timm.create_model("mait_tiny_patch16_224", **{**args, **kwargs})


def _train(
    model,
    batches,
    fused: bool,
    read_every: int,
    ema=None,
    nan_at=(),
    max_bad_steps: int = 0,
    where: dict | None = None,
    **kwargs,
) -> dict:
    """One epoch of ``model`` from step 0 with MixUp, clipping and (``ema``) an EMA; steps in ``nan_at``
    get a NaN output. ``where["step"]`` follows the running step."""
    where = {} if where is None else where
    opt = kwargs.pop("optimizer", None) or torch.optim.AdamW(
        param_groups(model, 0.05), lr=1e-3, fused=True if fused else None
    )

    def lr_at(step):
        where["step"] = step
        return 1e-3

    hook = model.register_forward_hook(lambda m, a, out: out * math.nan if where.get("step") in nan_at else None)
    on_step = (lambda step, ok: update_ema(ema, model, step, ok)) if ema is not None else None
    start = EpochStart(kwargs.pop("first_step", 0), 0, kwargs.pop("done", None) or PartialEpoch())
    feed = functools.partial(TrainFeed, augment=None, compute=Compute(), mean=MEAN, std=STD, ahead=0)
    epoch = EpochBatches(batches, feed, start, read_every, kwargs.pop("stop", None))
    try:
        stats = train_one_epoch(
            model,
            epoch,
            opt,
            lr_at,
            start,
            StepRecipe(0.1, 1.0, read_every, max_bad_steps),
            mixup=BatchMixup(0.8, 1.0, 1.0, 0.5, 0.1, 10),
            on_step=on_step,
        )
        stats["stopped"] = epoch.stopped
    finally:
        hook.remove()
        where["step"] = None
    return {"stats": stats, "optimizer": opt}


def test_a_fused_epoch_reads_the_host_only_every_read_every_steps():
    """13 steps, read_every 4: steps 3, 7 and 11 end with one read each (.tolist of the sums), the epoch's
    end (after step 12) with one more; every other step meets no sync point (EMA, MixUp, clipping, AdamW
    and MaiT's free heads included). Before the first step: the sums moved to the device (4 torch.tensor)
    and the normalisation constants (2, once per process)."""
    model = _mait()
    where: dict = {}
    with counting_syncs(where) as counts:
        _train(model, _batches(13), fused=True, read_every=4, ema=ModelEmaV3(model, decay=0.9), where=where)
    per_step = collections.Counter()
    for (step, name), n in counts.items():
        per_step[step] += n
    # steps 3, 7, 11: the reads; step 12: the epoch's end, read after it
    assert {step: per_step[step] for step in range(13) if per_step[step]} == {3: 1, 7: 1, 11: 1, 12: 1}, counts
    assert all(name == "tolist" for step, name in counts if step is not None), counts
    assert sum(counts.values()) <= math.ceil(13 / 4) + 1 + 4 + 2, counts


def test_maits_forward_calls_no_sync_point():
    x = torch.randn(2, 3, 16, 16)
    for kwargs in (
        dict(),
        dict(masked_heads="sch1"),
        dict(masked_heads=[[1], [0, 2]], mask_mode="restrict"),
        dict(masked_heads=[[1, 2], 0], mask_type="soft"),
    ):
        model = _mait(**kwargs)
        model(x)  # first calls build caches (the restrict mask)
        where = {"step": 0}
        with counting_syncs(where) as counts:
            model(x).sum().backward()
        assert not counts, (kwargs, counts)


def test_maits_free_heads_are_a_buffer_outside_the_state_dict():
    model = _mait()
    masks = model.blocks[1].attn.masks
    assert masks.heads.tolist() == [0, 2] and masks.free.tolist() == [1]
    assert model.blocks[0].attn.masks.free.tolist() == [1, 2]
    assert not [k for k in model.state_dict() if k.endswith(".free")]


def test_the_normalisation_constants_are_built_once_with_the_same_values():
    images = _batches(1)[0][0]
    expected = (images.float() / 255.0 - torch.tensor(MEAN).view(1, -1, 1, 1)) / torch.tensor(STD).view(1, -1, 1, 1)
    to_model_input(images, MEAN, STD)
    with counting_syncs({}) as counts:
        x = to_model_input(images, list(MEAN), STD)
    assert not counts and torch.equal(x, expected)


def test_a_fused_step_with_a_nan_loss_changes_no_weight_optimiser_state_or_ema():
    """The same epoch with one more step, whose loss is NaN: weights, AdamW's state (its step counts too) and
    the EMA end bitwise as without it, and the sums leave that step out."""
    ends = {}
    for steps, nan_at in ((3, ()), (4, (3,))):
        model = _mait()
        ema = ModelEmaV3(model, decay=0.9)
        out = _train(model, _batches(steps), fused=True, read_every=100, ema=ema, nan_at=nan_at, max_bad_steps=1)
        opt_state = {f"{k}.{n}": t for k, s in out["optimizer"].state_dict()["state"].items() for n, t in s.items()}
        ends[steps] = (
            weights_digest(model.state_dict()),
            weights_digest(ema.module.state_dict()),
            weights_digest(opt_state),
            out["stats"],
        )
    (model_a, ema_a, opt_a, stats_a), (model_b, ema_b, opt_b, stats_b) = ends[3], ends[4]
    assert (model_a, ema_a, opt_a) == (model_b, ema_b, opt_b)
    assert stats_b["bad_steps"] == 1 and stats_a["bad_steps"] == 0 and stats_b["steps"] == 4
    for key in ("loss_sum", "correct", "seen"):
        assert getattr(stats_a["partial"], key) == getattr(stats_b["partial"], key), key


@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])
def test_one_bad_step_too_many_raises_naming_it_whatever_the_optimiser(fused):
    """Fused: found at the next read (step 3 of read_every 4, or the epoch's end), naming the step that went
    over; default: at that step. The message is the same."""
    for read_every in (4, 100):
        with pytest.raises(NonFiniteLoss) as raised:
            _train(_mait(), _batches(6), fused=fused, read_every=read_every, nan_at=(1, 2), max_bad_steps=1)
        assert str(raised.value).startswith("training stopped at step 2: loss nan, gradient norm nan; 2 step(s)")


@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])
def test_any_read_every_gives_the_same_weights_and_statistics(fused):
    ends = []
    for read_every in (1, 3, 1000):
        model = _mait()
        ema = ModelEmaV3(model, decay=0.9)
        stats = _train(model, _batches(7), fused=fused, read_every=read_every, ema=ema, nan_at=(2,), max_bad_steps=1)[
            "stats"
        ]
        stats = {k: v for k, v in stats.items() if k != "train_images_per_s"}
        stats["partial"] = {k: v for k, v in dataclasses.asdict(stats["partial"]).items() if k != "elapsed_s"}
        ends.append((weights_digest(model.state_dict()), weights_digest(ema.module.state_dict()), stats))
    assert ends[0] == ends[1] == ends[2]


def test_a_stop_at_a_read_resumes_to_the_uninterrupted_epoch():
    """Asked to stop during step 3 with read_every 2: the epoch stops after step 4 (the next read), and the
    rest of it, carried on from the partial sums, ends as the whole epoch does."""
    batches = _batches(7)
    whole_model = _mait()
    whole = _train(whole_model, batches, fused=False, read_every=2)["stats"]

    model = _mait()
    where: dict = {}
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
    first = _train(
        model, batches, fused=False, read_every=2, where=where, optimizer=opt, stop=lambda: where.get("step", -1) >= 3
    )["stats"]
    assert first["stopped"] and first["steps"] == 4 and first["partial"].batches == 4
    rest = _train(
        model, batches, fused=False, read_every=2, optimizer=opt, done=first["partial"], first_step=first["steps"]
    )["stats"]
    assert weights_digest(model.state_dict()) == weights_digest(whole_model.state_dict())
    for key in ("train_loss", "train_top1", "steps", "bad_steps"):
        assert rest[key] == whole[key], key


def test_an_unfused_checkpoint_loads_into_the_fused_optimiser_a_gpu_run_builds():
    """An older locvit's GPU run (and any CPU run) saved AdamW unfused; resumed, the run keeps its own."""
    model = _mait()
    saved = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    saved.step()
    fused = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    fused.register_load_state_dict_pre_hook(_keep_implementation)
    fused.load_state_dict(saved.state_dict())
    assert all(group["fused"] for group in fused.param_groups)
    fused.found_inf = torch.zeros(())
    fused.step()  # an unfused group would refuse found_inf
    assert all(state["step"].item() == 2 for state in fused.state.values())


@pytest.mark.usefixtures("cache_in_tmp")  # IBiT's mask fits are cached
def test_no_family_syncs_or_changes_a_buffer_in_training_so_ddp_need_not_broadcast_them():
    """Every family (and timm's baselines) trains a step calling no sync point. DDP's broadcast_buffers is
    off when :func:`buffers_change` says no: true of each family without BatchNorm, whose buffers a training
    step leaves as they were once the first forward has built the lazy ones (ConViT's relative positions, a
    function of the token count: the same on every process); a family with BatchNorm's running statistics
    (LocalViT, the CNNs) is one buffers_change names, so DDP broadcasts them."""
    # One model of each family at its small build (Family.small; buffers are per block kind).
    for name, shape in BUILDS.items():
        torch.manual_seed(0)
        model, size = shape.build(num_classes=7), shape.size
        model.train()
        model(torch.randn(2, 3, size, size))
        before = {k: b.clone() for k, b in model.named_buffers()}
        x = torch.randn(2, 3, size, size)
        with counting_syncs({}) as counts:
            model(x).sum().backward()
        assert not counts, (name, counts)
        if buffers_change(model):  # running statistics (BatchNorm: LocalViT's, the CNNs'): DDP broadcasts them
            assert any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()), name
            continue
        assert all(torch.equal(before[k], b) for k, b in model.named_buffers()), name
    assert buffers_change(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)))


class _Ops(TorchDispatchMode):
    """Every aten op (with its overload) dispatched while inside, in order."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(f"{func.overloadpacket.__name__}.{func._overloadname}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("depth", [2, 4])
def test_the_device_side_ema_update_is_three_multi_tensor_kernels_whatever_the_depth(depth):
    """The EMA update of the fused path (``ok`` a device tensor): the float tensors move in three multi-tensor
    ops (on CUDA one kernel launch each for up to a few hundred tensors), none per parameter, and none that
    syncs. The weight is one () tensor (``_foreach_mul_.Tensor``), not a list of them (``_foreach_lerp_.List``,
    a kernel per tensor on CUDA). It moves as timm's update does, and not at all on a skipped step."""
    model = _mait(depth=depth, masked_heads=[1] * depth)
    ema, reference = ModelEmaV3(model, decay=0.9), ModelEmaV3(model, decay=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    ops, ok = _Ops(), torch.tensor(True)  # the step's flag, on the device
    with counting_syncs({"step": 0}) as syncs, ops:
        update_ema(ema, model, step=5, ok=ok)
    assert not syncs, syncs
    foreach = [op for op in ops.seen if op.startswith("_foreach")]
    assert foreach == ["_foreach_sub.List", "_foreach_mul_.Tensor", "_foreach_add_.List"], ops.seen
    kernels = [op for op in ops.seen if not op.startswith("detach.")]  # state_dict()'s detach: no kernel
    assert len(kernels) <= 6, kernels  # the weight's few () ops besides: not one op per tensor
    reference.update(model, step=5)
    for a, b in zip(ema.module.state_dict().values(), reference.module.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    before = weights_digest(ema.module.state_dict())
    update_ema(ema, model, step=6, ok=torch.tensor(False))
    assert weights_digest(ema.module.state_dict()) == before
