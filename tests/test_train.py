"""Training engine and checkpoints: the loss goes down, checkpoints round-trip exactly."""

from __future__ import annotations

import math

import pytest
import timm
import torch

from locvit import models
from locvit.checkpoint import load_checkpoint, save_checkpoint
from locvit.config import ConfigError, validate_params
from locvit.config.run import run_config
from locvit.data.feed import TrainFeed
from locvit.data.ffcv_io import make_loader
from locvit.device import amp_dtype
from locvit.train.engine import (
    Compute,
    EpochStart,
    NonFiniteLoss,
    StepRecipe,
    cosine_schedule,
    evaluate,
    param_groups,
    set_deterministic,
    train_one_epoch,
)
from locvit.train.state import seed_everything


def ready(loader, mean, std, compute: Compute = Compute()) -> TrainFeed:
    """``loader``'s uint8 batches as the model's input, prepared in this thread."""
    return TrainFeed(loader, None, compute, mean, std, first_step=0, ahead=0)


def test_cosine_schedule_warms_up_then_decays_to_min_lr():
    lrs = [cosine_schedule(s, 100, 10, 1e-3, 1e-5) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # rising during warm-up
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then non-increasing
    assert lrs[100] == pytest.approx(1e-5)
    assert lrs[55] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))  # half-way through the cosine


def test_weight_decay_skips_biases_norms_and_tokens():
    model = timm.create_model(
        "deit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10
    )
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim > 1 for p in decay["params"])
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "norm.weight", "head.bias"} <= skipped


def test_a_few_batches_bring_the_loss_down(prepared, tiny_params):
    seed_everything(0)
    torch.set_num_threads(2)
    cfg = run_config(tiny_params, "deit_a", 0)
    model = models.create(cfg)
    mean, std = models.normalisation(model)
    loader = make_loader(prepared["train"], 64, True, torch.device("cpu"), seed=0)
    val_loader = make_loader(prepared["val"], 256, False, torch.device("cpu"))
    before = evaluate(model, val_loader, mean, std)["loss"]
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=3e-3)
    step = 0
    for _ in range(3):
        stats = train_one_epoch(model, ready(loader, mean, std), opt, lambda s: 3e-3, EpochStart(step))
        step = stats["steps"]
    after = evaluate(model, val_loader, mean, std)
    assert step == 3 * len(loader)
    assert after["loss"] < before - 0.1, (before, after)
    assert after["top1"] > 0.2  # chance is 0.1


def test_non_finite_loss_stops_training(prepared, tiny_params):
    model = models.create(run_config(tiny_params, "deit_a", 0))
    with torch.no_grad():
        model.head.weight.fill_(math.nan)
    loader = make_loader(prepared["train"], 64, True, torch.device("cpu"), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.patch_embed.proj.weight.detach().clone()
    with pytest.raises(NonFiniteLoss, match="training stopped at step 0: loss nan.*train.max_bad_steps = 0"):
        train_one_epoch(model, ready(loader, (0.5,) * 3, (0.5,) * 3), opt, lambda s: 1e-3)
    assert torch.equal(model.patch_embed.proj.weight, before)  # the bad step updated nothing


def test_checkpoint_round_trip_gives_the_same_logits(tmp_path, tiny_params):
    cfg = run_config(tiny_params, "deit_a", 0)
    seed_everything(1)
    model = models.create(cfg).eval()
    path = tmp_path / "ckpt" / "best.pt"
    save_checkpoint(
        path, {"model": model.state_dict(), "config": cfg, "epoch": 3, "val_top1": 0.5, "mlflow_run_id": "abc"}
    )
    assert [p.name for p in path.parent.iterdir()] == ["best.pt"]  # no temporary file left behind
    state = load_checkpoint(path)
    rebuilt = models.load(state, "cpu")
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(model(x), rebuilt(x))
    assert state["epoch"] == 3 and state["config"] == cfg


def test_checkpoints_refuse_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(ValueError, match="cannot be read"):
        load_checkpoint(path)


def test_mixup_and_cutmix_are_a_recipe_setting(prepared, tiny_params):
    from locvit.data.augment import make_mixup

    recipe = tiny_params["train"]
    assert recipe["mixup"] == 0 and recipe["cutmix"] == 0 and make_mixup(recipe, 10, 0) is None  # off by default
    seen = {}

    class Recorder(torch.nn.Module):  # a linear classifier that keeps the first batch it is given
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3 * 16 * 16, 10)

        def forward(self, x):
            seen.setdefault(self.tag, x.detach().clone())
            return self.fc(x.flatten(1))

    def first_batch(mixup, tag):
        seed_everything(0)
        model = Recorder()
        model.tag = tag
        loader = make_loader(prepared["train"], 64, True, torch.device("cpu"), seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        stats = train_one_epoch(
            model,
            ready(loader, (0.5,) * 3, (0.5,) * 3),
            opt,
            lambda s: 0.0,
            recipe=StepRecipe(label_smoothing=0.1),
            mixup=mixup,
        )
        assert math.isfinite(stats["train_loss"])

    first_batch(None, "plain")
    first_batch(make_mixup({**recipe, "cutmix": 1.0}, 10, 0), "cutmix")
    plain, cut = seen["plain"], seen["cutmix"]
    assert plain.shape == cut.shape
    changed = (plain != cut).any(dim=1)  # (B, H, W): pixels pasted from the flipped batch
    assert 0 < changed.float().mean() < 1  # CutMix pastes boxes: some pixels change, not all


def test_without_the_loader_jit_a_run_repeats_exactly(prepared, tiny_params):
    """FFCV's random translation draws from numpy's seeded generator when not compiled."""

    def one_epoch():
        seed_everything(0)
        model = models.create(run_config(tiny_params, "deit_a", 0))
        loader = make_loader(prepared["train"], 64, True, torch.device("cpu"), seed=0, translate=2, jit=False)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        stats = train_one_epoch(model, ready(loader, (0.5,) * 3, (0.5,) * 3), opt, lambda s: 3e-3)
        return stats["train_loss"], torch.cat([p.detach().flatten() for p in model.parameters()])

    (loss_a, params_a), (loss_b, params_b) = one_epoch(), one_epoch()
    assert loss_a == loss_b and torch.equal(params_a, params_b)


def test_bf16_autocast_and_channels_last(prepared, tiny_params):
    """amp: auto is bf16 on CUDA only; bf16 runs the forward pass in bf16 (weights stay fp32), NHWC inputs."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert amp_dtype("auto", cpu) is None and amp_dtype("auto", cuda) is torch.bfloat16
    assert amp_dtype("bf16", cpu) is torch.bfloat16
    assert amp_dtype("off", cuda) is None and amp_dtype(False, cuda) is None  # YAML's unquoted off
    seed_everything(0)
    model = models.create(run_config(tiny_params, "deit_a", 0)).to(memory_format=torch.channels_last)
    seen = []
    model.patch_embed.proj.register_forward_hook(
        lambda m, args, out: seen.append((args[0].is_contiguous(memory_format=torch.channels_last), out.dtype))
    )
    compute = Compute(torch.bfloat16, channels_last=True)
    mean, std = models.normalisation(model)
    loader = make_loader(prepared["train"], 64, True, cpu, seed=0, jit=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = train_one_epoch(model, ready(loader, mean, std, compute), opt, lambda s: 1e-3, compute=compute)
    val = evaluate(model, make_loader(prepared["val"], 256, False, cpu, jit=False), mean, std, compute)
    assert math.isfinite(stats["train_loss"]) and math.isfinite(val["loss"]) and val["n"] == 270
    assert set(seen) == {(True, torch.bfloat16)}
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.e2e  # MLflow's git context runs git when the run logs its model
def test_a_seeded_run_with_mixup_and_cutmix_repeats_bitwise(prepared, tiny_params, tmp_path):
    """MixUp/CutMix draw from the run's seeded generator, not numpy's global one that FFCV's loader
    thread shares: two runs of one seeded config end with the same weights, bit for bit."""
    from locvit.train.loop import train_run

    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"].update(epochs=2, mixup=0.8, cutmix=1.0, mixup_switch_prob=0.5, translate=2)

    def run(name: str) -> dict:
        return train_run(
            cfg,
            prepared["train"],
            prepared["val"],
            prepared["manifest"],
            tmp_path / name,
            tmp_path / "mlflow.db",
            show_progress=False,
            threads=1,
        )

    first, second = run("a"), run("b")
    assert first["rank_weights_sha256"] == second["rank_weights_sha256"]
    assert [r["train_loss"] for r in first["history"]] == [r["train_loss"] for r in second["history"]]
    cfg["seed"] = 1  # and the seed matters: another seed, other weights
    assert run("c")["rank_weights_sha256"] != first["rank_weights_sha256"]


@pytest.fixture
def global_determinism(monkeypatch):
    """Whatever a test does to torch's determinism switches and CUBLAS_WORKSPACE_CONFIG is undone after it."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # the opposite of what the switch sets
    on, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(on, warn_only=warn_only)


def _determinism() -> tuple:
    import os

    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


@pytest.mark.parametrize("value", [True, False])
def test_train_deterministic_is_a_boolean_recipe_key(raw_tiny, value):
    raw_tiny["train"]["deterministic"] = value
    assert validate_params(raw_tiny)["train"]["deterministic"] is value


def test_train_deterministic_defaults_off_and_refuses_text(raw_tiny, tiny_params):
    assert tiny_params["train"]["deterministic"] is False
    raw_tiny["variants"]["deit_a"]["train"] = {"deterministic": "true"}
    with pytest.raises(ConfigError) as info:
        validate_params(raw_tiny)
    assert "variants.deit_a.train.deterministic: 'true' is not of type 'boolean'" in str(info.value)


def test_set_deterministic_sets_every_switch_and_off_turns_them_off(global_determinism):
    set_deterministic(False)
    assert _determinism() == (False, False, True, None)  # as the fixture left them
    set_deterministic(True)
    assert _determinism() == (True, True, False, ":4096:8")
    set_deterministic(False)  # the next run in the same process, without the key: torch's fast kernels again
    assert _determinism()[:2] == (False, False)


def test_set_deterministic_keeps_a_workspace_config_already_set(global_determinism, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other setting cuBLAS accepts
    set_deterministic(True)
    assert _determinism() == (True, True, False, ":16:8")


@pytest.mark.e2e  # MLflow's git context runs git when the run logs its model
def test_a_deterministic_run_trains_on_cpu_with_the_same_weights(prepared, tiny_params, tmp_path, global_determinism):
    """train.deterministic on: every op of a CPU training step has a deterministic kernel, and on
    CPU the switch changes no number (the weights equal those of a run with it off)."""
    from locvit.train.loop import train_run

    def run(name: str, deterministic: bool) -> dict:
        cfg = run_config(tiny_params, "deit_a", 0)
        cfg["train"].update(epochs=1, deterministic=deterministic)
        return train_run(
            cfg,
            prepared["train"],
            prepared["val"],
            prepared["manifest"],
            tmp_path / name,
            tmp_path / "mlflow.db",
            show_progress=False,
            threads=1,
        )

    off = run("off", False)
    assert _determinism()[0] is False  # off: training left the switch alone
    on = run("on", True)
    assert _determinism() == (True, True, False, ":4096:8")
    assert math.isfinite(on["history"][0]["train_loss"]) and on["history"][0]["val_top1"] > 0
    assert on["rank_weights_sha256"] == off["rank_weights_sha256"]


def test_the_epoch_step_reads_like_deits_engine():
    """train_one_epoch takes the model, the batches, the optimiser, the schedule and a few settings (at most
    12 arguments): skipping a stopped epoch's batches and stopping on request live in EpochBatches."""
    import inspect

    from locvit.train.engine import EpochBatches, train_one_epoch

    params = inspect.signature(train_one_epoch).parameters
    assert len(params) <= 12, list(params)
    assert not {"done", "stop", "skip", "show_progress"} & set(params)
    assert {"start", "stop"} <= set(inspect.signature(EpochBatches).parameters)


def test_a_checkpoint_is_scored_under_its_runs_precision():
    """Evaluation (engine.evaluate, with the run's Compute.of, as locvit evaluate scores a checkpoint) runs the
    forward pass under the run's bf16 autocast on NHWC inputs; a run with amp off, in float32."""
    cpu = torch.device("cpu")
    assert Compute.of({"amp": "bf16", "channels_last": True}, cpu) == Compute(torch.bfloat16, True)
    assert Compute.of({"amp": "auto", "channels_last": False}, cpu) == Compute(None, False)  # auto: off on the CPU
    torch.manual_seed(0)
    model = timm.create_model(
        "deit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=48, depth=1, num_heads=3, num_classes=10
    )
    images = [((torch.rand(4, 3, 16, 16) * 255).to(torch.uint8), torch.arange(4))]
    for recipe, expected in (
        ({"amp": "bf16", "channels_last": True}, (True, True, torch.bfloat16)),
        ({"amp": "off"}, (False, False, torch.float32)),
    ):
        seen = []
        hook = model.register_forward_hook(
            lambda m, args, out: seen.append(
                (
                    torch.is_autocast_enabled("cpu"),
                    args[0].is_contiguous(memory_format=torch.channels_last) and not args[0].is_contiguous(),
                    out.dtype,
                )
            )
        )
        evaluate(model, images, (0.5,) * 3, (0.5,) * 3, Compute.of(recipe, cpu))
        hook.remove()
        assert seen == [expected]


@pytest.mark.e2e  # MLflow's git context runs git when the run logs its model
def test_a_jobs_second_seed_logs_each_epoch_line_once(prepared, tiny_params, tmp_path, monkeypatch, capfd):
    """The first run's end logs its model through mlflow.pytorch, whose import calls ``logging.basicConfig``: a
    root handler to which locvit's lines also went, so from the second seed on every line printed twice. The
    import runs afresh here (as in a new job), with the root logger as a new process has it."""
    import logging
    import sys

    from locvit.train.loop import train_run

    for name in [m for m in sys.modules if m == "mlflow.pytorch" or m.startswith("mlflow.pytorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(logging.root, "handlers", [])
    for seed in (0, 1):
        cfg = run_config(tiny_params, "deit_a", seed)
        cfg["train"]["epochs"] = 1
        train_run(
            cfg,
            prepared["train"],
            prepared["val"],
            prepared["manifest"],
            tmp_path / f"seed{seed}",
            tmp_path / "mlflow.db",
            show_progress=False,
            threads=1,
        )
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert [sum(f"[deit_a seed {seed}] epoch 1/1 loss" in line for line in lines) for seed in (0, 1)] == [1, 1]
    assert logging.root.handlers == []
