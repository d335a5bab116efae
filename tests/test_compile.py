"""What ``torch.compile`` meets: the TF32 switches a bf16 run sets (:func:`locvit.device.set_backends`) leave torch's
getters readable, and a compiled restrict MaiT on FlexAttention is one graph from its first call, with
``restrict_kernel: auto`` taking FlexAttention only from :data:`locvit.models.mait.FLEX_MIN_TOKENS` tokens.

On the CPU, Dynamo with the ``aot_eager`` backend (forward and backward graphs, no C compiler, so no
process): Inductor's TF32 reads happen on CUDA only, so here the getters themselves are what is checked."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn as nn
from torch._dynamo.utils import counters

import locvit.models  # noqa: F401  (registers MaiT)
from locvit.device import set_backends
from locvit.models import mait

CUDA = torch.device("cuda")  # set_backends only reads its type: no CUDA is touched (asserted below)


@pytest.fixture
def backends():
    """torch's process-wide TF32 and cuDNN switches as they were before the test, back after it."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1:]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_a_bf16_runs_tf32_settings_leave_torchs_getters_readable_and_compile(backends, fresh_dynamo):
    """torch's per-backend TF32 switches (``fp32_precision``) made the legacy getters raise ("mix of the
    legacy and new APIs"), which Inductor reads on CUDA (pytorch/pytorch#166387, #196728): one API now."""
    record = set_backends(CUDA, torch.bfloat16)
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert record == {"float32_matmul_precision": "high", "cudnn_allow_tf32": True, "cudnn_benchmark": True}
    assert not torch.cuda.is_initialized()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    expected = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    got = torch.autograd.grad(torch.compile(model, backend="aot_eager")(x).square().sum(), list(model.parameters()))
    torch.testing.assert_close(got, expected)
    assert counters["stats"]["unique_graphs"] == 1

    # amp off: IEEE float32 everywhere; deterministic: no autotuner
    assert set_backends(CUDA, None, deterministic=True) == {
        "float32_matmul_precision": "highest",
        "cudnn_allow_tf32": False,
        "cudnn_benchmark": False,
    }
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.benchmark
    assert set_backends(torch.device("cpu"), torch.bfloat16) == {}  # nothing set off CUDA
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("kernel", ["flex", "dense"])
def test_a_compiled_restrict_mait_is_one_graph_from_its_first_call(kernel, fresh_dynamo):
    """What the restrict heads derive from their mask (FlexAttention's block mask; the dense kernel's all-heads
    mask) is no longer cached on the module inside the traced graph, which failed Dynamo's guard on the next
    call: a second graph. Compiled FlexAttention runs on the CPU for inference only; dense trains here."""
    torch.manual_seed(0)
    model = timm.create_model(
        "mait_tiny_patch16_224",
        img_size=32,
        patch_size=4,
        embed_dim=48,
        depth=1,
        num_heads=3,
        num_classes=10,
        masked_heads="all",
        mask_mode="restrict",
        mask_type="hard",
        restrict_kernel=kernel,
    ).train(kernel == "dense")  # an 8 x 8 grid: 65 tokens
    attn = model.blocks[0].attn
    cached = lambda: attn._block_mask if kernel == "flex" else attn._restrict_cache  # noqa: E731
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.set_grad_enabled(kernel == "dense"):
        first, second = compiled(x), compiled(x)
        if kernel == "dense":
            second.square().sum().backward()
    # one graph, compiled once: no graph break, no recompile
    assert (counters["stats"]["unique_graphs"], counters["frames"]["total"]) == (1, 1), dict(counters["stats"])
    assert cached() is None  # the traced calls wrote nothing on the module
    with torch.no_grad():
        torch.testing.assert_close(second, first)
        torch.testing.assert_close(first, model(x), atol=1e-5, rtol=1e-4)  # the eager path agrees
    assert cached() is not None  # eager calls keep theirs


def test_auto_takes_flex_attention_only_from_flex_min_tokens(monkeypatch):
    """``auto``: FlexAttention where it is compiled (CUDA) and the sequence is long enough for the block-sparse
    mask to skip work; ``flex`` at any length; ``dense`` never."""
    cpu = torch.device("cpu")
    assert not mait._flex_wanted("auto", cpu, 4 * mait.FLEX_MIN_TOKENS)  # off CUDA: dense
    monkeypatch.setattr(mait, "_flex_compiles", lambda device: True)  # the CPU standing in for CUDA
    n = mait.FLEX_MIN_TOKENS
    assert [mait._flex_wanted("auto", cpu, t) for t in (197, n - 1, n, 3137)] == [False, False, True, True]
    assert [mait._flex_wanted(k, cpu, t) for k in ("flex", "dense") for t in (65, n)] == [True, True, False, False]
    # and the attention asks it with its sequence length: 8 x 8 and 32 x 32 grids (65 and 1025 tokens)
    for grid, takes in ((8, False), (32, True)):
        model = timm.create_model(
            "mait_tiny_patch16_224",
            img_size=4 * grid,
            patch_size=4,
            embed_dim=48,
            depth=1,
            num_heads=3,
            masked_heads="all",
            mask_mode="restrict",
            mask_type="hard",
        ).eval()
        attn = model.blocks[0].attn
        attn.toolchain_missing = {}  # a node that builds compiled FlexAttention
        assert attn._flex(torch.zeros(1, grid * grid + 1, 48)) is takes


def test_the_block_sparse_buffers_are_create_block_masks():
    """:func:`locvit.models.mait.flex_blocks` (from the mask, at configure) gives FlexAttention's own
    ``create_block_mask`` tensors: neighbourhoods on one to nine 128-blocks, a random control, every key kept."""
    from torch.nn.attention.flex_attention import create_block_mask

    from locvit.models.family import neighbourhood_mask

    grids = [neighbourhood_mask((g, g), (3, 3), 1) for g in (8, 14, 32)]
    for keep in grids + [mait.random_mask(grids[1], 1, seed=0), torch.ones(300, 300, dtype=torch.bool)]:
        t = keep.shape[0]
        expected = create_block_mask(lambda b, h, q, k: keep[q, k], None, None, t, t, device="cpu")
        got = mait.flex_blocks(keep)
        for name, tensor in zip(mait.FLEX_BLOCK_NAMES, got):
            assert torch.equal(tensor, getattr(expected, name)), (t, name)


@pytest.mark.parametrize("amp", [torch.bfloat16, None])
@pytest.mark.usefixtures("backends", "fresh_dynamo")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_runs_backends_then_inductor_compile_forward_and_backward(amp):
    """The order a run takes (set_backends, then torch.compile with Inductor): one graph, gradients as eager's."""
    set_backends(CUDA, amp)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)).cuda()
    x = torch.randn(4, 3, 16, 16, device="cuda")
    with torch.autocast("cuda", dtype=amp or torch.bfloat16, enabled=amp is not None):
        got = torch.autograd.grad(torch.compile(model)(x).float().square().sum(), list(model.parameters()))
        expected = torch.autograd.grad(model(x).float().square().sum(), list(model.parameters()))
    torch.testing.assert_close(got, expected, rtol=5e-2, atol=5e-2)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("masked_heads", ["sch1", "all"])
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_compiled_restrict_mait_trains_on_flex_attention_in_one_graph(masked_heads):
    """1,025 tokens (a 32 x 32 grid), restrict_kernel auto: FlexAttention, compiled forward and backward, two
    steps in one graph; some heads masked (sch1: the first) or all."""
    torch.manual_seed(0)
    model = timm.create_model(
        "mait_tiny_patch16_224",
        img_size=128,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=3,
        num_classes=10,
        masked_heads=masked_heads,
        mask_mode="restrict",
        mask_type="hard",
    ).cuda()
    attn = model.blocks[0].attn
    x = torch.randn(2, 3, 128, 128, device="cuda")
    assert attn._flex(torch.zeros(1, 1025, 48, device="cuda"))
    compiled, opt = torch.compile(model), torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(x).float().logsumexp(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert torch.isfinite(loss) and counters["stats"]["unique_graphs"] == 1
