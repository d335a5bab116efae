"""The engine: one training epoch and one evaluation pass, callable from any script."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from locvit.config.run import peak_lr
from locvit.data.feed import bounded
from locvit.data.ffcv_io import to_model_input
from locvit.device import amp_dtype
from locvit.errors import LocvitError


@dataclass(frozen=True)
class Compute:
    """How a batch meets the model: autocast dtype (None: full precision) and memory format."""

    amp_dtype: torch.dtype | None = None
    channels_last: bool = False

    @classmethod
    def of(cls, recipe: dict, device: torch.device) -> Compute:
        """A run's (its config's ``train``: ``amp``, ``channels_last``) on ``device``: what training, and the
        scoring of its checkpoints, run under."""
        return cls(amp_dtype(recipe["amp"], device), bool(recipe.get("channels_last", False)))

    def inputs(self, images: torch.Tensor, mean, std) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> normalised float (B, 3, H, W), NHWC in memory when channels_last."""
        x = to_model_input(images, mean, std)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def autocast(self, device: torch.device):
        # bf16 keeps fp32's exponent range, so no loss scaling (GradScaler) is needed.
        return torch.autocast(device.type, dtype=self.amp_dtype or torch.bfloat16, enabled=self.amp_dtype is not None)


def channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its convolutions' weights in channels_last (NHWC) memory, in place. Only the convolutions:
    ``Module.to(memory_format=...)`` would also restride every other 4-D tensor (NesT's and PVT's position
    embeddings), which gains nothing there and makes their adds run on strided copies."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd) and module.weight.dim() == 4:
            module.to(memory_format=torch.channels_last)
    return model


def set_deterministic(enabled: bool) -> None:
    """Deterministic kernels for this process's next run (``train.deterministic``), on or off.

    On CUDA a run repeats bitwise only with these (SDPA's and index_select's backwards add with atomics);
    call before the run's first CUDA work. An op with no deterministic kernel then raises torch's error.
    ``False`` undoes ``True`` for a later run in the same process. The CPU's kernels are deterministic already.
    """
    if enabled:
        # cuBLAS reads this when it first initialises (the process's first CUDA matmul), so it must be
        # set before then; without it use_deterministic_algorithms makes cuBLAS calls raise. Left set when
        # turned off: cuBLAS has read it by then, and it changes no result.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False  # benchmarking picks kernels by timing: another pick per run
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled


def cosine_schedule(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up from 0 to ``lr`` over ``warmup_steps``, then cosine down to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(1.0, progress)))


class NonFiniteLoss(LocvitError, FloatingPointError):
    """Too many training steps with a NaN or inf loss (``train.max_bad_steps``)."""

    def __init__(self, step: int, loss: float, grad_norm: float, bad_steps: int, max_bad_steps: int):
        super().__init__(
            f"training stopped at step {step}: loss {loss}, gradient norm {grad_norm}; {bad_steps} step(s) with a "
            f"NaN or inf loss or gradient, more than train.max_bad_steps = {max_bad_steps}. last.pt holds the last "
            "good epoch. Lower train.lr, set train.clip_grad, or raise train.max_bad_steps to skip more such steps."
        )
        self.step, self.bad_steps = step, bad_steps


class NoOptimiserStep(LocvitError, RuntimeError):
    """An epoch that took no optimiser step: its result would be the untrained model's."""

    def __init__(self, batches: int, bad_steps: int):
        why = (
            "the training split holds fewer images than one batch (train.batch_size; a partial batch is dropped)"
            if batches == 0
            else f"all its {batches} step(s) had a NaN or inf loss or gradient"
        )
        super().__init__(
            f"an epoch took no optimiser step: {why}. Training stopped; nothing is written as the run's "
            "result. Use a train.batch_size of at most the training split's size (the dataset manifest "
            "holds it) or a larger data.train_fraction"
        )
        self.batches, self.bad_steps = batches, bad_steps


@dataclass(frozen=True)
class StepRecipe:
    """The recipe's settings a step reads, and what the epoch checks between its steps.

    ``read_every`` (``train.read_every``): steps between two host reads of the running sums (the
    progress bar) and the count of bad steps, at the steps whose global number it divides; the
    epoch's end reads them too. On CUDA each read waits for the queued kernels. ``max_bad_steps``
    (``train.max_bad_steps``): the bad steps the run may skip.
    """

    label_smoothing: float = 0.0
    clip_grad: float | None = None
    read_every: int = 50
    max_bad_steps: int = 0

    @classmethod
    def of(cls, recipe: dict) -> StepRecipe:
        """From a run config's ``train`` section."""
        return cls(recipe["label_smoothing"], recipe["clip_grad"], recipe["read_every"], recipe["max_bad_steps"])


@dataclass
class PartialEpoch:
    """An epoch's progress: its batches trained and its sums so far (last.pt keeps it for a stopped epoch)."""

    batches: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0
    bad_steps: int = 0
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class EpochStart:
    """Where an epoch starts: ``step``, the run's optimiser steps done (the first step's number);
    ``bad_steps_before``, its earlier epochs' bad steps; ``done``, what a stopped epoch had done."""

    step: int = 0
    bad_steps_before: int = 0
    done: PartialEpoch = field(default_factory=PartialEpoch)


class EpochBatches:
    """An epoch's batches for ``train_one_epoch``, ready for the model.

    ``loader``'s batches less the ``start.done.batches`` already trained (read and dropped, so the rest come
    in the uninterrupted order), through ``feed``. ``stop()`` is asked before each step whose global number
    ``read_every`` divides (the same on every process) but the epoch's first; then the batches end, ``stopped``.
    """

    def __init__(
        self,
        loader: Iterable,
        feed: Callable[..., Iterable],
        start: EpochStart = EpochStart(),
        read_every: int = 50,
        stop: Callable[[], bool] | None = None,
    ):
        self.loader, self.feed, self.start = loader, feed, start
        self.read_every, self.stop, self.stopped = read_every, stop, False

    def __len__(self) -> int:
        return len(self.loader) - self.start.done.batches

    def __iter__(self):
        self.stopped = False
        skip = _Skip(self.loader, self.start.done.batches)
        for step, batch in enumerate(self.feed(skip, first_step=self.start.step), self.start.step):
            if self.stop is not None and step > self.start.step and step % self.read_every == 0 and self.stop():
                self.stopped = True  # asked after the previous step: that one was the last
                return
            yield batch


class _Skip:
    """``loader`` without its first ``n`` batches (read and dropped: FFCV draws for them as before)."""

    def __init__(self, loader: Iterable, n: int):
        self.loader, self.n = loader, n  # .loader: where locvit.data.feed.ring_size finds FFCV's ring

    def __len__(self) -> int:
        return len(self.loader) - self.n

    def __iter__(self):
        batches = iter(self.loader)
        for _ in range(self.n):
            next(batches)
        yield from batches


def train_one_epoch(
    model: torch.nn.Module,
    batches: Iterable,
    optimizer: torch.optim.Optimizer,
    lr_at: Callable[[int], float],
    start: EpochStart = EpochStart(),
    recipe: StepRecipe = StepRecipe(),
    compute: Compute = Compute(),
    mixup: Callable | None = None,
    on_step: Callable[[int, torch.Tensor | None], None] | None = None,
    bar: str | None = None,
) -> dict:
    """Train on ``batches`` (x, labels) (``EpochBatches``); ``lr_at(step)`` sets the lr before each step.

    ``mixup`` (``BatchMixup``, label smoothing included) makes soft targets; accuracy counts the true labels.
    ``on_step(step, ok)`` runs after every optimiser step (``update_ema``); ``ok`` is None, or a () bool
    tensor on the device where a fused optimiser may have skipped the update. A step whose loss or gradient
    norm (DDP-averaged, so every process agrees) is not finite changes nothing and counts in ``bad_steps``;
    past ``recipe.max_bad_steps`` in the run ``NonFiniteLoss`` is raised before the epoch's checkpoint, and an
    epoch with no optimiser step raises ``NoOptimiserStep``. A fused optimiser's count is read every
    ``recipe.read_every`` steps, so its raise may come that much later. ``partial`` (``PartialEpoch``) carries
    a stopped epoch's progress: resumed, it ends as the uninterrupted one would.
    """
    model.train()
    done = start.done
    trained, step = done.batches, start.step
    clock = time.perf_counter() - done.elapsed_s
    fused = all(group.get("fused") for group in optimizer.param_groups)  # skips a bad step on the device
    tally = _Tally(done, next(model.parameters()).device, recipe.max_bad_steps, start.bad_steps_before)
    progress = tqdm(batches, desc=bar, leave=False, disable=bar is None, mininterval=1.0)
    for x, labels in progress:
        trained += 1
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        soft = None
        if mixup is not None:
            x, soft = mixup(x, labels, step)  # soft: (B, num_classes), smoothing included; drawn from the step
        with compute.autocast(x.device):
            logits = model(x).float()  # (B, num_classes); fp32 for the loss under bf16 autocast
        if soft is not None:
            loss = torch.sum(-soft * F.log_softmax(logits, dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits, labels, label_smoothing=recipe.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_grad or math.inf)
        ok = torch.isfinite(loss) & torch.isfinite(grad_norm)  # (): the step counts
        tally.add(step, loss, grad_norm, logits, labels, ok)
        if fused:  # the kernel leaves weights and state as they were (step count included) where found_inf is 1
            optimizer.found_inf = (~ok).float()
            optimizer.step()
            stepped = ok  # known on the device only: the EMA follows it there
        elif bool(ok):  # read at every step: on the CPU no sync (no queue of kernels to wait for)
            optimizer.step()
            stepped = None  # known to have stepped
        else:
            stepped = False
        step += 1
        if on_step is not None and stepped is not False:
            on_step(step, stepped)
        if stepped is False or step % recipe.read_every == 0:  # a known bad step: check the budget now
            loss_sum, correct, seen, bad = tally.read()
            elapsed = time.perf_counter() - clock
            progress.set_postfix(
                loss=f"{loss_sum / max(seen, 1):.3f}",
                acc=f"{correct / max(seen, 1):.3f}",
                img_s=f"{seen / max(elapsed, 1e-9):.0f}",
            )
    loss_sum, correct, seen, bad = tally.read()  # before the epoch's checkpoint
    if trained - bad <= 0:  # every batch of the epoch (none, or all bad): the weights never moved
        raise NoOptimiserStep(trained, bad)
    elapsed = time.perf_counter() - clock
    return {
        "partial": PartialEpoch(trained, loss_sum, correct, seen, bad, elapsed),
        "train_loss": loss_sum / max(seen, 1),
        "train_top1": correct / max(seen, 1),
        "train_images_per_s": seen / max(elapsed, 1e-9),
        "lr": optimizer.param_groups[0]["lr"],
        "steps": step,
        "bad_steps": bad,
    }


class _Tally:
    """An epoch's sums on the device, added to at every step without a host sync; ``read`` brings
    them over (one sync) and raises ``NonFiniteLoss`` when the bad steps exceed the budget.

    The loss sum is float64, adding ``loss * batch size`` as the host once added ``loss.item() * n``:
    the same numbers. A bad step adds nothing but its count; the step, loss and gradient norm of the
    bad step that went over the run's budget are kept for the message.
    """

    def __init__(self, done: PartialEpoch, device: torch.device, max_bad_steps: int, bad_steps_before: int):
        self.loss = torch.tensor(done.loss_sum, dtype=torch.float64, device=device)
        self.correct, self.seen, self.bad = (
            torch.tensor(n, dtype=torch.int64, device=device) for n in (done.correct, done.seen, done.bad_steps)
        )
        self.over = torch.zeros(3, dtype=torch.float64, device=device)  # (step, loss, grad norm)
        self.max_bad_steps = max_bad_steps
        self.budget = max_bad_steps - bad_steps_before  # bad steps this epoch may skip

    def add(
        self,
        step: int,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        ok: torch.Tensor,
    ) -> None:
        n = labels.shape[0]
        self.loss += torch.where(ok, loss.detach().double() * n, 0.0)
        self.correct += torch.where(ok, (logits.argmax(-1) == labels).sum(), 0)
        self.seen += ok * n
        self.bad += ~ok
        first_over = ~ok & (self.bad == self.budget + 1)
        now = torch.stack([torch.full_like(self.over[0], step), loss.detach().double(), grad_norm.detach().double()])
        self.over = torch.where(first_over, now, self.over)

    def read(self) -> tuple[float, int, int, int]:
        """(loss sum, correct, seen, bad steps) as Python numbers."""
        loss, correct, seen, bad = torch.stack(
            [self.loss, self.correct.double(), self.seen.double(), self.bad.double()]
        ).tolist()  # int64 counts: exact in float64
        correct, seen, bad = int(correct), int(seen), int(bad)
        if bad > self.budget:
            step, loss_at, grad_norm = self.over.tolist()
            raise NonFiniteLoss(int(step), loss_at, grad_norm, self.max_bad_steps + 1, self.max_bad_steps)
        return loss, correct, seen, bad


@torch.no_grad()
def update_ema(ema, model: torch.nn.Module, step: int, ok: torch.Tensor | None = None) -> None:
    """``ema`` (timm's ModelEmaV3) after optimiser step ``step`` of ``model``.

    ``ok`` None: timm's update. A () bool tensor (a step maybe skipped on the device): ours, with no host read,
    ``ema += w * (model - ema)`` over the state dict's float tensors, ``w = ok * (1 - decay)`` on the device,
    non-float buffers copied where ``ok``; three ``_foreach`` kernels whatever the parameter count.
    """
    if ok is None:
        ema.update(model, step=step)
        return
    weight = ok.float() * (1.0 - ema.get_decay(step))  # (); 0 on a skipped step: the EMA stays as it is
    ema_values, model_values = [], []
    for ema_v, model_v in zip(ema.module.state_dict().values(), model.state_dict().values()):
        if ema_v.is_floating_point():
            ema_values.append(ema_v)
            model_values.append(model_v)
        else:
            ema_v.copy_(torch.where(ok, model_v, ema_v))
    delta = torch._foreach_sub(model_values, ema_values)
    torch._foreach_mul_(delta, weight)  # one () tensor for all: read on the device, no host sync
    torch._foreach_add_(ema_values, delta)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader: Iterable, mean, std, compute: Compute = Compute(), limit: int | None = None
) -> dict:
    """Top-1 accuracy and mean cross-entropy over every sample of ``loader`` (its first ``limit``).

    ``limit`` drops the padding a distributed loader adds at the end of a rank's share;
    the sums (``loss_sum``, ``correct``, ``n``) are what ranks add up. ``hits`` holds, per sample
    in the loader's order, whether its top-1 prediction was right (a CPU bool tensor): the report
    pairs two variants scored on the same test images with it. The sums stay on the device until
    the end (one host read); the loss sum in float64, as the host added each batch's.
    """
    model.eval()
    total_seen, sums, hits = 0, None, []
    for batch, (images, labels) in enumerate(bounded(loader)):  # the device lags FFCV's buffers by less than a ring
        if limit is not None:
            keep = max(0, min(labels.shape[0], limit - total_seen))
            images, labels = images[:keep], labels[:keep]
            if keep == 0:
                continue  # drain the loader: FFCV's epoch thread must finish its epoch
        x = compute.inputs(images, mean, std)
        with compute.autocast(x.device):
            logits = model(x).float()  # (B, num_classes)
        hit = logits.argmax(-1) == labels  # (B,)
        hits.append(hit)
        batch_sums = torch.stack([F.cross_entropy(logits, labels, reduction="sum").double(), hit.sum().double()])
        sums = batch_sums if sums is None else sums + batch_sums  # (loss sum, correct); counts exact in float64
        total_seen += labels.shape[0]
    total_loss, total_correct = sums.tolist() if sums is not None else (0.0, 0)
    total_correct = int(total_correct)
    return {
        "loss": total_loss / max(total_seen, 1),
        "top1": total_correct / max(total_seen, 1),
        "n": total_seen,
        "loss_sum": total_loss,
        "correct": total_correct,
        "hits": torch.cat(hits).cpu() if hits else torch.zeros(0, dtype=torch.bool),
    }


# The optimiser, its EMA and its schedule, as a run builds them (locvit.train.loop) and its fingerprint does ------


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases, norms, tokens and position embeddings (DeiT's rule)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, recipe: dict, device: torch.device) -> torch.optim.Optimizer:
    """The recipe's AdamW over ``param_groups``, at its peak lr.

    Fused on CUDA: one kernel for all tensors, which skips a step with a NaN or inf on the device (the engine
    sets its found_inf), so no step reads a flag back. The CPU keeps torch's default (single-tensor): the CPU's
    fused kernel rounds differently, and CPU runs keep the numbers they always had.
    """
    optimizer = torch.optim.AdamW(
        param_groups(model, recipe["weight_decay"]),
        lr=peak_lr(recipe),
        betas=tuple(recipe["betas"]),
        fused=True if device.type == "cuda" else None,
    )
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    return optimizer


def make_ema(model: torch.nn.Module, recipe: dict):
    """timm's ModelEmaV3 of ``model`` where the recipe keeps one, else None."""
    if not recipe["ema"]:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=recipe["ema_decay"])


def make_schedule(recipe: dict, steps_per_epoch: int):
    """``lr_at(step)``: the recipe's warm-up and cosine over its epochs of ``steps_per_epoch`` steps."""
    return functools.partial(
        cosine_schedule,
        total_steps=steps_per_epoch * recipe["epochs"],
        warmup_steps=int(round(recipe["warmup_epochs"] * steps_per_epoch)),
        lr=peak_lr(recipe),
        min_lr=recipe["min_lr"],
    )


def _keep_implementation(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """A checkpoint's optimiser state loads into the implementation this run built (fused on CUDA), whatever
    wrote it: a GPU run saved unfused by an older locvit, or a CPU run resumed on a GPU."""
    groups = [
        {**saved, "fused": ours["fused"]} for saved, ours in zip(state_dict["param_groups"], optimizer.param_groups)
    ]
    return {**state_dict, "param_groups": groups}
