"""What MLflow's system metrics cost a training run: the sampling thread's CPU time per sample.

MLflow's SystemMetricsMonitor samples CPU, memory, disk and network (GPU with nvidia-ml-py)
in a thread of the training process and logs each sample to the run (here: a run in a
fresh study database, SQLite as in the demo). Its CPU time, read from the kernel's per-thread
counters (psutil), divided by the samples it took, is what one sample costs; at
``tracking.system_metrics_s`` seconds between samples the thread takes that cost over that
interval of one core, which bounds what it takes from a run (the goal: under 1 %). The
demo's own share of MLflow (this sampler included) is measured by bench_pipeline.py --demo.

    .venv/bin/python -m benchmarks.bench_tracking [--samples 40] [--interval 0.25]

Results: benchmarks/results/tracking_cost.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import write_result

GOAL = 0.01  # of one core, at the default interval


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process."""
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def sampler_cost(samples: int = 40, interval: float = 0.25) -> dict:
    """Run MLflow's sampler on a fresh run for ``samples`` samples; its CPU seconds per sample."""
    import mlflow
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    from locvit import tracking

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory(prefix="locvit-sysmetrics-") as tmp:
        db = Path(tmp) / "mlflow.db"
        exp = tracking.setup("bench", db)
        run_id = mlflow.MlflowClient().create_run(exp).info.run_id
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, tracking_uri=tracking.default_uri(db))
        before = {t.native_id for t in threading.enumerate()}
        monitor.start()
        (thread,) = [t for t in threading.enumerate() if t.native_id not in before]
        started = time.perf_counter()
        time.sleep(samples * interval)
        cpu = thread_cpu_s(thread.native_id)  # before finish(): the thread's own work, sampling and logging
        wall = time.perf_counter() - started
        monitor.finish()
        logged = len(mlflow.MlflowClient().get_metric_history(run_id, "system/cpu_utilization_percentage"))
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    return {
        "samples_logged": logged,
        "wall_s": round(wall, 2),
        "thread_cpu_s": round(cpu, 4),
        "cpu_ms_per_sample": round(1000 * cpu / max(logged, 1), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples while measuring")
    args = parser.parse_args()
    from locvit.config import load_params

    default = load_params(Path(__file__).resolve().parents[1] / "params.yaml", check_models=False)["tracking"]
    cost = sampler_cost(args.samples, args.interval)
    interval = default["system_metrics_s"]
    share = cost["cpu_ms_per_sample"] / 1000 / interval if interval else 0.0
    payload = {
        **cost,
        "measured_interval_s": args.interval,
        "default_interval_s": interval,
        "share_of_one_core_at_default": round(share, 6),
        "goal": GOAL,
        "under_goal": share < GOAL,
    }
    print(
        f"MLflow's system metrics: {cost['cpu_ms_per_sample']:.1f} ms of CPU per sample "
        f"({cost['samples_logged']} samples logged); at one sample every {interval:g} s: "
        f"{100 * share:.3f} % of one core (goal < {100 * GOAL:g} %)"
    )
    print(f"wrote {write_result('tracking_cost', payload)}")


if __name__ == "__main__":
    main()
