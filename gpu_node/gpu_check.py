"""The GPU check's sections: does locvit train on this NVIDIA GPU, and how fast.

Each section is a function returning a JSON-able dict; a failing one records its error and the others still
run. ``main`` runs one group of sections (gpu_node/visit.py starts each group in a process of its own and
holds the plans, the budgets and why, :data:`gpu_node.visit.BUDGETS`); ``OUT.json`` is rewritten after every
section, a section not (yet) run shown as ``ran: false`` with why, and ``problems`` lists every failure,
a check that did not check included. ``--quick`` runs every section at tiny sizes (the CPU rehearsal).
Timings alternate between the things compared (benchmarks/common.py) and are medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig  # noqa: F401  (locvit.device's toolchain probe reads it; tests hide Python.h through it)
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import common
from gpu_node import wheelhouse  # what the node must provide
from gpu_node.visit import BUDGETS, PLANS
from locvit.device import missing_pieces, probe_compiler, probe_python_headers  # what Triton builds with

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
    "mait_tiny_sch1": ("mait_tiny_patch16_224", {"masked_heads": "sch1", "mask_type": "hard"}),
    "mait_tiny_restrict": ("mait_tiny_patch16_224", {"mask_mode": "restrict", "mask_type": "hard"}),
    "lsa_tiny": ("lsa_tiny_224", {}),
    "ibit_tiny": ("ibit_tiny_patch16_224", {}),
    "convit_tiny": ("convit_tiny", {}),
    "nest_tiny": ("nest_tiny", {}),
}
MFU_FAMILIES = ("deit_tiny", "lsa_tiny", "ibit_tiny")  # compiled, for their MFU
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
        "quick": quick,
        "amp": "bf16" if cuda else "off",
        "compile": cuda,
        "channels_last": cuda,
        "smoke_size": 32,
        "smoke_batch": 16 if quick else 64,
        "smoke_steps": 20,
        "image_size": 64 if quick else 224,
        "train_batch": 2 if quick else 128,
        "repeats": 2 if quick else 10,
        "steps_per_repeat": 1 if quick else 5,
        "attention_sides": (4, 8) if quick else (14, 32, 64),
        "attention_tokens_per_batch": 256 if quick else 65536,
        "augment_size": 32 if quick else 224,
        "augment_batch": 8 if quick else 256,
        "demo_epochs": 2,
        "demo_variants": DEMO_VARIANTS[:1] if quick else DEMO_VARIANTS,
        "feed_images": 96 if quick else 4096,
        "feed_size": 16 if quick else 64,
        "feed_batch": 8 if quick else 256,
        "feed_timed_batches": 12 if quick else 64,
        "feed_lag_matmul": 64 if quick else 8192,
        "deterministic_size": 32 if quick else 224,
        "deterministic_batch": 2 if quick else 128,
    }


def provenance(device: torch.device) -> dict:
    """Where a figure came from: the GPU, CUDA, cuDNN, Triton and torch (and the driver, where NVML answers).
    A local helper for now: locvit is getting one provenance function for every machine's fields."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = device.type == "cuda"
    found = {
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": triton_version,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "driver": None,
    }
    if cuda:
        try:
            import pynvml  # nvidia-ml-py (pyproject's gpu extra; the wheelhouse carries it)

            pynvml.nvmlInit()
            found["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - no NVML here: the driver stays unknown
            pass
    return found


def _autocast(device: torch.device, amp: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16")


# ---------------------------------------------------------------- sections


def graph_counts() -> dict:
    """torch.compile's graphs and graph breaks so far in this process (torch._dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "break_reasons": sorted(counters["graph_break"])[:5],
    }


def gemm_peak(device: torch.device, quick: bool) -> dict:
    """The bf16 matmul rate this device reaches (an 8192-square product on CUDA; a small float32 one elsewhere,
    recorded, not meaningful): the measured peak MFU is reported against beside the data sheet's."""
    n, dtype = (512, torch.float32) if quick or device.type != "cuda" else (8192, torch.bfloat16)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    times = common.alternate({"matmul": lambda: a @ b}, 3 if quick else 20, warmup=3)
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "tflops": 2 * n**3 / common.median(times["matmul"]) / 1e12,
    }


def smoke(device: torch.device, s: dict) -> dict:
    """The training path in the first minute: the measured matmul peak, ``import ffcv``, and locvit's own
    training step (:func:`locvit.train.engine.train_one_epoch` with the run's precision after
    :func:`locvit.device.set_backends`, channels_last, AdamW fused on CUDA with its found_inf, gradient
    clipping and the EMA) on a small model for ``smoke_steps`` steps of one fixed batch, compiled where a run
    compiles (CUDA): the loss must fall and stay finite."""
    import timm
    from timm.utils import ModelEmaV3

    import locvit.models  # noqa: F401  (registers locvit's families)
    from locvit.device import amp_dtype, set_backends
    from locvit.train.engine import Compute, EpochStart, StepRecipe, channels_last, train_one_epoch, update_ema

    out = {"gemm": gemm_peak(device, s["quick"]), "ffcv": ffcv_status()}
    if s["compile"]:
        out["mixed_tf32_apis"] = mixed_tf32_apis(device)
    dtype = amp_dtype("auto", device)
    out["backends"] = set_backends(device, dtype)  # as a bf16 run sets them, before its compile
    torch.manual_seed(0)
    size, batch, steps = s["smoke_size"], s["smoke_batch"], s["smoke_steps"]
    model = timm.create_model("deit_tiny_patch16_224", img_size=size, patch_size=8, depth=2, num_classes=10).to(device)
    compute = Compute(dtype, s["channels_last"])
    if compute.channels_last:
        channels_last(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if device.type == "cuda" else None)
    ema = ModelEmaV3(model, decay=0.99)
    net = torch.compile(model) if s["compile"] else model
    x = compute.inputs(torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device), MEAN, STD)
    y = torch.arange(batch, device=device) % 10
    losses = []
    start = time.perf_counter()
    for step in range(steps):  # one step an epoch: each loss is read as the run's epoch would read it
        stats = train_one_epoch(
            net,
            [(x, y)],
            optimizer,
            lambda _: 1e-3,
            start=EpochStart(step=step),
            recipe=StepRecipe(clip_grad=1.0, read_every=50),
            compute=compute,
            on_step=lambda k, ok: update_ema(ema, model, k, ok),
        )
        losses.append(stats["train_loss"])
    out.update(
        model="deit_tiny_patch16_224 (2 layers, patch 8)",
        image_size=size,
        batch=batch,
        steps=steps,
        amp=str(dtype).removeprefix("torch.") if dtype else "off",
        compiled=s["compile"],
        channels_last=compute.channels_last,
        fused_adamw=device.type == "cuda",
        clip_grad=1.0,
        ema=0.99,
        first_loss=losses[0],
        last_loss=losses[-1],
        seconds=time.perf_counter() - start,
        getters={
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        },
    )
    if s["compile"]:
        out["compile"] = graph_counts()
    out["ok"] = all(math.isfinite(v) for v in losses) and losses[-1] < 0.5 * losses[0]
    if not out["ok"]:
        raise AssertionError(f"locvit's training step did not learn one fixed batch: losses {losses}")
    return out


def mixed_tf32_apis(device: torch.device) -> dict:
    """What locvit's earlier TF32 settings did here: torch's per-backend switches (``fp32_precision``) set, then
    the legacy getters read and a small model compiled forward and backward under bf16 autocast (upstream,
    pytorch/pytorch#166387: InductorError on 2.9-2.10). Each outcome recorded; the legacy setter restores
    one consistent state after."""
    found = {}
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        for name, get in (
            ("get_float32_matmul_precision", torch.get_float32_matmul_precision),
            ("cuda_matmul_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ):
            try:
                found[name] = get()
            except Exception as err:  # noqa: BLE001 - the raise is the finding
                found[name] = f"raises {type(err).__name__}: {str(err)[:200]}"
        torch._dynamo.reset()
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).to(device)
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                torch.compile(net)(torch.randn(8, 64, device=device)).float().sum().backward()
            found["compile"] = "ok"
        except Exception as err:  # noqa: BLE001
            found["compile"] = f"fails {type(err).__name__}: {str(err)[:300]}"
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True  # torch's default
        torch._dynamo.reset()
    return found


def cuda_test_files(tests: Path = REPO / "tests") -> list[Path]:
    """The test files holding a test marked ``cuda`` (only those are collected: on a node
    without MLflow or Snakemake the others would not import)."""
    marked = re.compile(r"^\s*(@pytest\.mark\.cuda\b|pytestmark\s*=.*\bpytest\.mark\.cuda\b)", re.M)
    return sorted(p for p in tests.glob("test_*.py") if marked.search(p.read_text()))


def cuda_tests(timeout: float = 60) -> dict:
    files = cuda_test_files()
    # Only the plugins named here: whatever else a node has installed stays out of the run.
    plugins = ["-p", "pytest_timeout"] if importlib.util.find_spec("pytest_timeout") else []
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        *plugins,
        *(str(f.relative_to(REPO)) for f in files),
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
        )
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        return {
            "command": " ".join(cmd[1:]),
            "ran": False,
            "ok": False,
            "counts": {},
            "summary": "",
            "reason": f"timed out after {timeout:.0f} s (its budget)",
            "output_tail": out[-3000:],
        }
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", summary)
    }
    # every test skipped (no CUDA device: the CPU self-test) checks nothing
    ran = any(counts.get(k) for k in ("passed", "failed", "error", "errors", "xfailed", "xpassed"))
    return {
        "command": " ".join(cmd[1:]),
        "files": [str(f.relative_to(REPO)) for f in files],
        "ran": ran,
        **({} if ran else {"reason": f"no CUDA-marked test ran ({summary or 'no output'})"}),
        "returncode": proc.returncode,
        "counts": counts,
        "summary": summary,
        "ok": proc.returncode == 0 and not counts.get("failed") and not counts.get("error"),
        "output_tail": out[-3000:],
    }


def ffcv_status() -> dict:
    try:
        import ffcv  # noqa: F401
        import ffcv.loader  # noqa: F401  (loads the compiled extension and its shared libraries)
    except Exception as err:  # ImportError, OSError from a missing shared library
        reason = f"{type(err).__name__}: {err}"
        needs = (_wheelhouse_info() or {}).get("node_needs")
        if isinstance(err, OSError) and needs:
            system = (_wheelhouse_info() or {}).get("system_libraries") or []
            reason += (
                f" (the wheelhouse's shared libraries need glibc >= {needs.get('glibc')}, a libstdc++ "
                f"with GLIBCXX_{needs.get('glibcxx')}{' and ' + ', '.join(system) if system else ''} from the "
                f"system; this node: glibc {platform.libc_ver()[1] or 'unknown'})"
            )
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
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locvit",
            "prepare",
            "--params",
            str(REPO / "params.yaml"),
            "--train",
            str(out / "train.beton"),
            "--val",
            str(out / "val.beton"),
            "--test",
            str(out / "test.beton"),
            "--manifest",
            str(out / "manifest.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return None, f"locvit prepare failed: {(proc.stdout + proc.stderr)[-1500:]}"
    return out, "locvit prepare (params.yaml) in a temporary folder"


def demo_data_or_skip(work: Path, s: dict, without_ffcv: str) -> tuple[Path | None, str | None, dict | None]:
    """The demo's prepared data and where it came from, or a section's "did not run" record (FFCV
    missing: ``without_ffcv`` says what happens instead)."""
    status = ffcv_status()
    if not status["available"]:
        return (
            None,
            None,
            {
                "ran": False,
                "skipped_for": "ffcv",
                "reason": f"FFCV cannot be imported here ({status['reason']}){without_ffcv}",
            },
        )
    data, source = demo_data(work, s.get("demo_data"))
    return (data, source, None) if data is not None else (None, None, {"ran": False, "reason": source})


def demo_training(device: torch.device, s: dict, work: Path, timeout: float = 240) -> dict:
    import yaml

    data, source, skipped = demo_data_or_skip(
        work, s, ": locvit train cannot read its data; the model and augmentation sections use synthetic batches"
    )
    if skipped:
        return skipped
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    recipe = dict(
        epochs=s["demo_epochs"],
        warmup_epochs=1,
        device=device.type,
        amp=s["amp"],
        compile=s["compile"],
        channels_last=s["channels_last"],
    )
    params["train"].update(recipe)
    for v in params["variants"].values():  # a variant's own warm-up must stay below the epochs
        if "warmup_epochs" in v.get("train", {}):
            v["train"]["warmup_epochs"] = 1
    params["seeds"] = [0]
    runs, end = {}, time.monotonic() + timeout
    for i, variant in enumerate(s["demo_variants"]):
        left = end - time.monotonic()  # the section's budget shared by the runs still to go
        runs[variant] = _demo_run(params, variant, data, work, max(5.0, left / (len(s["demo_variants"]) - i)))
    return {
        "ran": True,
        "data": source,
        "recipe": recipe,
        "seed": 0,
        "runs": runs,
        "ok": all(r["returncode"] == 0 and "history" in r for r in runs.values()),
        "note": "the demo's 32 px images at batch 16: shows that training works, not how fast a GPU trains "
        "(deterministic_cost measures train.deterministic)",
    }


def _demo_run(params: dict, variant: str, data: Path, work: Path, timeout: float) -> dict:
    """``locvit train`` of one demo variant at seed 0: exit status, wall time, the epochs' numbers."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    runs_dir = work / "runs" / variant
    cmd = [
        sys.executable,
        "-m",
        "locvit",
        "train",
        "--params",
        str(params_file),
        "--variant",
        variant,
        "--train-data",
        str(data / "train.beton"),
        "--val-data",
        str(data / "val.beton"),
        "--manifest",
        str(data / "manifest.json"),
        "--runs-dir",
        str(runs_dir),
        "--tracking-db",
        str(work / "mlflow.db"),
        "--no-progress",
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "returncode": None,
            "wall_s": time.perf_counter() - start,
            "output_tail": f"timed out after {timeout:.0f} s (its share of the section's budget)",
        }
    wall = time.perf_counter() - start
    metrics_file = runs_dir / "seed0" / "metrics.json"
    run = {"returncode": proc.returncode, "wall_s": wall}
    if proc.returncode == 0 and metrics_file.is_file():
        m = json.loads(metrics_file.read_text())
        run.update(
            history=[
                {k: row.get(k) for k in ("epoch", "train_loss", "train_images_per_s", "val_top1")}
                for row in m["history"]
            ],
            final_val_top1=m["final_val_top1"],
            train_time_s=m["train_time_s"],
            tracking=(m.get("tracking") or {}).get("status"),
        )
    else:
        run["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    return run


def _train_step(model: torch.nn.Module, device: torch.device, s: dict, batch: int, size: int, compile_: bool):
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if s["channels_last"]:
        from locvit.train.engine import channels_last

        channels_last(model)  # the convolutions only, as a run does
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


def throughput(
    device: torch.device, s: dict, families: dict = FAMILIES, compile_: bool = False, saved=lambda rows: None
) -> dict:
    """Training images/s and MFU of ``families`` side by side (``compile_``: under torch.compile; then each family
    is timed as soon as it has compiled and ``saved(rows)`` is called after each, so a cut process keeps the
    families done)."""
    import timm

    import locvit.models  # noqa: F401  (registers locvit's families)
    from locvit.analysis.profile import gmacs

    peak, peak_note = peak_bf16(device)
    measured = s.get("measured_peak_tflops")
    size, batch = s["image_size"], s["train_batch"]
    rows, fns = {}, {}

    def time_them(fns: dict) -> None:
        times = common.alternate(fns, s["repeats"], warmup=1) if fns else {}
        for label, t in times.items():
            ips = batch * s["steps_per_repeat"] / common.median(t)
            rows[label]["images_per_s"] = ips
            rows[label]["achieved_tflops"] = ips * rows[label]["train_flops_per_image"] / 1e12
            rows[label]["mfu"] = rows[label]["achieved_tflops"] / peak if peak else None
            rows[label]["mfu_of_measured_peak"] = rows[label]["achieved_tflops"] / measured if measured else None

    for label, (name, kwargs) in families.items():
        try:
            torch.manual_seed(0)
            model = timm.create_model(name, img_size=size, **kwargs)
            gm = gmacs(model, size)  # on the CPU: dense attention, every matmul counted
            model = model.to(device).train()
            row = {
                "model": name,
                "kwargs": kwargs,
                "gmacs_forward": gm,
                "train_flops_per_image": 3 * 2 * gm * 1e9,
                "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                "compiled": compile_,
            }
            before = graph_counts() if compile_ else None
            try:
                compile_start = time.perf_counter()
                fn = _train_step(model, device, s, batch, size, compile_)
                fn()  # the first steps compile: out of the timing, and a failure is this family's alone
                if compile_:
                    after = graph_counts()
                    row.update(
                        compile_s=time.perf_counter() - compile_start,
                        graphs=after["graphs"] - before["graphs"],
                        graph_breaks=after["graph_breaks"] - before["graph_breaks"],
                        break_reasons=after["break_reasons"],
                    )
            except Exception as err:
                if not compile_:
                    raise
                # torch.compile failed on this family: measured eager, and the error kept
                row.update(compiled=False, compile_error=f"{type(err).__name__}: {str(err)[:2000]}")
                fn = _train_step(model, device, s, batch, size, False)
                fn()
            fns[label], rows[label] = fn, row
        except Exception as err:
            rows[label] = {
                "model": name,
                "kwargs": kwargs,
                "error": f"{type(err).__name__}: {str(err)[:2000]}",
                "images_per_s": None,
                "mfu": None,
            }
        if compile_:  # timed now, and kept: the next family's compile may be cut
            time_them({label: fns.pop(label)} if label in fns else {})
            saved(rows)
    time_them(fns)  # eager: side by side, alternating
    return {
        "image_size": size,
        "batch": batch,
        "amp": s["amp"],
        "compile": compile_,
        "channels_last": s["channels_last"],
        "peak_bf16_tflops": peak,
        "peak_note": peak_note,
        "measured_peak_tflops": measured,
        "flops_note": "training FLOPs = 3 x forward; forward counted by torch's FlopCounterMode on the CPU with "
        "dense attention (matmuls and convolutions only)",
        "families": rows,
    }


def mfu(device: torch.device, s: dict, saved=lambda rows: None) -> dict:
    """:data:`MFU_FAMILIES` under torch.compile (on CUDA): the MFU a training run would get."""
    return throughput(device, s, {k: FAMILIES[k] for k in MFU_FAMILIES}, compile_=s["compile"], saved=saved)


def lsa_vs_nest(tp: dict) -> dict:
    lsa, nest = tp["families"].get("lsa_tiny", {}), tp["families"].get("nest_tiny", {})
    ratio = lsa["images_per_s"] / nest["images_per_s"] if lsa.get("images_per_s") and nest.get("images_per_s") else None
    return {
        "lsa_tiny_images_per_s": lsa.get("images_per_s"),
        "nest_tiny_images_per_s": nest.get("images_per_s"),
        "ratio": ratio,
        "paper_ratio": LSA_PAPER_RATIO,
    }


# What FlexAttention may differ from the dense masked kernel by (torch.testing's bf16 rtol; an atol for outputs
# near 0): two kernels, two summation orders. Float32 off CUDA.
FLEX_TOLERANCE = {"bf16": (1.6e-2, 2e-2), "off": (1.3e-6, 1e-5)}


def restrict_attention(device: torch.device, s: dict) -> dict:
    """Restrict-masked attention (every head, 3x3) by kernel, alone (one block's attention module): FlexAttention,
    the dense masked kernel and unmasked fused attention, forward (+ backward on CUDA) at each of
    ``attention_sides``. FlexAttention must agree with the dense kernel within :data:`FLEX_TOLERANCE` and differ
    from the unmasked output (the mask is applied); each shape compiles once (caches reset between shapes)."""
    import timm

    import locvit.models  # noqa: F401

    backward = device.type == "cuda"  # FlexAttention off CUDA runs eager and forward only
    rtol, atol = FLEX_TOLERANCE[s["amp"]]
    rows = {}
    for side in s["attention_sides"]:
        torch._dynamo.reset()  # each shape its own static graph: no dynamic-shape recompile
        before = graph_counts()
        tokens = side * side
        batch = max(1, s["attention_tokens_per_batch"] // tokens)
        fns, row, outs = {}, {"patch_tokens": tokens, "sequence": tokens + 1, "batch": batch}, {}
        for label, kwargs in (
            ("flex", dict(masked_heads="all", mask_mode="restrict", mask_type="hard", restrict_kernel="flex")),
            ("dense_masked", dict(masked_heads="all", mask_mode="restrict", mask_type="hard", restrict_kernel="dense")),
            ("full_fused", dict(masked_heads="none")),
        ):
            torch.manual_seed(0)  # the same weights and input for every kernel: flex and dense must agree
            model = timm.create_model("mait_tiny_patch16_224", img_size=side * 16, depth=1, num_classes=0, **kwargs)
            attn = model.blocks[0].attn.to(device).train(backward)
            x = torch.randn(batch, tokens + 1, attn.qkv.in_features, device=device, requires_grad=backward)

            def fn(attn=attn, x=x, label=label):
                with _autocast(device, s["amp"]), torch.set_grad_enabled(backward):
                    out = attn(x)
                if backward:
                    out.float().sum().backward()
                return out

            try:
                outs[label] = fn().detach().float()  # the compile's call, and the output compared
                fns[label] = fn
                row[f"{label}_kernel_used"] = (
                    "flex"
                    if label == "flex" and attn._flex(x)
                    else ("sdpa" if label != "flex" else "dense (FlexAttention not taken here)")
                )
            except Exception as err:
                row[f"{label}_error"] = f"{type(err).__name__}: {err}"
        if "flex" in outs and "dense_masked" in outs:  # the same attention by two kernels
            flex, dense = outs["flex"], outs["dense_masked"]
            row["flex_vs_dense_max_abs_diff"] = (flex - dense).abs().max().item()
            row["flex_matches_dense"] = bool(torch.allclose(flex, dense, rtol=rtol, atol=atol))
            if "full_fused" in outs:
                row["flex_vs_unmasked_max_abs_diff"] = (flex - outs["full_fused"]).abs().max().item()
                row["mask_applied"] = not torch.allclose(flex, outs["full_fused"], rtol=rtol, atol=atol)
        outs.clear()
        times = common.alternate(fns, s["repeats"], warmup=1)
        for label, t in times.items():
            row[f"{label}_ms"] = 1e3 * common.median(t)
        for label in ("flex", "full_fused"):
            if f"{label}_ms" in row and "dense_masked_ms" in row:
                row[f"dense_masked_over_{label}"] = row["dense_masked_ms"] / row[f"{label}_ms"]
        after = graph_counts()
        row.update(
            graphs=after["graphs"] - before["graphs"], graph_breaks=after["graph_breaks"] - before["graph_breaks"]
        )
        rows[str(tokens)] = row
    return {
        "pass": "forward+backward" if backward else "forward only (FlexAttention off CUDA has no backward)",
        "mask": "restrict, hard 3x3 neighbourhood on all 3 heads (mait_tiny: 192-d)",
        "amp": s["amp"],
        "tolerance": {"rtol": rtol, "atol": atol},
        "by_patch_tokens": rows,
    }


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
    return {
        "backend": "tensor",
        "policy": f"{RANDAUGMENT} + normalise + erasing {ERASING}",
        "image_size": size,
        "batch": batch,
        "images_per_s": batch / common.median(times["augment"]),
        "input": "synthetic uint8 on the device",
    }


class _SyntheticImages:
    """``n`` synthetic images of ``size`` px in 10 classes, each a seeded smooth pattern with noise: the
    source that locvit's FFCV writer reads (``labels``, ``image(i, crop)``), or the files of an image folder."""

    def __init__(self, n: int, size: int):
        import numpy as np

        self.size, self.labels = size, np.arange(n) % 10

    def image(self, index: int, crop: bool = True):
        import numpy as np

        rng = np.random.default_rng(index)
        ramp = np.linspace(0, 255, self.size)
        base = (np.add.outer(ramp * rng.random(), ramp * rng.random()) / 2)[..., None] * rng.random(3)
        return np.clip(base + rng.normal(0, 20, (self.size, self.size, 3)), 0, 255).astype(np.uint8)


def synthetic_file(work: Path, s: dict) -> tuple[Path, str]:
    """An FFCV file of ``feed_images`` synthetic images (:class:`_SyntheticImages`): ``locvit prepare`` of an
    image folder of them (its training split) where scikit-learn (its split) imports, else locvit's FFCV writer
    (:func:`locvit.data.ffcv_io.write_beton`, which locvit prepare calls) on the same images. How, for the record."""
    import yaml

    from locvit.data.ffcv_io import write_beton

    images, out = _SyntheticImages(s["feed_images"], s["feed_size"]), work / "synthetic"
    try:
        import sklearn.model_selection  # noqa: F401  (what locvit prepare splits with)

        has_sklearn = True
    except ImportError:
        has_sklearn = False
    if not has_sklearn:
        path = out / "synthetic.beton"
        out.mkdir(parents=True, exist_ok=True)
        write_beton(
            path,
            images,
            range(len(images.labels)),
            max_resolution=s["feed_size"],
            num_workers=min(8, os.cpu_count() or 1),
        )
        return path, "locvit.data.ffcv_io.write_beton (locvit prepare splits with scikit-learn, which this node lacks)"
    from PIL import Image

    for i, label in enumerate(images.labels):
        folder = out / "images" / "train" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images.image(i)).save(folder / f"{i}.png")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    held_out = min(0.3, max(0.05, 20 / len(images.labels)))  # at least 2 images a class in val and in test
    params["data"] = {
        "source": "imagefolder",
        "root": str(out / "images"),
        "image_size": s["feed_size"],
        "val_fraction": held_out,
        "test_fraction": held_out,
        "write_workers": min(8, os.cpu_count() or 1),
    }
    (out / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locvit",
            "prepare",
            "--params",
            str(out / "params.yaml"),
            *(a for split in ("train", "val", "test") for a in (f"--{split}", str(out / f"{split}.beton"))),
            "--manifest",
            str(out / "manifest.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"locvit prepare of the synthetic images failed: {(proc.stdout + proc.stderr)[-1500:]}")
    return out / "train.beton", "locvit prepare (an image folder of the synthetic images; its training split)"


class _Pixels:
    """The feed's ``compute`` for the integrity check: each batch as a new int64 tensor of its pixels (no
    normalisation, so the checksums are exact; a new tensor, as the real one makes, holding no FFCV buffer)."""

    channels_last = False

    @staticmethod
    def inputs(images: torch.Tensor, mean, std) -> torch.Tensor:
        return images.to(torch.int64)


def feed(device: torch.device, s: dict, work: Path) -> dict:
    """FFCV's loader (JIT on) over a synthetic file: one epoch checked batch by batch behind a lagging device, then
    at least ``feed_timed_batches`` timed, alone and through the training feed with the augmentation."""
    status = ffcv_status()
    if not status["available"]:
        return {
            "ran": False,
            "skipped_for": "ffcv",
            "reason": f"FFCV cannot be imported here ({status['reason']}); "
            "the augmentation section measures the device side "
            "on synthetic batches",
        }
    from locvit.data.feed import TrainFeed, bounded
    from locvit.data.ffcv_io import make_loader, read_all

    path, how = synthetic_file(work, s)
    workers, batch = min(8, os.cpu_count() or 1), s["feed_batch"]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # The integrity epoch: the consumer never syncs and queues a slow matmul per batch, so the device falls
    # behind the loader, as a training step's would; per image, the pixel sum the consumer received.
    # the file's pixels as FFCV reads them on the CPU (its plain-Python pipeline: no compile for one pass)
    expected_t = torch.from_numpy(
        read_all(path, jit=False)[0].reshape(-1, s["feed_size"] ** 2 * 3).astype("int64").sum(1)
    )
    lag = torch.randn(s["feed_lag_matmul"], s["feed_lag_matmul"], device=device)
    loader, mismatched = make_loader(path, batch, False, device, num_workers=workers, jit=True), {}
    for label, new_event in (("bounded", None), ("unbounded", lambda: None)):  # one epoch each, one loader
        sums = []
        for x, _ in TrainFeed(loader, None, _Pixels(), MEAN, STD, first_step=0, ahead=2, new_event=new_event):
            for _ in range(4):
                lag = (lag @ lag).tanh_()
            sums.append(x.sum(dim=(1, 2, 3)))  # (B,) int64 on the device
        got = torch.cat(sums).cpu()
        mismatched[label] = int((got != expected_t).sum()) if got.shape == expected_t.shape else len(expected_t)
    # The timing: a random-order training loader, alone and through the feed with the augmentation, in turns by
    # epoch after one untimed epoch, until each has at least feed_timed_batches batches.
    from locvit.data.augment import TrainAugment
    from locvit.train.engine import Compute

    loader = make_loader(path, batch, True, device, num_workers=workers, seed=0, translate=1, jit=True)
    per_epoch, labels = len(loader), ("loader", "feed_augment")
    rounds = math.ceil(s["feed_timed_batches"] / per_epoch)
    seconds, images, timed = dict.fromkeys(labels, 0.0), dict.fromkeys(labels, 0), dict.fromkeys(labels, 0)
    for epoch in range(1 + 2 * rounds):
        label = labels[(epoch + 1) % 2]  # epoch 0 (untimed) and the odd ones: the loader alone
        if label == "loader":
            batches = ((images_, None) for images_, _ in bounded(loader))
        else:
            batches = TrainFeed(
                loader,
                TrainAugment(MEAN, STD, RANDAUGMENT, ERASING, seed=0),
                Compute(channels_last=s["channels_last"]),
                MEAN,
                STD,
                first_step=epoch * per_epoch,
                ahead=2,
            )
        sync()
        start = time.perf_counter()
        n = k = 0
        for x, _ in batches:
            n, k = n + len(x), k + 1
        sync()
        if epoch:
            seconds[label] += time.perf_counter() - start
            images[label] += n
            timed[label] += k
    rates = {k: {"images_per_s": images[k] / seconds[k], "batches_timed": timed[k]} for k in labels}
    return {
        "ran": True,
        "file": how,
        "images": int(expected_t.numel()),
        "image_size": s["feed_size"],
        "batch": batch,
        "jit": True,
        "num_workers": workers,
        "integrity": {
            "images_checked": int(expected_t.numel()),
            "mismatched_images": mismatched["bounded"],
            "mismatched_images_without_the_bound": mismatched["unbounded"],
            "ok": mismatched["bounded"] == 0,
            "how": f"one epoch in file order behind {s['feed_lag_matmul']}-square matmuls per batch; per image "
            "the pixel sum the consumer got against the file's (read_all)",
        },
        "loader_images_per_s": rates["loader"]["images_per_s"],
        "feed_augment_images_per_s": rates["feed_augment"]["images_per_s"],
        "batches_timed": min(r["batches_timed"] for r in rates.values()),
    }


def deterministic_cost(device: torch.device, s: dict) -> dict:
    """What ``train.deterministic`` costs: a compute-bound training step (DeiT-Tiny, bf16, channels_last, eager)
    timed with torch's default kernels and with deterministic ones, alternately, after both have warmed up."""
    import timm

    from locvit.device import set_backends

    size, batch = s["deterministic_size"], s["deterministic_batch"]
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", img_size=size).to(device).train()
    step = _train_step(model, device, s, batch, size, False)
    dtype = torch.bfloat16 if s["amp"] == "bf16" else None

    def under(deterministic: bool):
        def fn():
            torch.use_deterministic_algorithms(deterministic)
            set_backends(device, dtype, deterministic)
            step()

        return fn

    try:
        times = common.alternate({"default": under(False), "deterministic": under(True)}, s["repeats"], warmup=2)
    finally:
        torch.use_deterministic_algorithms(False)
        set_backends(device, dtype, False)
    ms = {k: 1e3 * common.median(t) / s["steps_per_repeat"] for k, t in times.items()}
    return {
        "model": "deit_tiny_patch16_224",
        "image_size": size,
        "batch": batch,
        "amp": s["amp"],
        "step_ms": ms,
        "slowdown": ms["deterministic"] / ms["default"],
        "note": "both on warm caches (2 untimed repeats each first), timed in alternation; eager, so compile "
        "caches play no part",
    }


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
    raised to at least gpu_node/wheelhouse.py's, with timm at constraints.txt's pin."""
    return wheelhouse.node_needs((_wheelhouse_info() or {}).get("node_needs"))


def node_report(needs: dict[str, str] | None = None) -> dict:
    """The node's compiler, Python headers, glibc, libstdc++ and timm against ``needs``; ``missing``
    maps each piece (:data:`NODE_PIECES`) that is missing or too old to what to install."""
    needs = needs or node_needs()
    older = lambda have, need: have is None or wheelhouse.version_tuple(have) < wheelhouse.version_tuple(need)  # noqa: E731
    cc, headers = probe_compiler(), probe_python_headers()
    glibc, cxx, timm_version = probe_glibc(), probe_libstdcxx(), probe_timm()
    missing = missing_pieces(cc, headers)  # the compiler and headers Triton builds with
    if older(glibc, needs["glibc"]):
        missing["glibc"] = (
            f"glibc {glibc or 'not found'}; the wheelhouse's ffcv and its libraries need glibc >= "
            f"{needs['glibc']}: use a node with a newer one (Ubuntu 22.04, Debian 12, RHEL 9 or later) "
            f"or build the wheelhouse (make -C gpu_node wheelhouse) on a system no newer than this node"
        )
    if older(cxx["glibcxx"], needs["glibcxx"]):
        missing["libstdcxx"] = (
            f"libstdc++ {cxx['path'] or 'not found'} ({cxx['how']}) provides GLIBCXX_"
            f"{cxx['glibcxx'] or '?'} at most; the wheelhouse's libraries need GLIBCXX_"
            f"{needs['glibcxx']} (gcc 12's): install gcc 12's libstdc++ or newer (apt-get install "
            f"libstdc++6, module load gcc/12, conda install -c conda-forge 'libstdcxx-ng>=12') "
            f"and put its folder first on LD_LIBRARY_PATH"
        )
    if timm_version != needs["timm"]:
        missing["timm"] = (
            f"timm {timm_version or 'not installed'}; locvit pins timm=={needs['timm']} "
            f"(constraints.txt): install it (gpu_node/visit.py installs the wheelhouse's; a wheelhouse "
            f"without it: make -C gpu_node wheelhouse again, or pip install timm=={needs['timm']})"
        )
    return {
        "compiler": cc,
        "python_headers": headers,
        "glibc": glibc,
        "libstdcxx": cxx,
        "timm": timm_version,
        "needs": needs,
        "missing": missing,
    }


def _parse_names(allowed):
    """An argparse type: a comma-separated list of names out of ``allowed``."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if bad := [n for n in names if n not in allowed]:
            raise argparse.ArgumentTypeError(f"{', '.join(bad)}: not one of {', '.join(allowed)}")
        return names

    return parse


# ---------------------------------------------------------------- the whole check

SECTIONS = tuple(BUDGETS)


def _figure(x, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def summary_line(name: str, section: dict | None) -> str:
    """One line of ``section``'s figures (what a cut command's log keeps, beside gpu.json)."""
    if not isinstance(section, dict):
        return "failed"
    if section.get("ran") is False:
        return f"not run: {section.get('reason')}"
    if name == "smoke":
        g = section["gemm"]
        mix = section.get("mixed_tf32_apis", {}).get("compile")
        return (
            f"{g['dtype']} matmul {g['tflops']:.1f} TFLOP/s; mixed TF32 APIs + compile: {mix or 'not tried'}; "
            f"loss {section['first_loss']:.3f} -> "
            f"{section['last_loss']:.3f} in {section['steps']} steps (compiled {section['compiled']}"
            + (
                f", {section['compile']['graphs']} graph(s), {section['compile']['graph_breaks']} break(s)"
                if "compile" in section
                else ""
            )
            + f"); ffcv {'ok' if section['ffcv']['available'] else 'MISSING'}"
        )
    if name == "cuda_tests":
        return f"{section['summary']} (exit {section['returncode']})"
    if name in ("throughput", "mfu"):
        return "; ".join(
            f"{k} {_figure(r.get('images_per_s'))} img/s"
            + (f" MFU {100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "")
            + (f" ({100 * r['mfu_of_measured_peak']:.1f} % of measured)" if r.get("mfu_of_measured_peak") else "")
            + (f" {r['graphs']} graph(s) {r['graph_breaks']} break(s)" if "graphs" in r else "")
            + (" ERROR" if "error" in r else "")
            for k, r in section["families"].items()
        )
    if name == "lsa_vs_nest":
        return f"LSA-T / NesT-T {_figure(section['ratio'], '.2f')} (paper {section['paper_ratio']})"
    if name == "restrict_attention":
        return "; ".join(
            f"{t} tokens: flex {_figure(r.get('flex_ms'), '.2f')} ms, dense {_figure(r.get('dense_masked_ms'), '.2f')} "
            f"ms, fused unmasked {_figure(r.get('full_fused_ms'), '.2f')} ms, |flex-dense| "
            f"{_figure(r.get('flex_vs_dense_max_abs_diff'), '.1e')}, {r.get('graphs')} graph(s)"
            for t, r in section["by_patch_tokens"].items()
        )
    if name == "augmentation":
        return f"{section['images_per_s']:.0f} img/s at {section['image_size']} px"
    if name == "feed":
        i = section["integrity"]
        return (
            f"{i['mismatched_images']} of {i['images_checked']} images differ "
            f"({i['mismatched_images_without_the_bound']} "
            f"without the bound); loader {section['loader_images_per_s']:.0f} img/s, with the augmentation "
            f"{section['feed_augment_images_per_s']:.0f} img/s over {section['batches_timed']} batches"
        )
    if name == "demo_training":
        return "; ".join(
            f"{v}: exit {r['returncode']}"
            + (
                f", val top-1 {r['final_val_top1']:.3f}, last epoch {r['history'][-1]['train_images_per_s']:.0f} img/s"
                if "history" in r
                else ""
            )
            for v, r in section["runs"].items()
        )
    if name == "deterministic_cost":
        return (
            f"step {section['step_ms']['default']:.1f} ms, deterministic {section['step_ms']['deterministic']:.1f} ms: "
            f"x{section['slowdown']:.2f}"
        )
    return "ran"


def run_check(
    device: torch.device,
    quick: bool = False,
    sections=PLANS["first-visit"],
    families: dict = FAMILIES,
    demo_data_dir: Path | None = None,
    node: dict | None = None,
    allow_skipped=(),
    allow_no_ffcv: bool = False,
    deadline_s: float | None = None,
    started: float | None = None,
    out_name: str = "gpu",
    measured_peak_tflops: float | None = None,
) -> dict:
    """Every section in ``sections`` (a failing one records its error), ``<out_name>.json`` written atomically
    (benchmarks/common.py's ``write_result``, into ``common.RESULTS``) before the first and after each; a section
    whose :data:`BUDGETS` entry is over the time left to ``deadline_s`` (seconds from ``started``, a
    ``time.monotonic()``; default now) is skipped and says so. ``node`` is :func:`node_report`'s;
    ``allow_skipped`` and ``allow_no_ffcv`` what :func:`problems` lets pass."""
    started = time.monotonic() if started is None else started
    s = settings(device, quick)
    s["measured_peak_tflops"] = measured_peak_tflops
    prov = provenance(device)
    payload = {
        "device": str(device),
        "device_name": prov["gpu"],
        "provenance": prov,
        "quick": quick,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()},
        "ffcv": ffcv_status(),
        "glibc": "".join(platform.libc_ver()),
        "wheelhouse": _wheelhouse_info(),
        "node": node,
        "sections_run": list(sections),
        "deadline_s": deadline_s,
        "budgets_s": {n: BUDGETS[n][1] for n in sections},
        "allowed": {"skipped": list(allow_skipped), "no_ffcv": allow_no_ffcv},
        "errors": {},
        "section_seconds": {},
        "summary": {},
    }
    for name in sections:
        payload[name] = {"ran": False, "reason": "not reached: the check stopped before it (a cut command)"}
    s["demo_data"] = demo_data_dir
    work = Path(tempfile.mkdtemp(prefix="locvit-gpu-check-"))
    save = lambda: common.write_result(out_name, {**payload, "problems": problems(payload)})  # noqa: E731
    save()
    try:
        for name in sections:
            budget = BUDGETS[name][1]
            left = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            start = time.perf_counter()
            if left is not None and left < budget:
                payload[name] = {
                    "ran": False,
                    "skipped_for": "deadline",
                    "reason": f"{max(left, 0):.0f} s left of --deadline-s {deadline_s:.0f}, under its "
                    f"budget of {budget} s (gpu_check.BUDGETS)",
                }
            else:
                # what its subprocesses may take: its budget on a GPU; the CPU self-test (--quick) is slower than a
                # GPU node in places (pytest's start on 2 cores), so there only the deadline bounds them
                limit = (600.0 if quick else budget) if left is None else (left if quick else min(budget, left))
                try:

                    def saved(section, name=name):  # a section's figures so far (mfu's families, one by one)
                        payload[name] = {**section, "provenance": prov}
                        save()

                    payload[name] = _run_section(name, device, s, work, families, payload, limit, saved)
                    if isinstance(payload[name], dict):
                        payload[name]["provenance"] = prov
                except Exception as err:
                    payload[name] = None
                    payload["errors"][name] = "".join(traceback.format_exception_only(err)).strip()
            payload["section_seconds"][name] = time.perf_counter() - start
            line = payload["errors"].get(name) or summary_line(name, payload[name])
            payload["summary"][name] = line[:400]
            print(f"gpu-check: {name} ({payload['section_seconds'][name]:.0f} s of {budget}): {line}", flush=True)
            payload["path"] = str(save())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload["problems"] = problems(payload)
    return payload


def _run_section(
    name: str,
    device: torch.device,
    s: dict,
    work: Path,
    families: dict,
    payload: dict,
    limit: float,
    saved=lambda section: None,
):
    if name == "smoke":
        return smoke(device, s)
    if name == "cuda_tests":
        return cuda_tests(limit)
    if name == "demo_training":
        return demo_training(device, s, work, limit)
    if name == "throughput":
        return throughput(device, s, families)
    if name == "mfu":
        return mfu(device, s, saved=lambda rows: saved({"families": rows, "partial": True}))
    if name == "lsa_vs_nest":
        return lsa_vs_nest(payload["throughput"])
    if name == "restrict_attention":
        return restrict_attention(device, s)
    if name == "augmentation":
        return augmentation(device, s)
    if name == "feed":
        return feed(device, s, work)
    if name == "deterministic_cost":
        return deterministic_cost(device, s)
    raise ValueError(f"--sections: {name!r} is not a section; allowed: {', '.join(SECTIONS)}")


def problems(payload: dict) -> list[str]:
    """What went wrong, one line each (empty: every section ran and worked; the check then exits 0).
    Not checking is a problem too: a section that did not run, unless ``allowed["skipped"]`` names it, and
    an FFCV that cannot be imported when a section needs it, unless ``allowed["no_ffcv"]``."""
    found = [f"{name}: {err}" for name, err in payload["errors"].items()]
    allowed = payload.get("allowed") or {}
    skip_ok, no_ffcv_ok = set(allowed.get("skipped") or ()), bool(allowed.get("no_ffcv"))
    ffcv = payload.get("ffcv") or {}
    needs_ffcv = [n for n in FFCV_SECTIONS if n in payload.get("sections_run", ()) and n not in skip_ok]
    if not ffcv.get("available", True) and needs_ffcv and not no_ffcv_ok:
        found.append(
            f"ffcv: cannot be imported ({ffcv.get('reason')}), so {' and '.join(needs_ffcv)} did not run "
            f"(only synthetic batches were measured): install it (gpu_node/visit.py installs the wheelhouse's) "
            f"or pass --allow-no-ffcv"
        )
    for name in payload.get("sections_run", ()):
        section = payload.get(name)
        if not isinstance(section, dict) or section.get("ran", True) or name in skip_ok:
            continue
        if section.get("skipped_for") == "ffcv":  # said once, by the ffcv line above
            continue
        found.append(f"{name}: did not run ({section.get('reason')}); --allow-skipped {name} accepts that")
    tests = payload.get("cuda_tests")
    if tests and tests.get("ok") is False:
        found.append(f"cuda_tests: {tests['summary'] or tests.get('reason')}")
    demo = payload.get("demo_training")
    if demo and demo.get("ran") and not demo["ok"]:
        found += [f"demo_training {v}: exit {r['returncode']}" for v, r in demo["runs"].items() if "history" not in r]
    for name in ("throughput", "mfu"):
        for label, row in ((payload.get(name) or {}).get("families") or {}).items():
            if "error" in row:
                found.append(f"{name} {label}: {row['error'][:300]}")
    integrity = (payload.get("feed") or {}).get("integrity")
    if integrity and not integrity["ok"]:
        found.append(
            f"feed: {integrity['mismatched_images']} of {integrity['images_checked']} images reached the "
            f"consumer with other pixels than the file's"
        )
    for tokens, row in ((payload.get("restrict_attention") or {}).get("by_patch_tokens") or {}).items():
        found += [f"restrict_attention {tokens} tokens {k}: {v[:300]}" for k, v in row.items() if k.endswith("_error")]
        if row.get("flex_matches_dense") is False:
            found.append(
                f"restrict_attention {tokens} tokens: FlexAttention differs from the dense kernel by "
                f"{row['flex_vs_dense_max_abs_diff']:.2e}, over the tolerance (gpu_check.FLEX_TOLERANCE)"
            )
        if row.get("mask_applied") is False:
            found.append(
                f"restrict_attention {tokens} tokens: FlexAttention's output equals the unmasked one: "
                "the mask is not applied"
            )
    return found


def _wheelhouse_info() -> dict | None:
    f = WHEELHOUSE / "wheelhouse.json"
    if not f.is_file():
        return None
    info = json.loads(f.read_text())
    return {
        "total_bytes": info.get("total_bytes"),
        "requirements": info.get("requirements"),
        "shared_libraries": info.get("shared_libraries"),
        "system_libraries": info.get("system_libraries"),
        "built_against": info.get("built_against"),
        "node_needs": info.get("node_needs"),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description="locvit's GPU check, one group of sections in this process (gpu_node/visit.py runs the groups of "
        "a visit, each in a process of its own); writes RESULTS_DIR/OUT.json after every section and "
        "exits 1 when anything failed or was not checked."
    )
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the self-test's device)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that every section runs, measures nothing")
    ap.add_argument(
        "--node",
        action="store_true",
        help="print the node's report (compiler, Python headers, glibc, libstdc++, timm, provenance) as JSON and stop",
    )
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=[], help="the sections to run, in order")
    ap.add_argument("--out", default="gpu", help="the results file's name, without .json (default %(default)s)")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS, help="its folder (default %(default)s)")
    ap.add_argument(
        "--deadline-s",
        type=float,
        help="seconds the sections may take: one whose budget (gpu_check.BUDGETS) is over the time left is skipped",
    )
    ap.add_argument(
        "--measured-peak-tflops",
        type=float,
        help="the smoke section's measured matmul rate: MFU is reported against it beside the data sheet's",
    )
    ap.add_argument(
        "--demo-data",
        type=Path,
        help="a folder with the demo's train.beton, val.beton and manifest.json "
        "(default: the wheelhouse's, results/demo/data, or locvit prepare)",
    )
    ap.add_argument(
        "--allow-skipped",
        type=_parse_names(SECTIONS),
        action="extend",
        default=[],
        metavar="SECTION[,SECTION]",
        help="a section that did not run is not a problem (cuda_tests on "
        "--device cpu, where every CUDA-marked test skips); by default it is",
    )
    ap.add_argument(
        "--allow-no-ffcv",
        action="store_true",
        help="an FFCV that cannot be imported is not a problem (demo_training and feed then do not run, "
        "and only synthetic batches are measured); by default it is",
    )
    args = ap.parse_args(argv)
    started = time.monotonic()
    device = torch.device(args.device)
    if args.node:
        print(json.dumps({**node_report(), "provenance": provenance(device), "ffcv": ffcv_status()}))
        return
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu-check: no CUDA device visible to torch (torch.cuda.is_available() is False); "
            "--device cpu runs the check on the CPU"
        )
    common.RESULTS = args.results_dir
    payload = run_check(
        device,
        quick=args.quick,
        sections=args.sections,
        demo_data_dir=args.demo_data,
        allow_skipped=args.allow_skipped,
        allow_no_ffcv=args.allow_no_ffcv,
        deadline_s=args.deadline_s,
        started=started,
        out_name=args.out,
        measured_peak_tflops=args.measured_peak_tflops,
    )
    print(f"gpu-check: wrote {payload['path']}", flush=True)
    if payload["problems"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
