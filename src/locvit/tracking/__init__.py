"""MLflow tracking: the only package of locvit that talks to MLflow.

- :mod:`~locvit.tracking.backend`: the backend's URI (the study's SQLite file or
  ``MLFLOW_TRACKING_URI``), bounded connections and probes, retries, the study's
  experiment, :func:`~locvit.tracking.backend.connect` for any step that reads runs;
- :mod:`~locvit.tracking.sqlite`: MLflow's SQLite files (the study's, the server's login
  database) built and upgraded whole or not at all;
- :mod:`~locvit.tracking.tree`: the study's run tree (study, variants, seeds), found by tags;
- :mod:`~locvit.tracking.run`: a training run's MLflow run (its lifecycle, tags, params,
  SLURM provenance), test scores logged to it, and the loud notice when tracking fails;
- :mod:`~locvit.tracking.sync`: ``locvit sync-tracking``, which uploads the records a run
  kept while its backend was unreachable (the offline spool is the run's metrics.json); the
  package does not import it, so training and evaluation do not depend on it;
- :mod:`~locvit.tracking.ui`: ``locvit mlflow-ui`` on a study's database;
- :mod:`~locvit.tracking.server`: ``locvit mlflow-server``, the study's database served to
  jobs on many nodes, with MLflow's basic-auth login.

One experiment per study; in it a study run, one run per variant under it and one run per
(variant, seed) under its variant's (:mod:`~locvit.tracking.tree`).
"""

from locvit.tracking.backend import (
    HTTP_LIMITS,
    PROBE_READ_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    TrackingAuthError,
    TrackingUnreachable,
    bounded_http,
    check_reachable,
    compare_link,
    connect,
    default_uri,
    experiments_of,
    log_files,
    log_metrics,
    retry,
    safe_uri,
    set_tags,
    setup,
    ui_link,
)
from locvit.tracking.run import (
    TrainingTracker,
    confirm_finished,
    failure_notice,
    log_evaluation,
    slurm_provenance,
    sync_command,
)

__all__ = [
    "HTTP_LIMITS",
    "PROBE_READ_TIMEOUT_S",
    "PROBE_TIMEOUT_S",
    "TrackingAuthError",
    "TrackingUnreachable",
    "TrainingTracker",
    "bounded_http",
    "check_reachable",
    "compare_link",
    "confirm_finished",
    "connect",
    "log_metrics",
    "set_tags",
    "default_uri",
    "experiments_of",
    "failure_notice",
    "log_evaluation",
    "log_files",
    "ui_link",
    "retry",
    "safe_uri",
    "setup",
    "slurm_provenance",
    "sync_command",
]
