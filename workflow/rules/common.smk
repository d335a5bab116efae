# Target lists, paths and input functions shared by the rules (no logic in rules).
import json
import os
import re
import shlex
import sys

from locvit.config import run_config, variant_fraction

STUDY_DIR = f"{P['results_dir']}/{P['study']}"
DATA_DIR = f"{STUDY_DIR}/data"  # the FFCV files at data.train_fraction; other fractions: data_<percent>pct
RUNS_DIR = f"{STUDY_DIR}/runs"
EVAL_DIR = f"{STUDY_DIR}/eval"
ANALYSIS_DIR = f"{STUDY_DIR}/analysis"  # JSON: DVC metrics
MAPS_DIR = f"{STUDY_DIR}/maps"  # arrays (npz) the plots are drawn from
SEARCH_DIR = f"{STUDY_DIR}/search"
REPORT_DIR = f"{STUDY_DIR}/report"
LOG_DIR = f"{STUDY_DIR}/logs"
# Default MLflow backend (MLFLOW_TRACKING_URI overrides it); artifacts go to mlartifacts/ beside it.
TRACKING_DB = f"{STUDY_DIR}/mlflow.db"
VARIANTS = list(P["variants"])
SEEDS = P["seeds"]
SEARCH = P.get("mask_search")  # None: the study runs no mask search
SEARCH_ROUNDS = list(range(SEARCH["rounds"])) if SEARCH else []
# The same interpreter that runs Snakemake runs the jobs (works without an activated venv).
LOCVIT = f"{shlex.quote(sys.executable)} -m locvit"
ENV = "../envs/locvit.yaml"


wildcard_constraints:
    variant="|".join(re.escape(v) for v in VARIANTS),
    datadir=r"data(_\d+pct)?",
    seed=r"\d+",
    round=r"\d+",


def report_files():
    return [f"{REPORT_DIR}/results.{ext}" for ext in ("md", "csv", "tex")] + [f"{REPORT_DIR}/results_seeds.csv"] + [
        f"{REPORT_DIR}/{name}" for name in ("summary.json", "index.md", "report.json", "tables", "figures", "pdf")]


def search_files():
    """The mask search's table (when the study has a mask_search section)."""
    return [f"{REPORT_DIR}/mask_search.md", f"{REPORT_DIR}/mask_search.json"] if SEARCH else []


def analysis_files(wildcards):
    return expand(f"{ANALYSIS_DIR}/{{variant}}/seed{{seed}}.json", variant=VARIANTS, seed=SEEDS) + expand(
        f"{ANALYSIS_DIR}/{{variant}}/profile.json", variant=VARIANTS)


def report_dir(wildcards, output):
    """The report folder, from the report's own output (results/<study>/report)."""
    return os.path.dirname(output.md)


def study_dir(wildcards, output):
    """results/<study>, the folder the report reads (eval/, runs/, analysis/, maps/)."""
    return os.path.dirname(os.path.dirname(output.md))


def metrics_files(wildcards):
    return expand(f"{RUNS_DIR}/{{variant}}/seed{{seed}}/metrics.json", variant=VARIANTS, seed=SEEDS)


def eval_files(wildcards):
    return expand(f"{EVAL_DIR}/{{variant}}/seed{{seed}}.json", variant=VARIANTS, seed=SEEDS)


def variant_checkpoints(wildcards):
    """The best checkpoint of every seed of one variant (scored together by one evaluate job)."""
    return expand(f"{RUNS_DIR}/{wildcards.variant}/seed{{seed}}/best.pt", seed=SEEDS)


def data_dir(fraction):
    """The folder of the FFCV files a run at this training fraction reads (train_fractions)."""
    return DATA_DIR if fraction == P["data"]["train_fraction"] else f"{STUDY_DIR}/data_{round(100 * fraction)}pct"


def variant_data(wildcards):
    """The prepared files of the variant's training fraction: train, val, test, manifest (for unpack)."""
    folder = data_dir(variant_fraction(P, wildcards.variant))
    return {split: f"{folder}/{split}.beton" for split in ("train", "val", "test")} | {
        "manifest": f"{folder}/manifest.json"}


def train_data(wildcards):
    return {k: v for k, v in variant_data(wildcards).items() if k != "test"}


def test_data(wildcards):
    return {k: v for k, v in variant_data(wildcards).items() if k in ("test", "manifest")}


def data_config(wildcards):
    """The data section at the folder's training fraction: a params trigger, so changing it re-runs prepare
    and all after it."""
    match = re.fullmatch(r"data_(\d+)pct", wildcards.datadir)
    fraction = int(match.group(1)) / 100 if match else P["data"]["train_fraction"]
    return json.dumps({**P["data"], "train_fraction": fraction}, sort_keys=True)


def analysis_config(wildcards):
    """The analysis section: a params trigger, so changing it re-runs every analyse job."""
    return json.dumps(P["analysis"], sort_keys=True)


def search_config(wildcards):
    return json.dumps(SEARCH, sort_keys=True)


def search_previous(wildcards):
    """Round r > 0 derives its masks from round r-1's spec and analysis."""
    r = int(wildcards.round)
    if r == 0:
        return {}
    return {"spec": f"{SEARCH_DIR}/round{r - 1}/spec.json", "analysis": f"{SEARCH_DIR}/round{r - 1}/analysis.json"}


def search_previous_args(wildcards, input):
    """The search-spec options naming the previous round's files (none for round 0)."""
    if int(wildcards.round) == 0:
        return ""
    return f"--previous-spec {shlex.quote(input.spec)} --previous-analysis {shlex.quote(input.analysis)}"


def search_base_config(wildcards):
    """The search's base run config (a params trigger); the round's masks come from its spec file."""
    return json.dumps(run_config(P, SEARCH["variant"], SEARCH["seed"]), sort_keys=True)


def search_spec_file(wildcards):
    """A round's spec: the output of the search_spec checkpoint (Snakemake re-evaluates after it)."""
    return checkpoints.search_spec.get(round=wildcards.round).output.spec


def search_round_files(name):
    return [f"{SEARCH_DIR}/round{r}/{name}" for r in SEARCH_ROUNDS]


def train_launcher(wildcards, resources):
    """`python -m locvit`, or torchrun with one process per GPU when the job's `gpu` resource asks for several.

    The cluster profile sets `gpu` for each step in cluster/config.yaml; on one machine, e.g.
    `--set-resources train:gpu=4`. --standalone: a private rendezvous on a free local port, so jobs
    sharing a node never meet.
    """
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus <= 1:
        return LOCVIT
    return f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc_per_node {gpus} -m locvit"


def train_threads(wildcards, threads, resources):
    """The job's CPU threads shared out over its processes (one per GPU)."""
    return max(1, threads // max(1, int(resources.get("gpu", 0) or 0)))


# train_jobs: one training job per run (variant, seed), or per variant (its seeds one after another in one process).
TRAIN_PER_VARIANT = P["train_jobs"] == "per_variant"


def train_outputs(name):
    """A training job's outputs: one run's file, or every seed's of a variant (train_jobs: per_variant)."""
    if TRAIN_PER_VARIANT:
        return [f"{RUNS_DIR}/{{variant}}/seed{s}/{name}" for s in SEEDS]
    return f"{RUNS_DIR}/{{variant}}/seed{{seed}}/{name}"


def job_seeds(wildcards):
    return SEEDS if TRAIN_PER_VARIANT else [int(wildcards.seed)]


def run_config_json(wildcards):
    """The resolved configs of the job's runs (a JSON list): a params trigger, so a changed variant re-trains
    only itself."""
    return json.dumps([run_config(P, wildcards.variant, s) for s in job_seeds(wildcards)], sort_keys=True)


def keep_finished(wildcards):
    """A variant's job re-run (a seed added, one of its runs cut) restores its finished runs, never retrains them."""
    return "--keep-finished" if TRAIN_PER_VARIANT else ""


def run_dirs(wildcards):
    """The job's run folders, in the order of run_config_json."""
    return [f"{RUNS_DIR}/{wildcards.variant}/seed{s}" for s in job_seeds(wildcards)]

