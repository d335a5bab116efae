# Target lists, paths and input functions shared by the rules (no logic in rules).
import json
import re
import shlex
import sys

from locvit.config import run_config

STUDY_DIR = f"{P['results_dir']}/{P['study']}"
DATA_DIR = f"{STUDY_DIR}/data"
RUNS_DIR = f"{STUDY_DIR}/runs"
EVAL_DIR = f"{STUDY_DIR}/eval"
REPORT_DIR = f"{STUDY_DIR}/report"
LOG_DIR = f"{STUDY_DIR}/logs"
# Default MLflow backend (MLFLOW_TRACKING_URI overrides it); artifacts go to mlartifacts/ beside it.
TRACKING_DB = f"{STUDY_DIR}/mlflow.db"
VARIANTS = list(P["variants"])
SEEDS = P["seeds"]
# The same interpreter that runs Snakemake runs the jobs (works without an activated venv).
LOCVIT = f"{shlex.quote(sys.executable)} -m locvit"
ENV = "../envs/locvit.yaml"


wildcard_constraints:
    variant="|".join(re.escape(v) for v in VARIANTS),
    seed=r"\d+",


def report_files():
    return [f"{REPORT_DIR}/results.{ext}" for ext in ("md", "csv", "tex")] + [f"{REPORT_DIR}/summary.json"]


def eval_files(wildcards):
    return expand(f"{EVAL_DIR}/{{variant}}/seed{{seed}}.json", variant=VARIANTS, seed=SEEDS)


def variant_checkpoints(wildcards):
    """The best checkpoint of every seed of one variant (scored together by one evaluate job)."""
    return expand(f"{RUNS_DIR}/{wildcards.variant}/seed{{seed}}/best.pt", seed=SEEDS)


def data_config(wildcards):
    """The data section: a params trigger, so changing it re-runs prepare and all after it."""
    return json.dumps(P["data"], sort_keys=True)


def run_config_json(wildcards):
    """The resolved config of one run: a params trigger, so a changed variant re-trains only itself."""
    return json.dumps(run_config(P, wildcards.variant, int(wildcards.seed)), sort_keys=True)

