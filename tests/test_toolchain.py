"""The compiled paths on a node without a C compiler or Python's headers (:mod:`locvit.device`):
MaiT's restrict_kernel auto falls back to dense with one warning, an explicit flex and
train.compile: true stop with what to install, and a node that has both sees no change."""

from __future__ import annotations

import functools
import logging

import pytest
import timm
import torch

from locvit import device
from locvit.config.run import run_config
from locvit.device import ToolchainError
from locvit.models import mait
from locvit.train import loop

MAIT = dict(
    img_size=64,
    patch_size=4,
    embed_dim=48,
    depth=2,
    num_heads=3,
    masked_heads="sch1",
    mask_type="hard",
    mask_mode="restrict",
)  # a 16 x 16 grid: 257 tokens


@pytest.fixture
def fresh_probe(monkeypatch):
    """The per-process probe and MaiT's once-per-process warning, fresh for the test (the session's probe,
    made before the first test, is back afterwards)."""
    monkeypatch.setattr(device, "_missing_once", functools.lru_cache(maxsize=None)(device._missing_once.__wrapped__))
    monkeypatch.setattr(mait, "_WARNED_NO_TOOLCHAIN", False)


@pytest.fixture
def no_toolchain(fresh_probe, monkeypatch, tmp_path):
    """A node stand-in with neither a C compiler ($CC, cc, gcc on PATH) nor Python.h."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(device.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})


@pytest.fixture
def compiled_flex(monkeypatch):
    """CPU standing in for CUDA: FlexAttention counts as compiled (so the toolchain matters), but runs eager."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(mait, "_flex_compiles", lambda device: True)
    monkeypatch.setattr(mait, "_flex_attention", lambda device: flex_attention)
    monkeypatch.setattr(mait, "FLEX_MIN_TOKENS", 0)  # auto takes FlexAttention at the test's 257 tokens


def _pair(kernel: str):
    torch.manual_seed(0)
    model = timm.create_model("mait_tiny_patch16_224", restrict_kernel=kernel, **MAIT).eval()
    dense = timm.create_model("mait_tiny_patch16_224", restrict_kernel="dense", **MAIT).eval()
    dense.load_state_dict(model.state_dict())
    return model, dense, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def test_the_probe_names_what_is_missing_and_what_to_install(no_toolchain):
    found = device.missing_toolchain()
    assert list(found) == ["compiler", "python-headers"]
    assert "apt-get install gcc" in found["compiler"] and "conda install" in found["compiler"]
    assert "Python.h" in found["python-headers"] and "-dev" in found["python-headers"]
    assert device.missing_pieces(device.probe_compiler(), {"include": "/x", "python_h": True}).keys() == {"compiler"}


@pytest.mark.e2e  # the probe runs `cc --version`
def test_the_probe_runs_once_per_process(fresh_probe, monkeypatch, tmp_path):
    assert device.missing_toolchain() == {}  # this machine has both
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert device.missing_toolchain() == {}  # cached: the node does not change under a run
    assert list(device.missing_pieces()) == ["compiler"]  # probing afresh sees it


def test_restrict_auto_falls_back_to_dense_with_one_warning(no_toolchain, compiled_flex, caplog):
    model, dense, x = _pair("auto")
    with caplog.at_level(logging.WARNING, logger="locvit"), torch.no_grad():
        out = model(x)
        model(x)  # only MaiT's own once-per-process flag holds the second back
        torch.testing.assert_close(out, dense(x))
    assert all(b.attn._block_mask is None for b in model.blocks)  # never took FlexAttention
    said = [
        r.getMessage() for r in caplog.records if "restrict_kernel: auto runs restrict heads dense" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "compiler: no C compiler" in said[0] and "install gcc" in said[0] and "Python.h" in said[0]


def test_an_explicit_flex_request_raises_naming_what_to_install(no_toolchain, compiled_flex):
    model, _, x = _pair("flex")
    with (
        pytest.raises(
            ToolchainError,
            match=r"restrict_kernel: flex .*compiler: no C compiler.*install gcc.*"
            r"set restrict_kernel: auto",
        ),
        torch.no_grad(),
    ):
        model(x)
    assert issubclass(ToolchainError, ValueError)  # a user's error: the CLI prints it as one line


@pytest.mark.parametrize("kernel", ["auto", "flex"])
def test_with_the_toolchain_restrict_takes_flex_as_before(compiled_flex, kernel, caplog):
    """This machine's toolchain, as the session's probe found it (conftest probes before the first test)."""
    model, dense, x = _pair(kernel)
    with caplog.at_level(logging.WARNING, logger="locvit"), torch.no_grad():
        torch.testing.assert_close(model(x), dense(x), atol=1e-5, rtol=1e-4)
    assert model.blocks[0].attn._block_mask is not None  # it did take the flex path
    assert "restrict_kernel" not in caplog.text  # and said nothing of a fallback


class _Built(Exception):
    """Raised by the stand-in loader: the run got past the toolchain check to its data."""


@pytest.mark.parametrize("have_toolchain", [False, True])
def test_compile_true_stops_at_the_start_without_the_toolchain(
    prepared, tiny_params, tmp_path, monkeypatch, request, have_toolchain
):
    def loader(*args, **kwargs):
        raise _Built

    monkeypatch.setattr(loop, "make_loader", loader)
    monkeypatch.setattr(loop, "train_epochs", lambda *a: pytest.fail("a training step ran"))
    if not have_toolchain:  # a fresh probe on a node stand-in (with the toolchain: the session's probe)
        request.getfixturevalue("fresh_probe")
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.delenv("CC", raising=False)
    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"]["compile"] = True
    expected = _Built if have_toolchain else ToolchainError
    with pytest.raises(expected) as err:
        loop.train_run(
            cfg,
            prepared["train"],
            prepared["val"],
            prepared["manifest"],
            tmp_path / "run",
            tmp_path / "mlflow.db",
            show_progress=False,
            threads=1,
        )
    if not have_toolchain:
        message = str(err.value)
        assert "train.compile: true (torch.compile's inductor on cpu)" in message
        assert "compiler: no C compiler" in message and "install gcc" in message
        assert "set train.compile: false" in message and "python-headers" not in message
        assert not (tmp_path / "run" / "last.pt").exists()
