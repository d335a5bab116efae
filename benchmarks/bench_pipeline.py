"""Pipeline overhead on a finished study: `snakemake -n all` and `dvc status`, and the demo's wall time.

What a user waits for before anything runs: Snakemake parsing the workflow (the config
validated, every variant's model checked) and building the DAG; DVC hashing what
changed. Goal: under 5 s each on a finished study. Timed alternately, median of
repeats, from the repository root on the study of params.yaml (the demo: run
`make demo` first). With `--demo`, also the whole demo from scratch in a temporary
copy of the workflow (its results table, training curves and locality table kept in benchmarks/results/demo/),
and where its time goes: per rule, the jobs' summed wall time from
Snakemake's log and, for training, how much of it the epochs took (metrics.json's
train_time_s) and how much went to everything else (process start, imports, MLflow, loaders), and
MLflow's whole share of the job time (:func:`mlflow_share`).

    .venv/bin/python -m benchmarks.bench_pipeline [--repeats 5] [--demo [--keep NAME]]

Results: benchmarks/results/pipeline.json; with ``--keep NAME`` (another machine's run, kept
beside the README's) the demo's files go to results/NAME/ and the timings to pipeline_NAME.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_tracking import sampler_cost
from benchmarks.common import alternate, median, write_result
from doctools.publish import publish

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL_S = 5.0


def run(cmd: list[str], cwd: Path = REPO) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout + proc.stderr


STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def job_times(log: str) -> dict[str, list[float]]:
    """Rule -> wall seconds of each of its jobs, from Snakemake's log (start and finish stamps, 1 s resolution)."""
    from datetime import datetime

    started, rule_of, out = {}, {}, {}
    stamp, rule = None, None
    for line in log.splitlines():
        if m := STAMP.match(line.strip()):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):$", line.strip()):
            rule = m.group(1)
        elif (m := re.match(r"^jobid: (\d+)$", line.strip())) and rule:
            started[m.group(1)], rule_of[m.group(1)] = stamp, rule
        elif (m := re.match(r"^Finished jobid: (\d+)", line.strip())) and m.group(1) in started:
            job = m.group(1)
            out.setdefault(rule_of[job], []).append((stamp - started[job]).total_seconds())
    return out


def breakdown(log: str, study_dir: Path) -> dict:
    """Per rule: jobs and their summed wall time; for training, the epochs' share (train_time_s)."""
    rules = {rule: {"jobs": len(t), "job_s": round(sum(t), 1)} for rule, t in sorted(job_times(log).items())}
    epochs = sum(json.loads(p.read_text())["train_time_s"] for p in study_dir.glob("runs/*/seed*/metrics.json"))
    if "train" in rules:
        rules["train"]["epochs_s"] = round(epochs, 1)
        rules["train"]["other_s"] = round(rules["train"]["job_s"] - epochs, 1)
    return rules


MLFLOW_LINE = re.compile(r"^MLflow: .* logged in ([0-9.]+) s$", re.M)


def mlflow_share(study_dir: Path, job_s: float, sample_cpu_s: float) -> dict:
    """MLflow's whole share of a finished study's job time: the seconds its calls took in training
    (metrics.json's tracking record: the import, the run tree, params, datasets, epochs, the model),
    in evaluation and in the report (their logs' "MLflow: ... logged in X s" lines), and the system
    metrics' sampling thread (samples logged x ``sample_cpu_s``, bench_tracking.py's CPU per sample)."""
    import mlflow

    runs = [json.loads(p.read_text()) for p in study_dir.glob("runs/*/seed*/metrics.json")]
    train = sum(m["tracking"].get("seconds", 0.0) for m in runs)
    logs = study_dir / "logs"
    evaluate = sum(float(x) for p in logs.glob("evaluate/*.log") for x in MLFLOW_LINE.findall(p.read_text()))
    report = sum(float(x) for x in MLFLOW_LINE.findall((logs / "report.log").read_text()))
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{study_dir / 'mlflow.db'}")
    samples = sum(len(client.get_metric_history(m["mlflow_run_id"], "system/cpu_utilization_percentage")) for m in runs)
    sampling = samples * sample_cpu_s
    total = train + evaluate + report + sampling
    return {
        "train_s": round(train, 2),
        "evaluate_s": round(evaluate, 2),
        "report_s": round(report, 2),
        "system_metrics_samples": samples,
        "system_metrics_s": round(sampling, 2),
        "total_s": round(total, 2),
        "job_s": round(job_s, 1),
        "share_of_job_time": round(total / job_s, 4),
    }


def demo_wall_time(keep_name: str = "demo") -> tuple[float, dict]:
    """`snakemake --cores all all` on params.yaml in a fresh copy of the workflow (nothing cached but models),
    and where the time went (:func:`breakdown`)."""
    from locvit.config import load_params

    with tempfile.TemporaryDirectory(prefix="locvit-demo-") as tmp:
        work = Path(tmp)
        for name in ("Snakefile", "params.yaml", "dvc.yaml"):
            shutil.copy2(REPO / name, work / name)
        for name in ("workflow", "profiles", "src"):
            shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        start = time.perf_counter()
        log = run([str(BIN / "snakemake"), "--cores", "all", "all"], cwd=work)
        wall = time.perf_counter() - start
        params = load_params(work / "params.yaml", check_models=False)
        study = work / params["results_dir"] / params["study"]
        keep = Path(__file__).parent / "results" / keep_name  # the table this run produced, quoted by the README
        publish(
            study / "report",
            keep,
            [
                "results.md",
                "results.csv",
                "results_seeds.csv",
                "evaluations.json",
                "throughput.csv",
                "figures/curves.png",
                "figures/attention_distance.png",
                "tables/locality.csv",
            ],
        )
        where = breakdown(log, study)
        where["mlflow"] = mlflow_share(
            study, sum(r["job_s"] for r in where.values()), sampler_cost(samples=20)["cpu_ms_per_sample"] / 1000
        )
        return wall, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--demo", action="store_true", help="also time the whole demo from scratch")
    parser.add_argument(
        "--keep",
        default="demo",
        metavar="NAME",
        help="with --demo: keep its table and figures in results/NAME/ and the timings in "
        "pipeline_NAME.json (default demo: results/demo/ and pipeline.json)",
    )
    args = parser.parse_args()
    if not re.fullmatch(r"\w[\w.-]*", args.keep):
        parser.error(f"--keep {args.keep!r}: a folder name under benchmarks/results (letters, digits, _ . -)")
    if args.keep != "demo" and not args.demo:
        parser.error("--keep names where the demo run by --demo is kept: give --demo too")

    payload = {"goal_s": GOAL_S, "repeats": args.repeats, "study": "params.yaml (demo)"}
    dry = run([str(BIN / "snakemake"), "-n", "all"])
    if "Nothing to be done" in dry:
        times = alternate(
            {
                "snakemake -n all": lambda: run([str(BIN / "snakemake"), "-n", "all"]),
                "dvc status": lambda: run([str(BIN / "dvc"), "status"]),
            },
            repeats=args.repeats,
            warmup=1,
        )
        result = {
            name: {
                "median_s": round(median(t), 2),
                "min_s": round(min(t), 2),
                "max_s": round(max(t), 2),
                "under_goal": median(t) < GOAL_S,
            }
            for name, t in times.items()
        }
        payload["commands"] = result
        for name, r in result.items():
            print(
                f"{name:18s} median {r['median_s']:.2f} s (min {r['min_s']:.2f}, max {r['max_s']:.2f}); "
                f"goal < {GOAL_S:g} s: {'yes' if r['under_goal'] else 'NO'}"
            )
    elif not args.demo:
        raise SystemExit(
            "the study of params.yaml is not finished (snakemake -n all has jobs to run): "
            "run `make demo` first, then this benchmark"
        )
    else:
        print("the study of params.yaml is not finished here: timing only the demo from scratch")
    if args.demo:
        wall, where = demo_wall_time(args.keep)
        payload["demo_wall_s"] = round(wall, 1)
        payload["demo_breakdown"] = where
        print(f"demo from scratch: {wall / 60:.1f} min")
        share = where.pop("mlflow")
        payload["demo_mlflow"] = share
        for rule, r in where.items():
            print(
                f"  {rule:16s} {r['jobs']:3d} job(s), {r['job_s']:7.1f} s of job time"
                + (f" ({r['epochs_s']:.1f} s in epochs, {r['other_s']:.1f} s around them)" if "epochs_s" in r else "")
            )
        print(
            f"  MLflow: {share['total_s']:.1f} s of {share['job_s']:.0f} s of job time "
            f"({100 * share['share_of_job_time']:.1f} %; goal < 5 %): training {share['train_s']:.1f} s, "
            f"evaluation {share['evaluate_s']:.1f} s, report {share['report_s']:.1f} s, system metrics "
            f"{share['system_metrics_s']:.2f} s ({share['system_metrics_samples']} samples)"
        )
    print(f"wrote {write_result('pipeline' if args.keep == 'demo' else f'pipeline_{args.keep}', payload)}")


if __name__ == "__main__":
    main()
