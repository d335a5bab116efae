"""``locvit mlflow-ui``: the MLflow UI on one study's tracking database.

The pipeline's default backend is the study's ``mlflow.db`` with artifacts in
``mlartifacts/`` beside it (``locvit.layout``). This runs ``mlflow ui`` on that
file, bound to 127.0.0.1 unless told otherwise: the UI has no login, so whoever
reaches its port can read, rename and delete the runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from locvit.errors import InputError, MissingFileError
from locvit.layout import StudyLayout
from locvit.tracking.backend import ui_link

log = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def ui_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ui_command(study_dir: str | Path, host: str = LOCAL_HOST, port: int = 5000, workers: int = 1) -> list[str]:
    """The ``mlflow ui`` command (an argument list, run without a shell) for a study's database.

    Refuses when ``MLFLOW_TRACKING_URI`` is set: the pipeline then logged to that
    backend, not to the study's file, and opening the file would show stale or no runs.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        there = (
            f"browse {uri}" if uri.startswith(("http://", "https://")) else f"run `mlflow ui --backend-store-uri {uri}`"
        )
        raise InputError(
            f"MLFLOW_TRACKING_URI is set ({uri}), so the pipeline logged this study's runs there, "
            f"not to {StudyLayout(Path(study_dir)).tracking_db}: {there}, or unset MLFLOW_TRACKING_URI "
            f"to open the study's own file."
        )
    layout = StudyLayout(Path(study_dir).resolve())
    db = layout.tracking_db
    if not db.is_file():
        raise MissingFileError(
            f"{db} does not exist: the study has no MLflow runs yet; run the pipeline first "
            f"(snakemake --cores all all, or make demo)"
        )
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        f"sqlite:///{db}",
        # Where artifacts of experiments created from the UI would go (ours keep their own location).
        "--artifacts-destination",
        layout.artifacts.as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def study_links(study_dir: str | Path, study: str, base: str) -> list[str]:
    """What to open: the study's run in the model-training view and MLflow's compare view of its variant
    runs (``locvit.tracking.tree``); the study's runs table when it has no study run yet (runs of an
    older locvit, before its report re-ran); the UI's home when the study has no experiment."""
    import mlflow

    from locvit.tracking.backend import compare_link
    from locvit.tracking.tree import ROLE, find, study_tags

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{StudyLayout(Path(study_dir).resolve()).tracking_db}")
    exp = client.get_experiment_by_name(study)
    if exp is None:
        return [f"{base}/#/?workflowType=machine_learning"]
    runs = find(client, exp.experiment_id, study_tags(study))
    if not runs:
        return [ui_link(base, exp.experiment_id)]
    variants = find(client, exp.experiment_id, {ROLE: "variant", "study": study})
    # The variants of the results table (a mask search's rounds have no test_top1_mean), best first.
    variants = sorted(
        [r for r in variants if "test_top1_mean" in r.data.metrics] or variants,
        key=lambda r: r.data.metrics.get("test_top1_mean", float("-inf")),
        reverse=True,
    )
    return [
        ui_link(base, exp.experiment_id, runs[0].info.run_id),
        compare_link(base, exp.experiment_id, [r.info.run_id for r in variants]),
    ]


def serve(
    study_dir: str | Path, host: str = LOCAL_HOST, port: int = 5000, workers: int = 1, study: str | None = None
) -> None:
    """Replace this process by ``mlflow ui`` (so a signal to our pid reaches MLflow itself).

    Prints the links of ``study_links`` (``study``: default the folder's name).
    """
    cmd = ui_command(study_dir, host, port, workers)
    if host not in LOOPBACK:
        log.warning(
            "binding the MLflow UI to %s: anyone who can reach port %s can read, change and delete these "
            "runs (it has no login).",
            host,
            port,
        )
    links = study_links(study_dir, study or Path(study_dir).resolve().name, ui_url(host, port))
    print(f"MLflow UI on {cmd[cmd.index('--backend-store-uri') + 1]}: browse {links[0]} (Ctrl-C stops it)", flush=True)
    if len(links) > 1:
        print(f"  the variants side by side (best test top-1 first): {links[1]}", flush=True)
    os.execve(cmd[0], cmd, ui_env())


def ui_env() -> dict[str, str]:
    """The environment of ``mlflow ui``: without MLflow's job runner unless asked for.

    The runner (seven huey consumer processes) serves GenAI features (scorers, trace
    jobs) that our training runs never use, and slows the UI's start on a small machine.
    """
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
