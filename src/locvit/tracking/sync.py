"""``locvit sync-tracking``: upload the run records that the tracking backend lacks.

A training whose backend failed keeps everything in its ``metrics.json``
(``locvit.tracking.run.TrainingTracker``); ``sync_runs`` rebuilds the MLflow runs
from those records once the backend answers again, and does nothing for records that are
already complete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from locvit.config.run import flatten, peak_lr
from locvit.io import read_json, write_json
from locvit.layout import ROUND_FILES, RunFiles, StudyLayout, per_seed
from locvit.tracking.backend import (
    bounded_http,
    check_reachable,
    default_uri,
    find_run,
    log_metrics,
    log_params,
    retry,
    safe_uri,
    set_tags,
    setup,
)
from locvit.tracking.run import ARTIFACTS, log_best_model
from locvit.tracking.tree import lock_beside, seed_tags, variant_parent


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def find_evaluation(folder: Path, metrics: dict, eval_dir: Path | None) -> dict | None:
    """The run's test result: ``<eval_dir>/<variant>/seed<k>.json`` or (mask-search rounds) ``eval.json``."""
    candidates = [folder / ROUND_FILES["eval"]]
    if eval_dir is not None:
        candidates += per_seed(eval_dir / metrics["variant"], [metrics["seed"]], ".json")
    for path in candidates:
        if path.is_file():
            result = read_json(path, "evaluation file")
            if all(result.get(k) == metrics.get(k) for k in ("study", "variant", "seed")):
                return result
    return None


def _params_from_checkpoint(folder: Path, metrics: dict) -> dict[str, str]:
    """Params of a record written before metrics.json kept them: rebuilt from best.pt's config."""
    from locvit.checkpoint import load_checkpoint

    cfg = load_checkpoint(RunFiles.at(folder).best, allow_code_change=True)["config"]  # its config only
    params = {
        **flatten(cfg),
        "n_params": metrics["n_params"],
        "world_size": metrics.get("world_size", 1),
        "lr_peak": peak_lr(cfg["train"]),
    }
    return {k: str(v)[:6000] for k, v in params.items()}


def _upload(
    client, experiment_id: str, folder: Path, metrics: dict, run, evaluation: dict | None, uri: str, lock: Path
) -> tuple[str, int]:
    """Create (or complete) the run of a record; return its id and the number of metric points logged."""
    from mlflow.entities import Metric

    record = metrics.get("tracking") or {}
    tags = {
        "study": metrics["study"],
        "variant": metrics["variant"],
        "model": metrics["model"],
        "seed": str(metrics["seed"]),
        **record.get("tags", {}),
    }
    if metrics.get("slurm_job_ids") and "slurm_job_ids" not in tags:
        tags["slurm_job_ids"] = ",".join(metrics["slurm_job_ids"])
    # Under its variant's run in this backend (the record's parent, if any, was another backend's).
    tags.update(seed_tags(variant_parent(client, experiment_id, metrics["study"], metrics["variant"], lock)))
    params = record.get("params") or _params_from_checkpoint(folder, metrics)
    if run is None:
        run = retry(
            client.create_run,
            experiment_id,
            tags=tags,
            run_name=record.get("run_name") or f"{metrics['variant']}-seed{metrics['seed']}",
        )
    else:  # the run got this far before tracking failed: complete it
        set_tags(run.info.run_id, tags)
    run_id = run.info.run_id
    log_params(run_id, {k: v for k, v in params.items() if k not in run.data.params})
    points = [(k, v, row["epoch"]) for row in metrics["history"] for k, v in row.items() if k != "epoch"]
    points.append(("best_val_top1", metrics["best_val_top1"], metrics["best_epoch"]))
    if evaluation is not None:
        split = evaluation["split"]
        points += [
            (f"{split}_{m}", evaluation[f"{split}_{m}"], evaluation["checkpoint_epoch"]) for m in ("top1", "loss")
        ]
    logged = {
        key: {m.step for m in retry(client.get_metric_history, run_id, key)} if key in run.data.metrics else set()
        for key in {k for k, _, _ in points}
    }
    now = int(time.time() * 1000)
    missing = [Metric(k, float(v), now, int(s)) for k, v, s in points if s not in logged[k]]
    for batch in _batches(missing, 900):  # MLflow takes at most 1000 metrics per batch
        retry(client.log_batch, run_id, metrics=batch)
    # The record names its run before its metrics.json is uploaded, so the artifact says so too.
    synced = {
        **record,
        "status": "ok",
        "uri": safe_uri(uri),
        "error": None,
        "failed_during": None,
        "synced_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "error_before_sync": record.get("error"),
    }
    write_json(RunFiles.at(folder).metrics, {**metrics, "mlflow_run_id": run_id, "tracking": synced})
    for name, artifact_path in (record.get("artifacts") or ARTIFACTS).items():
        if (folder / name).is_file():
            retry(client.log_artifact, run_id, str(folder / name), artifact_path)
    models = retry(client.search_logged_models, [run.info.experiment_id])
    best = RunFiles.at(folder).best
    if best.is_file() and not any(m.source_run_id == run_id for m in models):
        log_best_model(run_id, best, metrics["best_epoch"])
    retry(client.set_terminated, run_id, status="FINISHED")
    return run_id, len(missing)


def sync_runs(
    runs_dir: str | Path,
    tracking_db: str | Path,
    eval_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[str]]:
    """Upload every run record under ``runs_dir`` (any depth) that the tracking backend lacks.

    A run folder (with a training ``metrics.json``) whose tracking failed, whose run id the backend does not
    know, or whose run is not FINISHED is created or completed (params, tags, metrics per step, the test
    result from ``eval_dir``, default ``eval/`` beside ``runs_dir``, artifacts) under its variant's run and
    marked FINISHED, and its ``metrics.json`` rewritten with id and status ``ok``; a complete run gets only a
    missing test result. A second call uploads nothing. Returns the folders by outcome: ``uploaded``,
    ``evaluation``, ``up_to_date``, ``failed``.
    """
    import mlflow

    runs_dir = Path(runs_dir)
    eval_dir = Path(eval_dir) if eval_dir is not None else StudyLayout(runs_dir.parent).eval
    uri = default_uri(tracking_db)
    outcome: dict[str, list[str]] = {"uploaded": [], "evaluation": [], "up_to_date": [], "failed": []}
    experiments: dict[str, str] = {}
    with bounded_http():
        check_reachable(uri)
        for folder in sorted(p.parent for p in runs_dir.rglob(RunFiles.METRICS)):
            metrics = read_json(RunFiles.at(folder).metrics, "run record")
            if not isinstance(metrics, dict) or not {"study", "variant", "seed", "history"} <= set(metrics):
                continue  # another file of that name, not a training record
            try:
                if metrics["study"] not in experiments:
                    experiments[metrics["study"]] = setup(metrics["study"], tracking_db)
                client = mlflow.MlflowClient()
                run = find_run(client, metrics.get("mlflow_run_id"))
                evaluation = find_evaluation(folder, metrics, eval_dir)
                test_key = f"{evaluation['split']}_top1" if evaluation else None
                complete = (
                    (metrics.get("tracking") or {}).get("status") != "failed"
                    and run is not None
                    and run.info.status == "FINISHED"
                )
                if complete and (test_key is None or test_key in run.data.metrics):
                    outcome["up_to_date"].append(str(folder))
                elif complete:
                    split, step = evaluation["split"], evaluation["checkpoint_epoch"]
                    log_metrics(
                        run.info.run_id,
                        {f"{split}_top1": evaluation[f"{split}_top1"], f"{split}_loss": evaluation[f"{split}_loss"]},
                        step=step,
                    )
                    outcome["evaluation"].append(str(folder))
                    log(f"{folder}: test result logged to MLflow run {run.info.run_id}")
                else:
                    run_id, n = _upload(
                        client,
                        experiments[metrics["study"]],
                        folder,
                        metrics,
                        run,
                        evaluation,
                        uri,
                        lock_beside(tracking_db),
                    )
                    outcome["uploaded"].append(str(folder))
                    log(
                        f"{folder}: uploaded to MLflow run {run_id} ({n} metric values"
                        f"{', test result' if evaluation else ''}; metrics.json updated)"
                    )
            except Exception as err:  # one bad record does not stop the others
                outcome["failed"].append(str(folder))
                log(f"{folder}: NOT uploaded: {type(err).__name__}: {err}")
    return outcome
