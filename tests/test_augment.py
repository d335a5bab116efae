"""Per-sample augmentations (RandAugment, random erasing) and repeated augmentation's order."""

from __future__ import annotations

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
