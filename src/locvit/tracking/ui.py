"""``locvit mlflow-ui``: the MLflow UI on one study's tracking database.

The pipeline's default backend is the study's ``mlflow.db`` with artifacts in
``mlartifacts/`` beside it (:mod:`locvit.layout`). This runs ``mlflow ui`` on that
file, bound to 127.0.0.1 unless told otherwise: the UI has no login, so whoever
reaches its port can read, rename and delete the runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from locvit.layout import StudyLayout
from locvit.tracking.backend import ui_link

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
        there = f"browse {uri}" if uri.startswith(("http://", "https://")) else \
            f"run `mlflow ui --backend-store-uri {uri}`"
        raise ValueError(f"MLFLOW_TRACKING_URI is set ({uri}), so the pipeline logged this study's runs there, "
                         f"not to {StudyLayout(Path(study_dir)).tracking_db}: {there}, or unset MLFLOW_TRACKING_URI "
                         f"to open the study's own file.")
    layout = StudyLayout(Path(study_dir).resolve())
    db = layout.tracking_db
    if not db.is_file():
        raise FileNotFoundError(f"{db} does not exist: the study has no MLflow runs yet; run the pipeline first "
                                f"(snakemake --cores all all, or make demo)")
    return [sys.executable, "-m", "mlflow", "ui",
            "--backend-store-uri", f"sqlite:///{db}",
            # Where artifacts of experiments created from the UI would go (ours keep their own location).
            "--artifacts-destination", layout.artifacts.as_uri(),
            "--host", host, "--port", str(port), "--workers", str(workers)]


def study_link(study_dir: str | Path, study: str, base: str) -> str:
    """The UI link to the study's runs in the model-training view (the UI's home when the study has no
    experiment yet)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{StudyLayout(Path(study_dir).resolve()).tracking_db}")
    exp = client.get_experiment_by_name(study)
    return ui_link(base, exp.experiment_id) if exp is not None else f"{base}/#/?workflowType=machine_learning"


def serve(study_dir: str | Path, host: str = LOCAL_HOST, port: int = 5000, workers: int = 1,
          study: str | None = None) -> None:
    """Replace this process by ``mlflow ui`` (so a signal to our pid reaches MLflow itself).

    Prints the link to the study's runs (``study``: default the folder's name) in the UI's
    model-training view.
    """
    cmd = ui_command(study_dir, host, port, workers)
    if host not in LOOPBACK:
        print(f"WARNING: binding the MLflow UI to {host}: anyone who can reach port {port} can read, change and "
              f"delete these runs (it has no login).", file=sys.stderr)
    link = study_link(study_dir, study or Path(study_dir).resolve().name, ui_url(host, port))
    print(f"MLflow UI on {cmd[cmd.index('--backend-store-uri') + 1]}: browse {link} (Ctrl-C stops it)", flush=True)
    os.execve(cmd[0], cmd, ui_env())


def ui_env() -> dict[str, str]:
    """The environment of ``mlflow ui``: without MLflow's job runner unless asked for.

    The runner (seven huey consumer processes) serves GenAI features (scorers, trace
    jobs) that our training runs never use, and slows the UI's start on a small machine.
    """
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
