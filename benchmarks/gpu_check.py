"""The GPU check (``make gpu-check``): does locvit run on this NVIDIA GPU, and how fast.

Sections, each a function returning a JSON-able dict (a section that fails records its
error and the others still run), all written to ``benchmarks/results/gpu.json``:

- ``cuda_tests``: the tests marked ``cuda`` (pytest -m cuda), their counts and exit status;
- ``demo_training``: a short training of demo variants (params.yaml, 2 epochs, seed 0)
  through ``locvit train`` with bf16 autocast, torch.compile and channels_last, each twice:
  as the recipe says and with ``train.deterministic`` on (what bitwise repeats cost); needs
  FFCV (else the section says why and the synthetic sections below still run);
- ``throughput``: training images/s of each family at 224 px (forward, backward, AdamW
  step on a fixed on-device batch; 64 px with ``--quick``), with model FLOPs utilisation:
  images/s x 3 x the forward FLOPs of one image (:func:`locvit.analysis.profile.gmacs` x 2,
  counted on the CPU with dense attention) over the GPU's dense bf16 peak
  (:data:`PEAK_BF16_TFLOPS`; an unknown GPU gets MFU null and says so);
- ``lsa_vs_nest``: LSA-T's training images/s over NesT-T's (the LSA paper reports 2.7x);
- ``restrict_attention``: MaiT's restrict-masked attention (all heads, 3x3) through
  FlexAttention vs dense masked attention vs unmasked fused attention, forward +
  backward, at 196, 1024 and 4096 patch tokens (plus the class token);
- ``augmentation``: the tensor backend's RandAugment m9 + normalisation + erasing 0.25
  (locvit.data.augment) on synthetic uint8 batches on the device, images/s;
- ``feed``: FFCV's loader over the demo's training split with that augmentation on the
  device, images/s (or why it could not run).

Before any section it reports the node (:func:`node_report`): the C compiler and Python headers
(Triton builds torch.compile's CUDA launchers with them), glibc and libstdc++ (the wheelhouse's
ffcv and its libraries need glibc >= 2.34 and GLIBCXX_3.4.30) and timm (pyproject.toml's pin),
and stops with what to install when one is missing, unless ``--allow-missing`` names it.

``--quick`` runs every section at tiny sizes (the CPU self-test, tests/test_gpu_check.py).
``problems`` in gpu.json lists every failure; the command exits 1 when there is one. A check
that did not check is a failure too: a section that did not run (``ran: false``; ``cuda_tests``
when no CUDA-marked test ran, as on the CPU, where they all skip) unless ``--allow-skipped``
names it, and an FFCV that cannot be imported (``demo_training`` and ``feed`` then skip, and
only synthetic batches are measured) unless ``--allow-no-ffcv``.
Timings alternate between the things compared (benchmarks/common.py) and are medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig  # noqa: F401  (locvit.toolchain's probe reads it; tests hide Python.h through it)
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (benchmarks/common.py)
import wheelhouse  # noqa: E402  (benchmarks/wheelhouse.py: what the node must provide)
from locvit import toolchain  # noqa: E402  (the compiler and Python headers Triton builds with)

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / "wheelhouse"

# Dense bf16 tensor-core peaks in TFLOP/s (vendor data sheets, without sparsity), matched in
# this order against torch.cuda.get_device_name(): the more specific names first.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
)

# The families at 224 px: label -> (timm entrypoint, keyword arguments).
FAMILIES = {
    "deit_tiny": ("deit_tiny_patch16_224", {}),
    "mait_tiny": ("mait_tiny_patch16_224", {}),
    "mait_tiny_restrict": ("mait_tiny_patch16_224", {"mask_mode": "restrict", "mask_type": "hard"}),
    "lsa_tiny": ("lsa_tiny_224", {}),
    "ibit_tiny": ("ibit_tiny_patch16_224", {}),
    "convit_tiny": ("convit_tiny", {}),
    "nest_tiny": ("nest_tiny", {}),
}
LSA_PAPER_RATIO = 2.7  # LSA-T over NesT-T, as the LSA paper reports it
DEMO_VARIANTS = ("deit", "mait_sch1", "lsa")
FFCV_SECTIONS = ("demo_training", "feed")  # skipped without FFCV
RANDAUGMENT, ERASING = "rand-m9-mstd0.5-inc1", 0.25
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def peak_for_name(name: str) -> tuple[float | None, str]:
    """The dense bf16 peak (TFLOP/s) of the GPU that torch names ``name``, and how it was found (or why not)."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops, f"{name!r} matched {key!r} in gpu_check.PEAK_BF16_TFLOPS"
    return None, f"unknown GPU {name!r}: no bf16 peak in gpu_check.PEAK_BF16_TFLOPS, so MFU is null"


def peak_bf16(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, f"no bf16 peak for {device.type}: MFU is computed on NVIDIA GPUs only"
    return peak_for_name(torch.cuda.get_device_name(device))


def settings(device: torch.device, quick: bool) -> dict:
    """Sizes and switches: the real ones on CUDA, tiny ones for --quick (the CPU self-test)."""
    cuda = device.type == "cuda"
    return {
        "amp": "bf16" if cuda else "off", "compile": cuda, "channels_last": cuda,
        "image_size": 64 if quick else 224, "train_batch": 2 if quick else 128, "repeats": 2 if quick else 10,
        "steps_per_repeat": 1 if quick else 5,
        "attention_sides": (4, 8) if quick else (14, 32, 64), "attention_tokens_per_batch": 256 if quick else 65536,
        "augment_size": 32 if quick else 224, "augment_batch": 8 if quick else 256,
        "demo_epochs": 2, "demo_variants": DEMO_VARIANTS[:1] if quick else DEMO_VARIANTS,
        "feed_batch": 64 if quick else 256, "feed_epochs": 1 if quick else 3,
    }


def _autocast(device: torch.device, amp: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16")


# ---------------------------------------------------------------- sections

def cuda_test_files(tests: Path = REPO / "tests") -> list[Path]:
    """The test files holding a test marked ``cuda`` (only those are collected: on a node
    without MLflow or Snakemake the others would not import)."""
    marked = re.compile(r"^\s*(@pytest\.mark\.cuda\b|pytestmark\s*=.*\bpytest\.mark\.cuda\b)", re.M)
    return sorted(p for p in tests.glob("test_*.py") if marked.search(p.read_text()))


def cuda_tests(timeout: int = 900) -> dict:
    files = cuda_test_files()
    # Only the plugins named here: whatever else a node has installed stays out of the run.
    plugins = ["-p", "pytest_timeout"] if importlib.util.find_spec("pytest_timeout") else []
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *plugins,
           *(str(f.relative_to(REPO)) for f in files)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)",
                                                summary)}
    # every test skipped (no CUDA device: the CPU self-test) checks nothing
    ran = any(counts.get(k) for k in ("passed", "failed", "error", "errors", "xfailed", "xpassed"))
    return {"command": " ".join(cmd[1:]), "files": [str(f.relative_to(REPO)) for f in files],
            "ran": ran, **({} if ran else {"reason": f"no CUDA-marked test ran ({summary or 'no output'})"}),
            "returncode": proc.returncode, "counts": counts, "summary": summary,
            "ok": proc.returncode == 0 and not counts.get("failed") and not counts.get("error"),
            "output_tail": out[-3000:]}


def ffcv_status() -> dict:
    try:
        import ffcv  # noqa: F401
        import ffcv.loader  # noqa: F401  (loads the compiled extension and its shared libraries)
    except Exception as err:  # ImportError, OSError from a missing shared library
        reason = f"{type(err).__name__}: {err}"
        needs = (_wheelhouse_info() or {}).get("node_needs")
        if isinstance(err, OSError) and needs:
            reason += (f" (the wheelhouse's shared libraries need glibc >= {needs.get('glibc')} and a libstdc++ "
                       f"with GLIBCXX_{needs.get('glibcxx')}; this node: glibc {platform.libc_ver()[1] or 'unknown'})")
        return {"available": False, "reason": reason}
    return {"available": True, "version": getattr(ffcv, "__version__", None)}


def demo_data(work: Path, given: Path | None = None) -> tuple[Path | None, str]:
    """The demo's prepared train/val files and manifest: ``given`` (--demo-data), the wheelhouse's
    copy, results/demo/data, or ``locvit prepare`` here (which needs scikit-learn)."""
    if given is not None:
        return given, str(given)
    packed = WHEELHOUSE / "demo-data.tar.gz"
    if packed.is_file():
        out = work / "demo-data"
        with tarfile.open(packed) as tar:
            tar.extractall(out, filter="data")
        return out, str(packed.relative_to(REPO))
    done = REPO / "results" / "demo" / "data"
    if all((done / f).is_file() for f in ("train.beton", "val.beton", "manifest.json")):
        return done, str(done.relative_to(REPO))
    out = work / "demo-data"
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "locvit", "prepare", "--params", str(REPO / "params.yaml"),
                           "--train", str(out / "train.beton"), "--val", str(out / "val.beton"),
                           "--test", str(out / "test.beton"), "--manifest", str(out / "manifest.json")],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"locvit prepare failed: {(proc.stdout + proc.stderr)[-1500:]}"
    return out, "locvit prepare (params.yaml) in a temporary folder"


def demo_data_or_skip(work: Path, s: dict, without_ffcv: str) -> tuple[Path | None, str | None, dict | None]:
    """The demo's prepared data and where it came from, or a section's "did not run" record (FFCV
    missing: ``without_ffcv`` says what happens instead)."""
    status = ffcv_status()
    if not status["available"]:
        return None, None, {"ran": False, "skipped_for": "ffcv",
                            "reason": f"FFCV cannot be imported here ({status['reason']}){without_ffcv}"}
    data, source = demo_data(work, s.get("demo_data"))
    return (data, source, None) if data is not None else (None, None, {"ran": False, "reason": source})


def demo_training(device: torch.device, s: dict, work: Path, timeout: int = 900) -> dict:
    import yaml

    data, source, skipped = demo_data_or_skip(
        work, s, ": locvit train cannot read its data; the model and augmentation sections use synthetic batches")
    if skipped:
        return skipped
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    recipe = dict(epochs=s["demo_epochs"], warmup_epochs=1, device=device.type, amp=s["amp"],
                  compile=s["compile"], channels_last=s["channels_last"])
    params["train"].update(recipe)
    for v in params["variants"].values():  # a variant's own warm-up must stay below the epochs
        if "warmup_epochs" in v.get("train", {}):
            v["train"]["warmup_epochs"] = 1
    params["seeds"] = [0]
    runs = {}
    for variant in s["demo_variants"]:
        # the same training twice, the second with deterministic kernels: what train.deterministic costs
        run = _demo_run(params, variant, data, work / "default", False, timeout)
        det = _demo_run(params, variant, data, work / "deterministic", True, timeout)
        run["deterministic"] = det
        if "history" in run and "history" in det:  # the last epoch's: after torch.compile's first steps
            run["deterministic_slowdown"] = (run["history"][-1]["train_images_per_s"]
                                             / det["history"][-1]["train_images_per_s"])
            run["deterministic_wall_ratio"] = det["wall_s"] / run["wall_s"]
        runs[variant] = run
    return {"ran": True, "data": source, "recipe": recipe, "seed": 0, "runs": runs,
            "ok": all(r["returncode"] == 0 and "history" in r and "history" in r["deterministic"]
                      for r in runs.values()),
            "note": "the demo's 32 px images at batch 16: shows that training works, not how fast a GPU trains; "
                    "each variant trains twice, the second time with train.deterministic on (runs.<variant>"
                    ".deterministic); deterministic_slowdown is the last epoch's images/s without it over with it, "
                    "deterministic_wall_ratio the whole command's time with it over without (the second run "
                    "may find torch.compile's cache warm)"}


def _demo_run(params: dict, variant: str, data: Path, work: Path, deterministic: bool, timeout: int) -> dict:
    """``locvit train`` of one demo variant at seed 0: exit status, wall time, the epochs' numbers."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    params = {**params, "train": {**params["train"], "deterministic": deterministic}}
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    runs_dir = work / "runs" / variant
    cmd = [sys.executable, "-m", "locvit", "train", "--params", str(params_file), "--variant", variant,
           "--train-data", str(data / "train.beton"), "--val-data", str(data / "val.beton"),
           "--manifest", str(data / "manifest.json"), "--runs-dir", str(runs_dir),
           "--tracking-db", str(work / "mlflow.db"), "--no-progress"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    metrics_file = runs_dir / "seed0" / "metrics.json"
    run = {"returncode": proc.returncode, "wall_s": wall}
    if proc.returncode == 0 and metrics_file.is_file():
        m = json.loads(metrics_file.read_text())
        run.update(history=[{k: row.get(k) for k in ("epoch", "train_loss", "train_images_per_s", "val_top1")}
                            for row in m["history"]],
                   final_val_top1=m["final_val_top1"], train_time_s=m["train_time_s"],
                   tracking=(m.get("tracking") or {}).get("status"))
    else:
        run["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    return run


def _train_step(model: torch.nn.Module, device: torch.device, s: dict, batch: int, size: int, compile_: bool):
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if s["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    net = torch.compile(model) if compile_ else model

    def step():
        for _ in range(s["steps_per_repeat"]):
            with _autocast(device, s["amp"]):
                loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return step


def throughput(device: torch.device, s: dict, families: dict = FAMILIES) -> dict:
    import timm

    import locvit.models  # noqa: F401  (registers locvit's families)
    from locvit.analysis.profile import gmacs

    peak, peak_note = peak_bf16(device)
    size, batch = s["image_size"], s["train_batch"]
    rows, fns = {}, {}
    for label, (name, kwargs) in families.items():
        try:
            torch.manual_seed(0)
            model = timm.create_model(name, img_size=size, **kwargs)
            gm = gmacs(model, size)  # on the CPU: dense attention, every matmul counted
            model = model.to(device).train()
            row = {"model": name, "kwargs": kwargs, "gmacs_forward": gm, "train_flops_per_image": 3 * 2 * gm * 1e9,
                   "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "compiled": s["compile"]}
            try:
                fn = _train_step(model, device, s, batch, size, s["compile"])
                fn()  # the first steps compile: out of the timing, and a failure is this family's alone
            except Exception as err:
                if not s["compile"]:
                    raise
                # torch.compile failed on this family: measured eager, and the error kept
                row.update(compiled=False, compile_error=f"{type(err).__name__}: {str(err)[:2000]}")
                fn = _train_step(model, device, s, batch, size, False)
                fn()
            fns[label], rows[label] = fn, row
        except Exception as err:
            rows[label] = {"model": name, "kwargs": kwargs, "error": f"{type(err).__name__}: {str(err)[:2000]}",
                           "images_per_s": None, "mfu": None}
    times = common.alternate(fns, s["repeats"], warmup=1) if fns else {}
    for label, t in times.items():
        ips = batch * s["steps_per_repeat"] / common.median(t)
        rows[label]["images_per_s"] = ips
        rows[label]["achieved_tflops"] = ips * rows[label]["train_flops_per_image"] / 1e12
        rows[label]["mfu"] = rows[label]["achieved_tflops"] / peak if peak else None
    return {"image_size": size, "batch": batch, "amp": s["amp"], "compile": s["compile"],
            "channels_last": s["channels_last"], "peak_bf16_tflops": peak, "peak_note": peak_note,
            "flops_note": "training FLOPs = 3 x forward; forward counted by torch's FlopCounterMode on the CPU with "
                          "dense attention (matmuls and convolutions only)",
            "families": rows}


def lsa_vs_nest(tp: dict) -> dict:
    lsa, nest = tp["families"].get("lsa_tiny", {}), tp["families"].get("nest_tiny", {})
    ratio = lsa["images_per_s"] / nest["images_per_s"] if lsa.get("images_per_s") and nest.get("images_per_s") \
        else None
    return {"lsa_tiny_images_per_s": lsa.get("images_per_s"), "nest_tiny_images_per_s": nest.get("images_per_s"),
            "ratio": ratio, "paper_ratio": LSA_PAPER_RATIO}


def restrict_attention(device: torch.device, s: dict) -> dict:
    """Restrict-masked attention (every head, 3x3) by kernel, alone (one block's attention module)."""
    import timm

    import locvit.models  # noqa: F401

    backward = device.type == "cuda"  # FlexAttention off CUDA runs eager and forward only
    rows = {}
    for side in s["attention_sides"]:
        tokens = side * side
        batch = max(1, s["attention_tokens_per_batch"] // tokens)
        fns, row = {}, {"patch_tokens": tokens, "sequence": tokens + 1, "batch": batch}
        for label, kwargs in (("flex", dict(masked_heads="all", mask_mode="restrict", mask_type="hard",
                                            restrict_kernel="flex")),
                              ("dense_masked", dict(masked_heads="all", mask_mode="restrict", mask_type="hard",
                                                    restrict_kernel="dense")),
                              ("full_fused", dict(masked_heads="none"))):
            model = timm.create_model("mait_tiny_patch16_224", img_size=side * 16, depth=1, num_classes=0, **kwargs)
            attn = model.blocks[0].attn.to(device).train(backward)
            x = torch.randn(batch, tokens + 1, attn.qkv.in_features, device=device, requires_grad=backward)

            def fn(attn=attn, x=x):
                with _autocast(device, s["amp"]), torch.set_grad_enabled(backward):
                    out = attn(x)
                if backward:
                    out.float().sum().backward()

            try:
                fn()
                fns[label] = fn
                row[f"{label}_kernel_used"] = "flex" if label == "flex" and attn._flex(x) else \
                    ("sdpa" if label != "flex" else "dense (FlexAttention not taken here)")
            except Exception as err:
                row[f"{label}_error"] = f"{type(err).__name__}: {err}"
        times = common.alternate(fns, s["repeats"], warmup=1)
        for label, t in times.items():
            row[f"{label}_ms"] = 1e3 * common.median(t)
        for label in ("flex", "full_fused"):
            if f"{label}_ms" in row and "dense_masked_ms" in row:
                row[f"dense_masked_over_{label}"] = row["dense_masked_ms"] / row[f"{label}_ms"]
        rows[str(tokens)] = row
    return {"pass": "forward+backward" if backward else "forward only (FlexAttention off CUDA has no backward)",
            "mask": "restrict, hard 3x3 neighbourhood on all 3 heads (mait_tiny: 192-d)", "amp": s["amp"],
            "by_patch_tokens": rows}


def _augment(device: torch.device):
    from locvit.data.augment import TrainAugment
    from locvit.data.ffcv_io import to_model_input

    aug = TrainAugment(MEAN, STD, RANDAUGMENT, ERASING, seed=0)
    state = {"step": 0}

    def apply(images: torch.Tensor) -> torch.Tensor:
        state["step"] += 1
        x = to_model_input(aug.before_normalise(images, state["step"]), MEAN, STD)
        return aug.after_normalise(x, state["step"])

    return apply


def augmentation(device: torch.device, s: dict) -> dict:
    size, batch = s["augment_size"], s["augment_batch"]
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
    apply = _augment(device)
    times = common.alternate({"augment": lambda: apply(images)}, s["repeats"], warmup=1)
    return {"backend": "tensor", "policy": f"{RANDAUGMENT} + normalise + erasing {ERASING}", "image_size": size,
            "batch": batch, "images_per_s": batch / common.median(times["augment"]), "input": "synthetic uint8 on the device"}


def feed(device: torch.device, s: dict, work: Path) -> dict:
    data, source, skipped = demo_data_or_skip(
        work, s, "; the augmentation section measures the device side on synthetic batches")
    if skipped:
        return skipped
    from locvit.data.ffcv_io import make_loader

    loader = make_loader(data / "train.beton", s["feed_batch"], True, device, num_workers=min(8, os.cpu_count() or 1),
                         seed=0, translate=1, jit=False)
    apply = _augment(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rates = {}
    for label, use_aug in (("loader", False), ("loader_augment", True)):
        n, start = 0, None
        for epoch in range(s["feed_epochs"] + 1):  # the first epoch warms up, untimed
            if epoch == 1:
                sync()
                start = time.perf_counter()
            for images, _ in loader:
                x = apply(images) if use_aug else images
                n += len(x) if epoch else 0
        sync()
        rates[label] = n / (time.perf_counter() - start)
    return {"ran": True, "data": source, "image_size": 32, "batch": s["feed_batch"], "epochs_timed": s["feed_epochs"],
            "loader_images_per_s": rates["loader"], "loader_augment_images_per_s": rates["loader_augment"]}


# ---------------------------------------------------------------- the node

NODE_PIECES = ("compiler", "python-headers", "glibc", "libstdcxx", "timm")


def probe_glibc() -> str | None:
    """glibc's version (``os.confstr("CS_GNU_LIBC_VERSION")``, "glibc 2.36"; else ``platform.libc_ver()``)."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        found = ""
    if found.startswith("glibc "):
        return found.split()[1]
    lib, version = platform.libc_ver()
    return version if lib == "glibc" and version else None


def libstdcxx_path() -> tuple[str | None, str]:
    """The libstdc++ this process runs with: the one mapped into it (torch has loaded it; /proc/self/maps),
    else the first ``libstdc++.so.6`` that ``ldconfig -p`` lists; and how it was found."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            if "/libstdc++.so" in line:
                return line.split()[-1], "loaded by this process (/proc/self/maps)"
    except OSError:
        pass
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    found = re.search(r"^\s*libstdc\+\+\.so\.6 .*=> (\S+)", out, flags=re.M)
    return (found.group(1), "ldconfig -p") if found else (None, "not loaded, and not in ldconfig -p")


def probe_libstdcxx() -> dict:
    """The libstdc++ (:func:`libstdcxx_path`) and the newest ``GLIBCXX_`` symbol version it provides: its
    bytes searched for the version strings, as ``strings libstdc++.so.6 | grep GLIBCXX`` would (a
    libstdc++ provides every version up to its newest; gcc 12's newest is GLIBCXX_3.4.30)."""
    path, how = libstdcxx_path()
    if path is None or not Path(path).is_file():
        return {"path": path, "how": how, "glibcxx": None}
    versions = re.findall(rb"GLIBCXX_(\d+(?:\.\d+)+)", Path(path).read_bytes())
    newest = max((v.decode() for v in versions), key=wheelhouse.version_tuple, default=None)
    return {"path": path, "how": how, "glibcxx": newest}


def probe_timm() -> str | None:
    """The version of the timm that ``import timm`` gives here (the wheelhouse's over the node's)."""
    try:
        import timm
    except ImportError:
        return None
    return getattr(timm, "__version__", None)


def node_needs() -> dict[str, str]:
    """What the node must provide: the wheelhouse's ``node_needs`` (wheelhouse.json) where there is one,
    raised to at least benchmarks/wheelhouse.py's, with timm at pyproject.toml's pin."""
    return wheelhouse.node_needs((_wheelhouse_info() or {}).get("node_needs"))


def node_report(needs: dict[str, str] | None = None) -> dict:
    """The node's compiler, Python headers, glibc, libstdc++ and timm against ``needs``; ``missing``
    maps each piece (:data:`NODE_PIECES`) that is missing or too old to what to install."""
    needs = needs or node_needs()
    older = lambda have, need: have is None or wheelhouse.version_tuple(have) < wheelhouse.version_tuple(need)  # noqa: E731
    cc, headers = toolchain.probe_compiler(), toolchain.probe_python_headers()
    glibc, cxx, timm_version = probe_glibc(), probe_libstdcxx(), probe_timm()
    missing = toolchain.missing_pieces(cc, headers)  # the compiler and headers Triton builds with
    if older(glibc, needs["glibc"]):
        missing["glibc"] = (f"glibc {glibc or 'not found'}; the wheelhouse's ffcv and its libraries need glibc >= "
                            f"{needs['glibc']}: use a node with a newer one (Ubuntu 22.04, Debian 12, RHEL 9 or later) "
                            f"or build the wheelhouse (make wheelhouse) on a system no newer than this node")
    if older(cxx["glibcxx"], needs["glibcxx"]):
        missing["libstdcxx"] = (f"libstdc++ {cxx['path'] or 'not found'} ({cxx['how']}) provides GLIBCXX_"
                                f"{cxx['glibcxx'] or '?'} at most; the wheelhouse's libraries need GLIBCXX_"
                                f"{needs['glibcxx']} (gcc 12's): install gcc 12's libstdc++ or newer (apt-get install "
                                f"libstdc++6, module load gcc/12, conda install -c conda-forge 'libstdcxx-ng>=12') "
                                f"and put its folder first on LD_LIBRARY_PATH")
    if timm_version != needs["timm"]:
        missing["timm"] = (f"timm {timm_version or 'not installed'}; locvit pins timm=={needs['timm']} "
                           f"(pyproject.toml): install it (make gpu-check installs the wheelhouse's; a wheelhouse "
                           f"without it: make wheelhouse again, or pip install timm=={needs['timm']})")
    return {"compiler": cc, "python_headers": headers, "glibc": glibc, "libstdcxx": cxx, "timm": timm_version,
            "needs": needs, "missing": missing}


def _parse_names(allowed):
    """An argparse type: a comma-separated list of names out of ``allowed``."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if bad := [n for n in names if n not in allowed]:
            raise argparse.ArgumentTypeError(f"{', '.join(bad)}: not one of {', '.join(allowed)}")
        return names
    return parse


# ---------------------------------------------------------------- the whole check

SECTIONS = ("cuda_tests", "demo_training", "throughput", "lsa_vs_nest", "restrict_attention", "augmentation", "feed")


def run_check(device: torch.device, quick: bool = False, sections=SECTIONS, families: dict = FAMILIES,
              demo_data_dir: Path | None = None, node: dict | None = None, allow_skipped=(),
              allow_no_ffcv: bool = False) -> dict:
    """Every section (a failing one records its error), then ``gpu.json`` written atomically
    (benchmarks/common.py's ``write_result``, into ``common.RESULTS``). ``node`` is :func:`node_report`'s;
    ``allow_skipped`` and ``allow_no_ffcv`` what :func:`problems` lets pass."""
    s = settings(device, quick)
    payload = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
               else None, "quick": quick, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()},
               "ffcv": ffcv_status(), "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
               "glibc": "".join(platform.libc_ver()),
               "wheelhouse": _wheelhouse_info(), "node": node, "sections_run": list(sections),
               "allowed": {"skipped": list(allow_skipped), "no_ffcv": allow_no_ffcv}, "errors": {}}
    s["demo_data"] = demo_data_dir
    work = Path(tempfile.mkdtemp(prefix="locvit-gpu-check-"))
    try:
        for name in sections:
            start = time.perf_counter()
            print(f"gpu-check: {name} ...", flush=True)
            try:
                if name == "cuda_tests":
                    payload[name] = cuda_tests()
                elif name == "demo_training":
                    payload[name] = demo_training(device, s, work)
                elif name == "throughput":
                    payload[name] = throughput(device, s, families)
                elif name == "lsa_vs_nest":
                    payload[name] = lsa_vs_nest(payload["throughput"])
                elif name == "restrict_attention":
                    payload[name] = restrict_attention(device, s)
                elif name == "augmentation":
                    payload[name] = augmentation(device, s)
                elif name == "feed":
                    payload[name] = feed(device, s, work)
                else:
                    raise ValueError(f"--sections: {name!r} is not a section; allowed: {', '.join(SECTIONS)}")
            except Exception as err:
                payload[name] = None
                payload["errors"][name] = "".join(traceback.format_exception_only(err)).strip()
                print(f"gpu-check: {name} failed: {payload['errors'][name]}", file=sys.stderr, flush=True)
            payload.setdefault("section_seconds", {})[name] = time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload["problems"] = problems(payload)
    payload["path"] = str(common.write_result("gpu", payload))
    return payload


def problems(payload: dict) -> list[str]:
    """What went wrong, one line each (empty: every section ran and worked; make gpu-check then exits 0).
    Not checking is a problem too: a section that did not run, unless ``allowed["skipped"]`` names it, and
    an FFCV that cannot be imported when a section needs it, unless ``allowed["no_ffcv"]``."""
    found = [f"{name}: {err}" for name, err in payload["errors"].items()]
    allowed = payload.get("allowed") or {}
    skip_ok, no_ffcv_ok = set(allowed.get("skipped") or ()), bool(allowed.get("no_ffcv"))
    ffcv = payload.get("ffcv") or {}
    needs_ffcv = [n for n in FFCV_SECTIONS if n in payload.get("sections_run", ()) and n not in skip_ok]
    if not ffcv.get("available", True) and needs_ffcv and not no_ffcv_ok:
        found.append(f"ffcv: cannot be imported ({ffcv.get('reason')}), so {' and '.join(needs_ffcv)} did not run "
                     f"(only synthetic batches were measured): install it (make gpu-check installs the wheelhouse's) "
                     f"or pass --allow-no-ffcv")
    for name in payload.get("sections_run", ()):
        section = payload.get(name)
        if not isinstance(section, dict) or section.get("ran", True) or name in skip_ok:
            continue
        if section.get("skipped_for") == "ffcv":  # said once, by the ffcv line above
            continue
        found.append(f"{name}: did not run ({section.get('reason')}); --allow-skipped {name} accepts that")
    tests = payload.get("cuda_tests")
    if tests and not tests["ok"]:
        found.append(f"cuda_tests: {tests['summary']}")
    demo = payload.get("demo_training")
    if demo and demo.get("ran") and not demo["ok"]:
        found += [f"demo_training {v}{' (deterministic)' if det else ''}: exit {r['returncode']}"
                  for v, run in demo["runs"].items() for det, r in ((False, run), (True, run["deterministic"]))
                  if "history" not in r]
    for label, row in ((payload.get("throughput") or {}).get("families") or {}).items():
        if "error" in row:
            found.append(f"throughput {label}: {row['error'][:300]}")
    for tokens, row in ((payload.get("restrict_attention") or {}).get("by_patch_tokens") or {}).items():
        found += [f"restrict_attention {tokens} tokens {k}: {v[:300]}" for k, v in row.items() if k.endswith("_error")]
    return found


def _wheelhouse_info() -> dict | None:
    f = WHEELHOUSE / "wheelhouse.json"
    if not f.is_file():
        return None
    info = json.loads(f.read_text())
    return {"total_bytes": info.get("total_bytes"), "requirements": info.get("requirements"),
            "shared_libraries": info.get("shared_libraries"), "built_against": info.get("built_against"),
            "node_needs": info.get("node_needs")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description="locvit's GPU check; writes benchmarks/results/gpu.json and exits 1 when anything failed or "
                    "was not checked. It first checks the node (C compiler, Python headers, glibc, libstdc++, timm) "
                    "and stops with what to install when one is missing.")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the self-test's device)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that every section runs, measures nothing")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--demo-data", type=Path, help="a folder with the demo's train.beton, val.beton and manifest.json "
                                                   "(default: the wheelhouse's, results/demo/data, or locvit prepare)")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS, help="where gpu.json goes (default %(default)s)")
    ap.add_argument("--allow-missing", type=_parse_names(NODE_PIECES), action="extend", default=[],
                    metavar="PIECE[,PIECE]", help="run although the node lacks these (or has them too old): "
                                                  f"{', '.join(NODE_PIECES)}; by default any one stops the check")
    ap.add_argument("--allow-skipped", type=_parse_names(SECTIONS), action="extend", default=[],
                    metavar="SECTION[,SECTION]", help="a section that did not run is not a problem (cuda_tests on "
                                                      "--device cpu, where every CUDA-marked test skips); by default it is")
    ap.add_argument("--allow-no-ffcv", action="store_true",
                    help="an FFCV that cannot be imported is not a problem (demo_training and feed then do not run, "
                         "and only synthetic batches are measured); by default it is")
    args = ap.parse_args(argv)
    common.RESULTS = args.results_dir
    node = node_report()
    print("gpu-check: node: " + json.dumps({k: node[k] for k in ("compiler", "python_headers", "glibc", "libstdcxx",
                                                                   "timm", "needs")}), flush=True)
    if stop := {k: v for k, v in node["missing"].items() if k not in args.allow_missing}:
        raise SystemExit("gpu-check: this node lacks what the check needs; no section ran:\n"
                         + "".join(f"  {k}: {v}\n" for k, v in stop.items())
                         + f"(--allow-missing {','.join(stop)} runs the check without them)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu-check: no CUDA device visible to torch (torch.cuda.is_available() is False); "
                         "--device cpu runs the check on the CPU")
    payload = run_check(device, quick=args.quick, sections=args.sections, demo_data_dir=args.demo_data, node=node,
                        allow_skipped=args.allow_skipped, allow_no_ffcv=args.allow_no_ffcv)
    print(json.dumps({k: payload.get(k) for k in ("device_name", "problems", "section_seconds")}, indent=1))
    print(f"gpu-check: wrote {payload['path']}")
    if payload["problems"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
