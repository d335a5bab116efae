"""MLflow tracking: the only package of locvit that talks to MLflow.

``backend`` (URI, bounded connections, retries, ``connect``), ``sqlite`` (databases built and upgraded whole),
``tree`` (study, variant and seed runs, found by tags), ``run`` (a training run's MLflow run and test scores),
``sync`` (``locvit sync-tracking``: uploads what a run kept in metrics.json while the backend was down; not
imported here, so training does not depend on it), ``ui`` (``locvit mlflow-ui``), ``server`` (``locvit
mlflow-server``, with basic-auth). One experiment per study.
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
