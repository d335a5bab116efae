"""A visit to a GPU node: its facts, the wheelhouse installed, then the check's groups of sections, each in a
process of its own under a hard timeout taken from the time left; every file under ``--results-dir``, a
summary table printed last. Needs Python with torch, this checkout and ``wheelhouse/`` (``make -C gpu_node
wheelhouse``): no make, no venv, no package index; this file imports the standard library only.

    python3 -m gpu_node.visit --results-dir DIR                          # the first visit
    python3 -m gpu_node.visit --plan second-visit --results-dir DIR
    python3 -m gpu_node.visit --device cpu --quick --results-dir DIR     # the CPU rehearsal
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Each section: its plan, its budget in seconds on one H100 or H200, and how that budget was estimated (the
# work's size and CPU timings; compile costs are torch.compile's on a node's CPU cores). docs/benchmarks.md
# renders this table (doctools/doc_tables.py, kind "budgets").
BUDGETS = {
    "smoke": (
        "first-visit",
        60,
        "an 8192-square bf16 matmul 23 times (a second), 20 compiled training steps of a "
        "2-layer DeiT at 32 px, batch 64: one torch.compile of forward and backward (about "
        "30 s on a node's cores)",
    ),
    "cuda_tests": (
        "first-visit",
        40,
        "pytest's start and imports (about 10 s on a node) and the CUDA-marked tests of "
        "tiny models, each a few kernels",
    ),
    "augmentation": (
        "first-visit",
        20,
        "12 batches of 256 images at 224 px, a fraction of a second each on a GPU "
        "(3 s a batch of 64 on the 2-core CPU)",
    ),
    "throughput": (
        "first-visit",
        60,
        "7 families eager at batch 128, 224 px: (1 + 1 + 10) x 5 steps each of at most "
        "about 0.1 s (7.6 GFLOP an image for DeiT-Tiny) plus the forward FLOPs counted "
        "on the CPU (about 1 s a family)",
    ),
    "lsa_vs_nest": ("first-visit", 1, "a ratio of two figures of throughput"),
    "restrict_attention": (
        "first-visit",
        100,
        "3 shapes x one compiled FlexAttention forward + backward (one Triton "
        "compile each, about 15-30 s) and 10 alternating repeats of 3 kernels "
        "on 65,536 tokens a batch (milliseconds each)",
    ),
    "mfu": (
        "first-visit",
        130,
        "3 families under torch.compile, forward and backward: DeiT-Tiny's compile took 131 s "
        "at 64 px on the shared 2-core CPU, about 40 s each on a node's cores; then "
        "(1 + 10) x 5 steps each. Last in its plan, each family saved as it is done",
    ),
    "feed": (
        "second-visit",
        150,
        "4,096 synthetic 64 px images written (about 10 s), FFCV's JIT compile of 2 loaders "
        "(10-20 s each), one checked epoch behind a busy device, 2 x 64 timed batches of 256 "
        "(52 s for all of it at 16 px on the 2-core CPU)",
    ),
    "demo_training": (
        "second-visit",
        200,
        "3 locvit train runs of 2 epochs of 72 steps at 32 px: each about 15 s "
        "of start, 45 s of torch.compile and a few seconds of steps (one run eager "
        "took 52 s on the 2-core CPU)",
    ),
    "deterministic_cost": (
        "second-visit",
        80,
        "DeiT-Tiny at 224 px, batch 128, eager: 2 x (2 warm-up + 10 timed) x 5 "
        "steps of about 0.1 s, the deterministic ones slower",
    ),
}
PLANS = {plan: tuple(n for n, (p, _, _) in BUDGETS.items() if p == plan) for plan in ("first-visit", "second-visit")}
# The processes of a plan, in order: cheap eager figures first, FlexAttention alone, compiled MFU last.
GROUPS = {
    "first-visit": (
        ("smoke", ("smoke",)),
        ("tests", ("cuda_tests",)),
        ("eager", ("augmentation", "throughput", "lsa_vs_nest")),
        ("flex", ("restrict_attention",)),
        ("mfu", ("mfu",)),
    ),
    "second-visit": (("feed", ("feed",)), ("demo", ("demo_training",)), ("deterministic", ("deterministic_cost",))),
}
START_S = 10  # a group process's start: Python, torch, timm and locvit imported
FACTS_S, INSTALL_S = 15, 40  # the node's facts; the wheelhouse's install (10 s on 2 cores), cut at its budget
SUMMARY_S = 5
# One device command is at most 10 minutes: a visit takes 9 of them, a minute of margin for the transfers.
DEADLINE_S = 540
SUMMARY_LINES = 60  # what the printed summary may take, of the 12 kB of output a device call returns


def group_budget(sections) -> int:
    return START_S + sum(BUDGETS[s][1] for s in sections)


def plan_seconds(plan: str) -> int:
    """What a plan takes at its budgets: facts, install, its groups and the summary."""
    return FACTS_S + INSTALL_S + sum(group_budget(s) for _, s in GROUPS[plan]) + SUMMARY_S


def write_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path = REPO) -> dict:
    """``cmd`` in a session of its own, killed with everything it started at ``timeout`` seconds."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            code, timed_out = proc.wait(timeout=max(timeout, 1)), False
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=5)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            code, timed_out = None, True
        log.seek(0)
        out = log.read()
    return {
        "returncode": code,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - start, 1),
        "timeout_s": round(timeout, 1),
        "output_tail": out[-4000:],
    }


def commit() -> str | None:
    """The checkout's commit: git's where there is a .git, else the ``COMMIT`` file the wheelhouse's build wrote."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        f = REPO / "wheelhouse" / "COMMIT"
        return f.read_text().strip() if f.is_file() else None


def facts() -> dict:
    """What the node is, from the standard library and its commands: GPU and driver, Python, the C compiler,
    Python's headers, make, the system libraries the wheelhouse takes from the system, the commit."""

    def first_line(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            return None

    try:
        ldconfig = subprocess.run(
            [shutil.which("ldconfig") or "/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        ldconfig = ""
    cc = shutil.which("cc") or shutil.which("gcc")
    return {
        "gpu": first_line(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "compiler": first_line([cc, "--version"]) if cc else None,
        "python_headers": (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
        "make": first_line(["make", "--version"]) if shutil.which("make") else None,
        "system_libraries": {
            lib: bool(re.search(rf"^\s*{re.escape(lib)}\.so", ldconfig, re.M)) for lib in ("libX11", "libz")
        },
        "cpus": os.cpu_count(),
        "commit": commit(),
    }


def install(wheelhouse: Path, site: Path, pip: bool | None = None) -> dict:
    """The wheelhouse's wheels into ``site`` (pip's ``--target``, no index, no dependencies; without pip, each
    wheel unpacked: a wheel is a zip of its installed files), then what imports from there."""
    wheels = sorted(wheelhouse.glob("*.whl"))
    if not wheels:
        return {
            "ok": False,
            "reason": f"no wheels in {wheelhouse}: run make -C gpu_node wheelhouse on a connected "
            "machine and bring wheelhouse/ with the checkout",
        }
    site.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    has_pip = (
        pip
        if pip is not None
        else subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    )
    if has_pip:
        how = run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--disable-pip-version-check",
                "--target",
                str(site),
                *map(str, wheels),
            ],
            INSTALL_S * 3 / 4,
        )
    else:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
        for data in site.glob("*.data"):  # a wheel's purelib/platlib parts belong beside its package
            for part in ("purelib", "platlib"):
                for item in (data / part).glob("*") if (data / part).is_dir() else ():
                    shutil.move(str(item), site / item.name)
        how = {"returncode": 0, "timed_out": False, "output_tail": "unpacked with zipfile (no pip here)"}
    probe = (
        "import importlib, json; found = {}\n"
        "for m in ('jsonschema', 'ffcv', 'ffcv.loader', 'timm', 'yaml', 'locvit.train.loop'):\n"
        "    try: found[m] = getattr(importlib.import_module(m), '__version__', 'ok')\n"
        "    except Exception as e: found[m] = 'MISSING: %s: %s' % (type(e).__name__, e)\n"
        "print(json.dumps(found))"
    )
    left = max(5.0, INSTALL_S - (time.monotonic() - start))
    check = run([sys.executable, "-c", probe], left, env=group_env(site))
    imports = json.loads(check["output_tail"].strip().splitlines()[-1]) if check["returncode"] == 0 else {}
    missing = {m: v for m, v in imports.items() if str(v).startswith("MISSING")}
    ok = how["returncode"] == 0 and check["returncode"] == 0 and not missing
    return {
        "ok": ok,
        "wheels": [w.name for w in wheels],
        "with": "pip --target" if has_pip else "zipfile",
        "site": str(site),
        "seconds": round(time.monotonic() - start, 1),
        "imports": imports,
        "missing": missing,
        **({} if ok else {"output_tail": (how.get("output_tail") or "") + check["output_tail"][-2000:]}),
    }


def group_env(site: Path | None, extra: dict | None = None) -> dict:
    path = [str(p) for p in (site, REPO / "src", REPO) if p is not None]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


# A group's own environment: cuBLAS reads CUBLAS_WORKSPACE_CONFIG at its first use, so the deterministic section,
# which needs it, runs in a process of its own and only it gets the variable.
GROUP_ENV = {"deterministic": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}}


def timeout_for(budget: float, later: float, left: float) -> float:
    """A group's hard timeout: up to twice its budget where the time left allows, never eating into the budgets
    of the groups after it, and never more than the time left."""
    return max(0.0, min(2 * budget, max(left - later, min(budget, left))))


def visit(
    plan: str,
    results: Path,
    device: str,
    quick: bool,
    deadline_s: float,
    wheelhouse: Path,
    site: Path | None,
    groups=None,
    worker: str = "gpu_node.gpu_check",
) -> dict:
    """The visit; ``groups`` and ``worker`` (the module that runs a group) replace the plan's for a test."""
    started = time.monotonic()
    results.mkdir(parents=True, exist_ok=True)
    record = {
        "plan": plan,
        "device": device,
        "quick": quick,
        "deadline_s": deadline_s,
        "plan_seconds_at_budgets": plan_seconds(plan),
        "facts": facts(),
        "groups": {},
        "problems": [],
    }
    path = results / "visit.json"
    write_json(path, record)
    extra_env = {"LOCVIT_COMMIT": record["facts"]["commit"] or ""}
    if site is not None:
        record["install"] = install(wheelhouse, site)
        if not record["install"]["ok"]:
            record["problems"].append(f"install: {record['install'].get('reason') or record['install']['missing']}")
    write_json(path, record)
    node = run(
        [sys.executable, "-m", "gpu_node.gpu_check", "--node", "--device", device],
        FACTS_S * 3,
        env=group_env(site, extra_env),
    )
    try:
        record["node"] = json.loads(node["output_tail"].strip().splitlines()[-1])
        record["problems"] += [f"node: {k}: {v}" for k, v in record["node"].get("missing", {}).items()]
    except (ValueError, IndexError):
        record["node"] = node
        record["problems"].append(f"node: the report failed (exit {node['returncode']})")
    write_json(path, record)
    peak = None
    groups = groups or GROUPS[plan]
    for i, (name, sections) in enumerate(groups):
        budget = group_budget(sections)
        later = sum(group_budget(s) for _, s in groups[i + 1 :]) + SUMMARY_S
        left = deadline_s - (time.monotonic() - started)
        timeout = timeout_for(budget, later, left)
        if timeout < START_S + 5:
            record["groups"][name] = {
                "sections": list(sections),
                "ran": False,
                "reason": f"{max(left, 0):.0f} s left of the {deadline_s:.0f} s deadline",
            }
            record["problems"].append(f"{name}: not run ({record['groups'][name]['reason']})")
            continue
        cmd = [
            sys.executable,
            "-m",
            worker,
            "--device",
            device,
            "--sections",
            *sections,
            "--out",
            name,
            "--results-dir",
            str(results),
            "--deadline-s",
            str(round(timeout)),
            *(["--quick"] if quick else []),
            *(["--measured-peak-tflops", str(peak)] if peak else []),
            *(["--allow-skipped", "cuda_tests"] if device == "cpu" and "cuda_tests" in sections else []),
        ]
        print(f"visit: {name} ({', '.join(sections)}), at most {timeout:.0f} s", flush=True)
        done = run(cmd, timeout, env=group_env(site, {**extra_env, **GROUP_ENV.get(name, {})}))
        out = results / f"{name}.json"
        found = json.loads(out.read_text()) if out.is_file() else {}
        record["groups"][name] = {
            "sections": list(sections),
            "ran": True,
            **done,
            "summary": found.get("summary", {}),
            "problems": found.get("problems", []),
        }
        if done["timed_out"]:
            record["problems"].append(f"{name}: cut at its timeout of {timeout:.0f} s; what it saved is in {out.name}")
        record["problems"] += [f"{name}: {p}" for p in found.get("problems", [])]
        if done["returncode"] not in (0, 1, None) and not found.get("problems"):
            record["problems"].append(f"{name}: exit {done['returncode']}: {done['output_tail'][-300:]}")
        if name == "smoke":
            peak = ((found.get("smoke") or {}).get("gemm") or {}).get("tflops")
        write_json(path, record)
    record["seconds"] = round(time.monotonic() - started, 1)
    (results / "summary.md").write_text(summary(record))
    write_json(path, record)
    return record


def summary(record: dict) -> str:
    """At most :data:`SUMMARY_LINES` lines: one a group, one a section's figures, then the problems."""
    f = record["facts"]
    node = record.get("node") or {}
    prov = node.get("provenance") or {}
    lines = [
        f"# GPU visit ({record['plan']}, {record['device']}{', quick' if record['quick'] else ''}): "
        f"{record.get('seconds', 0):.0f} s of {record['deadline_s']:.0f}",
        f"node: {f['gpu'] or prov.get('gpu') or 'no GPU'}; Python {f['python']}; torch {prov.get('torch')} "
        f"(CUDA {prov.get('cuda')}, triton {prov.get('triton')}); commit {f['commit']}",
        "install: "
        + (
            f"{record['install']['with']}, {'ok' if record['install']['ok'] else 'FAILED'} in "
            f"{record['install'].get('seconds', 0):.0f} s"
            if "install" in record
            else "none (--no-install)"
        ),
        "",
        "| group | exit | s / limit | section: figures |",
        "|---|---|---|---|",
    ]
    for name, g in record["groups"].items():
        if not g.get("ran"):
            lines.append(f"| {name} | not run | - | {g['reason']} |")
            continue
        exit_ = "cut" if g["timed_out"] else str(g["returncode"])
        figures = "; ".join(f"{k}: {v}" for k, v in g["summary"].items()) or g["output_tail"][-200:].replace("\n", " ")
        lines.append(f"| {name} | {exit_} | {g['seconds']:.0f} / {g['timeout_s']:.0f} | {figures.replace('|', '/')} |")
    lines += ["", f"problems: {len(record['problems'])}"] + [f"- {p[:300]}" for p in record["problems"]]
    if len(lines) > SUMMARY_LINES:
        lines = lines[: SUMMARY_LINES - 1] + [f"... {len(lines) - SUMMARY_LINES + 1} more in visit.json"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results-dir", type=Path, required=True, help="where every file goes (at most 8, flat)")
    ap.add_argument("--plan", choices=list(GROUPS), default="first-visit")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the rehearsal)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: every section runs, nothing is measured")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=DEADLINE_S,
        help="seconds the whole visit may take (default %(default)s: one 10-minute command less a "
        "minute of margin); each group's hard timeout comes from the time left",
    )
    ap.add_argument("--wheelhouse", type=Path, default=REPO / "wheelhouse")
    ap.add_argument("--site", type=Path, help="where the wheelhouse is installed (default: a new temporary folder)")
    ap.add_argument("--no-install", action="store_true", help="use what this Python already has")
    args = ap.parse_args(argv)
    site = None if args.no_install else (args.site or Path(tempfile.mkdtemp(prefix="locvit-site-")))
    record = visit(args.plan, args.results_dir, args.device, args.quick, args.deadline_s, args.wheelhouse, site)
    print(summary(record), end="", flush=True)
    sys.exit(1 if record["problems"] else 0)


if __name__ == "__main__":
    main()
