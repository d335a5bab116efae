"""Per-sample augmentations (RandAugment, random erasing) and repeated augmentation's order."""

from __future__ import annotations

import math
import random
import types

import numpy as np
import pytest
import torch

from locvit.config import ConfigError, load_schema, validate_params
from locvit.data.augment import TrainAugment, make_train_augment
from locvit.data.ffcv_io import make_loader, repeated_aug_order, to_model_input

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEIT = "rand-m9-mstd0.5-inc1"


def _recipe(**keys) -> dict:
    return {k: v["default"] for k, v in load_schema()["$defs"]["recipe"]["properties"].items()} | keys


def _batch(n: int = 32, size: int = 32, same: bool = False) -> torch.Tensor:
    """uint8 (n, 3, size, size): smooth random images (RandAugment's ops act visibly on them)."""
    g = torch.Generator().manual_seed(0)
    small = torch.randint(0, 256, (1 if same else n, 3, 4, 4), generator=g).float()
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
    return big.round().to(torch.uint8).expand(n, -1, -1, -1).contiguous()


def _global_states():
    return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()


def _same_states(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_off_by_default_and_a_bad_spec_is_named():
    assert make_train_augment(_recipe(), MEAN, STD, seed=0) is None
    assert isinstance(make_train_augment(_recipe(random_erasing=0.25), MEAN, STD, seed=0), TrainAugment)
    with pytest.raises(ValueError, match=r"train\.randaugment: 'rand-q3' is not a timm RandAugment spec"):
        make_train_augment(_recipe(randaugment="rand-q3"), MEAN, STD, seed=0)


def test_schema_takes_deits_spec_and_refuses_others(raw_tiny):
    raw_tiny["train"].update(randaugment=DEIT, random_erasing=0.25, repeated_aug=3)
    assert validate_params(raw_tiny, check_models=False)["train"]["randaugment"] == DEIT
    raw_tiny["train"]["randaugment"] = "randaugment-9"
    with pytest.raises(ConfigError, match=r"train\.randaugment: 'randaugment-9' does not match"):
        validate_params(raw_tiny, check_models=False)


def test_randaugment_draws_per_image_and_keeps_shape_dtype():
    aug = TrainAugment(MEAN, STD, DEIT, seed=0)
    same = _batch(64, same=True)  # one image, 64 times
    out = aug.before_normalise(same, step=0)
    assert out.shape == same.shape and out.dtype == torch.uint8 and out.device == same.device
    assert len({img.numpy().tobytes() for img in out}) > 32  # each copy got its own ops
    assert (out != same).flatten(1).any(1).float().mean() > 0.5


def test_randaugment_repeats_with_the_seed_and_step_and_leaves_global_generators_alone():
    x = _batch(32)
    before = _global_states()
    a = TrainAugment(MEAN, STD, DEIT, seed=3).before_normalise(x, step=7)
    assert _same_states(before, _global_states())
    assert torch.equal(a, TrainAugment(MEAN, STD, DEIT, seed=3).before_normalise(x, step=7))
    assert not torch.equal(a, TrainAugment(MEAN, STD, DEIT, seed=4).before_normalise(x, step=7))
    assert not torch.equal(a, TrainAugment(MEAN, STD, DEIT, seed=3).before_normalise(x, step=8))
    assert not torch.equal(a, TrainAugment(MEAN, STD, DEIT, seed=3, rank=1).before_normalise(x, step=7))
    # Threads do the pixel work; every draw was made before, so the result is the same.
    assert torch.equal(a, TrainAugment(MEAN, STD, DEIT, seed=3, workers=3).before_normalise(x, step=7))


def test_magnitude_ten_posterize_does_not_crash():
    # m10 makes timm's PosterizeIncreasing keep 0 bits, which Pillow 13 refuses: we write black instead.
    aug = TrainAugment(MEAN, STD, "rand-m10-n3-p1.0-inc1", seed=0)
    out = aug.before_normalise(_batch(64), step=0)
    assert out.shape == (64, 3, 32, 32)


def test_random_erasing_is_per_image_after_normalisation_and_seeded():
    x = to_model_input(_batch(16, same=True), MEAN, STD)  # (16, 3, 32, 32) float
    before = _global_states()
    aug = TrainAugment(MEAN, STD, random_erasing=1.0, seed=0)
    erased = aug.after_normalise(x.clone(), step=0)
    assert _same_states(before, _global_states())
    assert erased.shape == x.shape and erased.dtype == torch.float32
    changed = (erased != x).any(1)  # (16, 32, 32): the erased box of each image
    assert changed.flatten(1).any(1).all()  # probability 1: every image has a box
    assert len({m.numpy().tobytes() for m in changed}) == 16  # each its own box
    assert torch.equal(erased, TrainAugment(MEAN, STD, random_erasing=1.0, seed=0).after_normalise(x.clone(), 0))
    some = TrainAugment(MEAN, STD, random_erasing=0.25, seed=0).after_normalise(x.clone(), step=0)
    assert 0 < (some != x).flatten(1).any(1).sum() < 16
    assert TrainAugment(MEAN, STD, DEIT).after_normalise(x, 0) is x  # off: untouched


def test_both_on_the_way_the_engine_calls_them():
    aug = make_train_augment(_recipe(randaugment=DEIT, random_erasing=0.25), MEAN, STD, seed=0)
    images = _batch(8, size=48)
    x = aug.after_normalise(to_model_input(aug.before_normalise(images, 5), MEAN, STD), 5)
    assert x.shape == (8, 3, 48, 48) and x.dtype == torch.float32 and torch.isfinite(x).all()


# --- The tensor backend: timm's ops as batched tensor ops, against timm's PIL ops on the same draws ---

# Ops whose tensor kernel gives PIL's result to the bit (PIL's integer and float32 arithmetic, reproduced).
EXACT = [
    "AutoContrast",
    "Equalize",
    "Invert",
    "Posterize",
    "PosterizeIncreasing",
    "Solarize",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "Color",
    "ColorIncreasing",
    "Contrast",
    "ContrastIncreasing",
    "Brightness",
    "BrightnessIncreasing",
    "Sharpness",
    "SharpnessIncreasing",
    "Desaturate",
]
# Ops that differ, with the bound each keeps (mean |difference|, share of pixels off by more than 2, max |difference|,
# in uint8 levels) on smooth images and on pixel noise. Geometric ops: PIL's bicubic kernel is Keys' with a = -1,
# grid_sample's a = -0.75 (the geometry and the fill decision are PIL's: bilinear agrees to the bit but for float
# rounding); GaussianBlur: PIL approximates the Gaussian with three box blurs, the tensor kernel is a true Gaussian.
APPROX = {
    "Rotate": ((0.5, 0.005, 4), (4.0, 0.60, 30)),
    "ShearX": ((0.4, 0.005, 3), (2.7, 0.45, 18)),
    "ShearY": ((0.4, 0.005, 3), (2.7, 0.45, 18)),
    "TranslateXRel": ((0.4, 0.005, 3), (2.4, 0.40, 18)),
    "TranslateYRel": ((0.4, 0.005, 3), (2.4, 0.40, 18)),
    "GaussianBlur": ((0.3, 0.005, 4), (3.2, 0.40, 40)),
}
SPECS = ("rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5", "rand-m9-t3a")  # DeiT's ops, the plain ones, 3-Augment's


def _ops() -> dict:
    """Every op RandAugment can draw under the specs above, by name, with locvit's hyper-parameters at 32 px."""
    ops = {}
    for spec in SPECS:
        ops.update({op.name: op for op in TrainAugment(MEAN, STD, spec)._policy(32, 32).ops})
    return ops


def _single_op_plans(op, n: int) -> list[list]:
    """n one-op plans with magnitudes 0 to 10 and both signs (timm's level function, its sign drawn per image)."""
    plans = []
    for i in range(n):
        random.seed(i)
        plans.append([(op, op.level_fn(10 * i / (n - 1), op.hparams) if op.level_fn else ())])
    return plans


def _pil(images: torch.Tensor, plans: list[list]) -> torch.Tensor:
    from locvit.data.augment import _apply

    return torch.stack(
        [
            torch.from_numpy(_apply(img.permute(1, 2, 0).numpy(), plan).copy()).permute(2, 0, 1)
            for img, plan in zip(images, plans)
        ]
    )


def _noise(n: int, size: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)


@pytest.mark.parametrize("name", EXACT + list(APPROX))
def test_each_op_against_timms_pil_op_on_the_same_draws(name):
    from locvit.data.augment import apply_plans

    op = _ops()[name]
    plans = _single_op_plans(op, 48)
    for images, bound in ((_batch(48), 0), (_noise(48), 1)):
        ref, out = _pil(images, plans), apply_plans(images, plans)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        if name in EXACT:
            assert torch.equal(out, ref)
            continue
        d = (out.int() - ref.int()).abs().float()
        mean, over2, worst = APPROX[name][bound]
        assert d.mean() <= mean and (d > 2).float().mean() <= over2 and d.max() <= worst, (
            name,
            d.mean().item(),
            (d > 2).float().mean().item(),
            d.max().item(),
        )
        assert not torch.equal(out, images)  # the op did something


def test_geometric_ops_follow_pils_geometry_and_fill():
    # Bilinear has the same kernel on both sides, so any gap in the geometry (centre, inverse matrix, fill where the
    # source point leaves the image) would show; float32 rounding in grid_sample leaves a few pixels 1 level apart.
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    from locvit.data.augment import apply_plans

    hparams = dict(translate_const=14, interpolation=Image.BILINEAR, img_mean=(124, 116, 104))
    images = _noise(32)
    for op in rand_augment_transform("rand-m9-inc1", hparams).ops:
        if op.name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
            plans = _single_op_plans(op, 32)
            d = (apply_plans(images, plans).int() - _pil(images, plans).int()).abs()
            assert d.max() <= 1 and (d > 0).float().mean() < 0.01, op.name
            assert (apply_plans(images, plans) == torch.tensor([124, 116, 104]).view(1, 3, 1, 1)).all(1).any()


def test_whole_policy_on_the_tensor_backend_against_the_pil_backend():
    x = _batch(256)
    tensor = TrainAugment(MEAN, STD, DEIT, seed=5).before_normalise(x, step=3)
    pil = TrainAugment(MEAN, STD, DEIT, seed=5, backend="pil").before_normalise(x, step=3)
    plans = TrainAugment(MEAN, STD, DEIT, seed=5)._plans(256, 32, 32, np.random.default_rng([5, 0, 3, 0]))
    exact = [i for i, plan in enumerate(plans) if all(op.name in EXACT for op, _ in plan)]
    assert len(exact) > 100  # images that drew no geometric op: bitwise PIL's
    assert torch.equal(tensor[exact], pil[exact])
    assert (tensor.int() - pil.int()).abs().float().mean() < 0.5


def test_a_batch_is_each_image_through_its_own_plan():
    # Grouping images by op at each layer gives what applying each image's plan alone gives.
    from locvit.data.augment import apply_plans

    x = _batch(64)
    aug = TrainAugment(MEAN, STD, "rand-m9-n3-mstd0.5-inc1", seed=0)
    plans = aug._plans(64, 32, 32, aug._rng(0, 0))
    assert len({tuple(op.name for op, _ in plan) for plan in plans}) > 40  # images in one batch draw different ops
    batched = apply_plans(x, plans)
    assert torch.equal(batched, torch.cat([apply_plans(x[i : i + 1], plans[i : i + 1]) for i in range(64)]))


def test_op_frequencies_follow_the_policy():
    aug = TrainAugment(MEAN, STD, DEIT, seed=0)
    n = 12000
    plans = aug._plans(n, 32, 32, np.random.default_rng(0))
    names = [op.name for plan in plans for op, _ in plan]
    ops = [op.name for op in aug._policy(32, 32).ops]
    # 2 layers, each applied with probability 0.5: one op per image on average, drawn uniformly from 15
    assert abs(len(names) / n - 1.0) < 0.03
    expected = len(names) / len(ops)
    counts = {name: names.count(name) for name in ops}
    assert all(abs(c - expected) < 4 * math.sqrt(expected) for c in counts.values()), counts
    # timm's weighted choice ('tweights'): one layer, always applied, the op frequencies are the weights
    from timm.data.auto_augment import _RAND_WEIGHTED_0

    weighted = TrainAugment(MEAN, STD, "rand-m9-n1-p1.0-tweights", seed=0)
    names = [plan[0][0].name for plan in weighted._plans(n, 32, 32, np.random.default_rng(1))]
    total = sum(_RAND_WEIGHTED_0.values())
    for name, weight in _RAND_WEIGHTED_0.items():
        p = weight / total
        assert abs(names.count(name) / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3, name


@pytest.mark.parametrize("backend", ["tensor", "pil"])
def test_resume_draws_step_k_as_the_uninterrupted_run(backend):
    x = _batch(32)
    x_float = to_model_input(x, MEAN, STD)
    running = TrainAugment(MEAN, STD, DEIT, 0.5, seed=2, backend=backend)
    for step in range(4):
        ra, erased = running.before_normalise(x, step), running.after_normalise(x_float.clone(), step)
    resumed = TrainAugment(MEAN, STD, DEIT, 0.5, seed=2, backend=backend)  # a fresh process, at step 3
    assert torch.equal(ra, resumed.before_normalise(x, 3))
    assert torch.equal(erased, resumed.after_normalise(x_float.clone(), 3))


def test_posterize_to_zero_bits_is_black_on_both_backends():
    from locvit.data.augment import apply_plans

    op = _ops()["PosterizeIncreasing"]
    plans = [[(op, (0,))], [(op, (8,))], [(op, (2,))]]
    out = apply_plans(_batch(3), plans)
    assert (out[0] == 0).all() and torch.equal(out[1], _batch(3)[1]) and torch.equal(out, _pil(_batch(3), plans))


def test_backend_is_named():
    with pytest.raises(ValueError, match="backend must be 'tensor' or 'pil'"):
        TrainAugment(MEAN, STD, DEIT, backend="kornia")


def test_random_erasing_follows_timms_semantics():
    # timm's RandomErasing(p, mode='pixel', max_count=1): one box of area 2-33 % and aspect 0.3-3.3 with
    # probability p, normal noise inside; the draws come from the run's Generator, so compare distributions.
    from timm.data.random_erasing import RandomErasing

    n, h, w = 4000, 32, 32
    aug = TrainAugment(MEAN, STD, random_erasing=0.25, seed=0)
    boxes = [aug.erase_boxes(64, h, w, step)[1] for step in range(n // 64)]
    boxes = np.concatenate(boxes)
    rate = len(boxes) / (n // 64 * 64)
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    area, aspect = bh * bw / (h * w), bh / bw
    assert area.min() >= 0.015 and area.max() <= 0.36 and aspect.min() >= 0.28 and aspect.max() <= 3.6

    torch.manual_seed(0)
    random.seed(0)
    zero = torch.zeros(n, 1, h, w)
    erased = RandomErasing(0.25, mode="pixel", max_count=1, device="cpu")(zero.clone()) != 0  # (n, 1, h, w)
    timm_hit = erased.flatten(1).any(1)
    timm_area = erased.flatten(1).float().mean(1)[timm_hit].numpy()
    assert abs(rate - timm_hit.float().mean().item()) < 0.04
    assert abs(area.mean() - timm_area.mean()) < 0.015  # both about 0.17


def test_random_erasing_writes_normal_noise_in_its_boxes_only():
    x = torch.full((64, 3, 32, 32), 7.0)
    aug = TrainAugment(MEAN, STD, random_erasing=1.0, seed=3)
    ids, boxes, _ = aug.erase_boxes(64, 32, 32, step=0)
    out = aug.after_normalise(x.clone(), step=0)
    inside = torch.zeros(64, 1, 32, 32, dtype=torch.bool)
    for i, (top, left, bh, bw) in zip(ids, boxes):
        inside[i, :, top : top + bh, left : left + bw] = True
    inside = inside.expand_as(x)
    assert (out[~inside] == 7.0).all() and (out[inside] != 7.0).all()
    noise = out[inside]
    assert abs(noise.mean().item()) < 0.02 and abs(noise.std().item() - 1) < 0.02


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpu_result():
    # The same draws on the GPU: colour ops to the bit, geometric ops within a level (float rounding in
    # grid_sample before PIL's truncation), the same erasing boxes (their noise comes from the GPU's generator).
    from locvit.data.augment import apply_plans

    for name in EXACT + list(APPROX):
        plans = _single_op_plans(_ops()[name], 48)
        d = (apply_plans(_noise(48).cuda(), plans).cpu().int() - apply_plans(_noise(48), plans).int()).abs()
        assert d.max() <= (0 if name in EXACT else 1), name
    x = _batch(256)
    aug = TrainAugment(MEAN, STD, DEIT, 1.0, seed=0)
    cpu, gpu = aug.before_normalise(x, 0), aug.before_normalise(x.cuda(), 0)
    assert gpu.device.type == "cuda" and gpu.dtype == torch.uint8
    plans = aug._plans(256, 32, 32, aug._rng(0, 0))
    exact = [i for i, plan in enumerate(plans) if all(op.name in EXACT for op, _ in plan)]
    assert torch.equal(gpu.cpu()[exact], cpu[exact])
    # a level's difference after a warp can be amplified by a later op (Solarize's threshold, Posterize), rarely
    assert (gpu.cpu().int() - cpu.int()).abs().float().mean() < 0.1
    z = torch.zeros(256, 3, 32, 32)
    before = torch.cuda.get_rng_state()
    erased_gpu = aug.after_normalise(z.cuda(), 0)
    assert torch.equal(before, torch.cuda.get_rng_state())  # torch's global CUDA generator untouched
    assert torch.equal((erased_gpu != 0).cpu(), aug.after_normalise(z.clone(), 0) != 0)


def test_repeated_aug_order_gives_each_image_its_copies(prepared):
    loader = make_loader(prepared["train"], 48, True, torch.device("cpu"), seed=0, jit=False, repeated_aug=3)
    images = torch.cat([x for x, _ in loader])  # one epoch: as long as a plain one
    n = len(loader) * 48
    assert len(images) == n
    flat = images.flatten(1)
    # Copies sit next to each other: every image is a run of 3 equal rows (the last may be cut).
    runs = torch.cat([torch.tensor([True]), (flat[1:] != flat[:-1]).any(1)]).nonzero().flatten()
    lengths = torch.diff(torch.cat([runs, torch.tensor([n])]))
    assert (lengths[:-1] == 3).all() and 1 <= lengths[-1] <= 3


def test_repeated_aug_order_deals_copies_to_different_ranks(monkeypatch):
    import torch.distributed as dist

    n, world = 40, 4
    orders = []
    for rank in range(world):
        monkeypatch.setattr(dist, "get_world_size", lambda: world)
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        loader = types.SimpleNamespace(indices=np.arange(n, dtype="uint64"), seed=5, distributed=True)
        orders.append(repeated_aug_order(3)(loader).sample_order(epoch=2))
    assert all(len(o) == n // world for o in orders)  # the usual share per rank
    # The 3 copies of an image go to 3 different ranks: no rank sees an image twice in an epoch.
    assert all(len(set(o.tolist())) == len(o) for o in orders)
    # Together the ranks take the first n of the repeated permutation: ceil(n / 3) images, 3 copies each.
    together = np.concatenate(orders)
    assert len(together) == n and len(set(together.tolist())) == -(-n // 3)


# --- MixUp / CutMix drawn from the run's seeded generator (timm's Mixup semantics, batch mode) ---


def _mixup(mixup=0.8, cutmix=1.0, prob=1.0, switch=0.5, seed=0):
    from locvit.data.augment import BatchMixup

    return BatchMixup(mixup, cutmix, prob, switch, 0.1, 10, seed=seed)


def test_mixup_draws_depend_on_seed_and_step_only():
    x = torch.randn(8, 3, 16, 16)
    y = torch.arange(8) % 10
    a = _mixup()(x.clone(), y, step=5)
    np.random.seed(123)  # numpy's global generator (FFCV's loader thread draws from it) plays no part
    random.seed(7)
    b = _mixup()(x.clone(), y, step=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    draws = {_mixup().draw(step, 16, 16)[0] for step in range(20)}
    assert len(draws) > 15  # a new lam each step
    assert _mixup(seed=1).draw(5, 16, 16) != _mixup(seed=0).draw(5, 16, 16)


def test_mixup_alone_blends_with_the_reversed_batch():
    x = torch.randn(6, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 3, 4, 5])
    m = _mixup(cutmix=0.0)
    lam, box = m.draw(3, 8, 8)
    assert box is None and 0 < lam < 1
    out, soft = m(x.clone(), y, 3)
    assert torch.allclose(out, lam * x + (1 - lam) * x.flip(0), atol=1e-6)
    # smoothed one-hot targets mixed with the same lam (0.1 smoothing over 10 classes: 0.91 / 0.01)
    assert soft[0, 0].item() == pytest.approx(lam * 0.91 + (1 - lam) * 0.01)
    assert soft[0, 5].item() == pytest.approx(lam * 0.01 + (1 - lam) * 0.91)
    assert torch.allclose(soft.sum(1), torch.ones(6))


def test_cutmix_pastes_one_box_and_weights_targets_by_its_area():
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([1, 2, 3, 4])
    m = _mixup(mixup=0.0)
    for step in range(30):
        lam, box = m.draw(step, 16, 16)
        out, soft = m(x.clone(), y, step)
        top, bottom, left, right = box
        assert lam == pytest.approx(1 - (bottom - top) * (right - left) / 256)  # timm's correct_lam
        inside = torch.zeros(16, 16, dtype=torch.bool)
        inside[top:bottom, left:right] = True
        assert torch.equal(out[:, :, inside], x.flip(0)[:, :, inside])
        assert torch.equal(out[:, :, ~inside], x[:, :, ~inside])
        assert soft[0, 1].item() == pytest.approx(lam * 0.91 + (1 - lam) * 0.01)


def test_mixup_probability_and_switch_frequencies():
    m = _mixup(prob=0.5, switch=0.25)
    draws = [m.draw(step, 32, 32) for step in range(4000)]
    mixed = [(lam, box) for lam, box in draws if lam < 1.0 or box is not None]
    assert abs(len(mixed) / 4000 - 0.5) < 0.03
    assert abs(sum(box is not None for _, box in mixed) / len(mixed) - 0.25) < 0.03
