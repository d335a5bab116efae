# Target lists, paths and input functions shared by the rules (no logic in rules).
import functools
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from locvit.config.run import data_folders, seed_sets, train_resources, variant_fraction, variant_seeds
from locvit.config.jobs import changed_job_configs, write_job_configs, write_plan_copies
from locvit.layout import REPORT_FILES, REPORT_FOLDERS, ROUND_FILES, SEARCH_TABLE, STUDY_PARAMS_ENV, RunFiles, StudyLayout
from locvit.tracking.run import SYSTEM_METRICS_ENV
from locvit import device
from locvit.train import gpus, launch
from locvit import versioning

# Where every file of the study lives (locvit.layout), with Snakemake's wildcards in place.
LAYOUT = StudyLayout.of(P)
DATA_FILES = {k: str(v) for k, v in LAYOUT.data_files(name="{datadir}").items()}  # data/, data_<pct>pct/, .../seed<k>/
# at data.train_fraction (the mask search's; its seed's split where each seed has one)
MAIN_DATA = {k: str(v) for k, v in LAYOUT.data_files(seed=P["mask_search"]["seed"] if P.get("mask_search") else None).items()}
RUN_DIR = str(LAYOUT.run_dir("{variant}", "{seed}"))
RUN_FILES = LAYOUT.run_files("{variant}", "{seed}")  # best.pt, metrics.json, ... of one run
EVAL_FILE = str(LAYOUT.eval_file("{variant}", "{seed}"))
ANALYSIS_FILE = str(LAYOUT.analysis_file("{variant}", "{seed}"))  # JSON: DVC metrics
PROFILE_FILE = str(LAYOUT.profile_file("{variant}"))
MAPS_FILE = str(LAYOUT.maps_file("{variant}", "{seed}"))  # arrays (npz) the plots are drawn from
ROUND_DIR = str(LAYOUT.search_round("{round}"))
ROUND_RUN = RunFiles.at(ROUND_DIR)  # a round trains one run into its folder
ROUND = {role: str(LAYOUT.round_file("{round}", role)) for role in ROUND_FILES}  # spec, eval, analysis, ...
REPORT_DIR = str(LAYOUT.report)
REPORT = {role: LAYOUT.report_file(role) for role in (*REPORT_FILES, *REPORT_FOLDERS)}  # results.md, ...
THROUGHPUT_FILE = str(LAYOUT.throughput_file)  # every variant's images/s, measured side by side (CSV)
LOG_DIR = str(LAYOUT.logs)
# Each job's part of params.yaml, resolved into a file it takes as input (locvit.config.jobs): a params change
# re-runs the jobs whose file changed, in a fresh clone too. The files missing or out of date are found here,
# reading only, and written when Snakemake first asks for a job's inputs, when it knows whether it runs: a run
# writes them in place; a plan (-n; --summary, --dag) writes copies under PLAN_DIR, in Snakemake's own folder,
# and its jobs take those, so it plans what the run will do and leaves the study as it was.
CHANGED_CONFIGS = changed_job_configs(P)
PLAN_DIR = Path(".snakemake") / "locvit-plan"


@functools.cache
def config_copies():
    """The changed configs written, once: in place by a run (--touch included), as copies by a plan (path ->
    its copy; a dry run knows it is one, and --summary or --dag has no executor)."""
    if workflow.executor_plugin is not None and not workflow.dryrun:
        write_job_configs(P, CHANGED_CONFIGS)
        shutil.rmtree(PLAN_DIR, ignore_errors=True)  # an earlier plan's copies
        return {}
    if CHANGED_CONFIGS:
        print(f"locvit: a plan writes no job config; the {len(CHANGED_CONFIGS)} missing or changed (e.g. "
              f"{next(iter(CHANGED_CONFIGS))}) are planned from copies under {PLAN_DIR}/", file=sys.stderr)
    return write_plan_copies(CHANGED_CONFIGS, PLAN_DIR)


def config_path(path):
    """A job config's path for this Snakemake: the file (a run writes the changed ones first), or a plan's copy."""
    return str(config_copies().get(Path(path), path))


def job_config(pattern):
    """An input function: the job's config file, ``pattern`` with the job's wildcards (config_path)."""
    def config_file(wildcards):
        return config_path(pattern.format(**dict(wildcards.items())))
    return config_file


RUN_CONFIG = str(LAYOUT.train_config("{variant}", "{seed}"))
PREPARE_CONFIG = job_config(str(LAYOUT.job_config("prepare", "{datadir}")))
ANALYSE_CONFIG = job_config(str(LAYOUT.job_config("analyse")))
THROUGHPUT_CONFIG = job_config(str(LAYOUT.job_config("throughput")))
REPORT_CONFIG = job_config(str(LAYOUT.job_config("report")))
SEARCH_CONFIG = job_config(str(LAYOUT.job_config("search")))
SEARCH_TRAIN_CONFIG = job_config(str(LAYOUT.job_config("search_train")))
SEARCH_TABLE_CONFIG = job_config(str(LAYOUT.job_config("search_table")))
# Default MLflow backend (MLFLOW_TRACKING_URI overrides it); artifacts go to mlartifacts/ beside it.
TRACKING_DB = str(LAYOUT.tracking_db)
# How often training samples MLflow's system metrics, handed to the jobs (local or sbatch) in the environment:
# a rule param would make Snakemake retrain every run when it changes, and it changes no result.
os.environ[SYSTEM_METRICS_ENV] = str(P["tracking"]["system_metrics_s"])
# The study's params file, logged by the report as it is, in the environment too: as a param, another path to
# the same file (absolute, relative, a symlink) would re-run the report.
os.environ[STUDY_PARAMS_ENV] = os.path.abspath(PARAMS_FILE)
VARIANTS = list(P["variants"])
# Variants grouped by their seeds (seed_budget gives smaller training fractions more): the per-variant
# rules (train per_variant, evaluate, analyse) are defined once per group, as their outputs list the seeds.
SEED_SETS = seed_sets(P)
# Each data folder of the study -> its training fraction (train_fractions) and split seed (data.split).
DATA_FOLDERS = data_folders(P)
SEARCH = P.get("mask_search")  # None: the study runs no mask search
SEARCH_ROUNDS = list(range(SEARCH["rounds"])) if SEARCH else []
# The same interpreter that runs Snakemake runs the jobs (works without an activated venv), named in the
# environment, not in a rule: what Snakemake records of a job (params, inputs, outputs, its command) holds
# no path of this machine's, so another path to the interpreter, a moved checkout or another venv re-run
# nothing. A job's code is its `code` param instead: a digest of the source its command runs.
os.environ[launch.PYTHON_ENV] = sys.executable
LOCVIT = f"{launch.PYTHON} -m locvit"


ACCEPTED = versioning.accepted(LAYOUT)  # code changes the user accepted (locvit accept)


@functools.cache
def job_code(command, variants=None):
    """What the code of a `locvit <command>` job for ``variants`` (None: every variant) computes
    (locvit.versioning.job_code): a comment, a docstring or a family no variant of the job runs changes nothing.
    Where the user accepted that code for the job, the code it ran with (locvit.versioning.recorded_code)."""
    per_variant = command in ("train", "evaluate", "analyse") and variants and len(variants) == 1
    key = versioning.job_key(command, variants[0] if per_variant else None)  # as locvit status names the job
    return versioning.recorded_code(versioning.job_code(P, command, variants), key, ACCEPTED)


def code_digest(command):
    """A rule's `code` param: job_code, of the job's own variant for the per-variant rules (a function of its
    wildcards), of the mask search's variant for the search's rules."""
    if command in ("train", "evaluate", "analyse"):
        return lambda wildcards: job_code(command, (job_variant(wildcards),))
    if command in ("search-spec", "search-table"):
        return job_code(command, (SEARCH["variant"],) if SEARCH else ())
    return job_code(command)


wildcard_constraints:
    variant="|".join(re.escape(v) for v in VARIANTS),
    datadir="|".join(re.escape(d) for d in DATA_FOLDERS),
    seed=r"\d+",
    round=r"\d+",


def report_files():
    """The report's files, the throughput job's CSV among them."""
    return [str(REPORT[role]) for role in REPORT] + [THROUGHPUT_FILE]


def search_files():
    """The mask search's table (when the study has a mask_search section)."""
    return [str(LAYOUT.search_table(ext)) for ext in SEARCH_TABLE] if SEARCH else []


def seed_set_rules(rule_name):
    """(rule name, seeds, variant pattern) per group of variants with the same seeds; the study's own seeds
    keep the plain rule name, another group's rule is named by its seed count (``evaluate_10seeds``)."""
    names = set()
    for seeds, variants in SEED_SETS.items():
        name = rule_name if not names else f"{rule_name}_{len(seeds)}seeds"
        name = name if name not in names else f"{name}_{len(names)}"
        names.add(name)
        yield name, list(seeds), "|".join(re.escape(v) for v in variants)


def every_run(pattern):
    """``pattern`` (with {variant} and {seed}) for every variant and each of its seeds."""
    return [path for v in VARIANTS for path in expand(pattern, variant=v, seed=variant_seeds(P, v))]


def analysis_files(wildcards):
    return every_run(ANALYSIS_FILE) + expand(PROFILE_FILE, variant=VARIANTS)


def report_dir(wildcards, output):
    """The report folder, from the report's own output (a prefix param, as Snakemake's lint asks)."""
    return os.path.dirname(output.md)


def study_dir(wildcards, output):
    """The study's folder, the report folder's parent (it holds eval/, runs/, analysis/, maps/)."""
    return os.path.dirname(os.path.dirname(output.md))


def metrics_files(wildcards):
    return every_run(str(RUN_FILES.metrics))


def eval_files(wildcards):
    return every_run(EVAL_FILE)


def variant_checkpoints(wildcards):
    """The best checkpoint of every seed of one variant (scored together by one evaluate job)."""
    return expand(str(RUN_FILES.best), variant=wildcards.variant, seed=variant_seeds(P, wildcards.variant))


def train_data(wildcards):
    """The prepared files a run trains on (for unpack): train, val, manifest of its fraction (and seed's split)."""
    files = LAYOUT.data_files(variant_fraction(P, wildcards.variant), seed=getattr(wildcards, "seed", None))
    return {k: str(v) for k, v in files.items() if k != "test"}


def test_data(wildcards):
    """The test file and manifest a variant's runs are scored on: one, or each seed's (data.split: per_seed)."""
    seeds = variant_seeds(P, wildcards.variant) if LAYOUT.per_seed else [None]
    files = [LAYOUT.data_files(variant_fraction(P, wildcards.variant), seed=s) for s in seeds]
    return {k: [str(f[k]) for f in files] for k in ("test", "manifest")}


def every_core(wildcards):
    """All the cores Snakemake was given (--cores): a local run starts nothing beside the job. A cluster run
    gives no --cores; there the profile's set-threads sizes the job (and SLURM gives it a node of its own)."""
    return workflow.cores


def search_previous(wildcards):
    """Round r > 0 derives its masks from round r-1's spec and analysis."""
    r = int(wildcards.round)
    if r == 0:
        return {}
    return {role: str(LAYOUT.round_file(r - 1, role)) for role in ("spec", "analysis")}


def search_previous_args(wildcards, input):
    """The search-spec options naming the previous round's files (none for round 0)."""
    if int(wildcards.round) == 0:
        return ""
    return f"--previous-spec {shlex.quote(input.spec)} --previous-analysis {shlex.quote(input.analysis)}"


def search_spec_file(wildcards):
    """A round's spec: the output of the search_spec checkpoint (Snakemake re-evaluates after it)."""
    return checkpoints.search_spec.get(round=wildcards.round).output.spec


def search_round_files(role):
    return expand(ROUND[role], round=SEARCH_ROUNDS)


# What a training job asks for: under the cluster profile, its variant's resources in params
# (locvit.config.run.train_resources) as the SLURM executor's resources (locvit.train.launch.slurm_resources);
# in a local run, the same cut to this machine's CPUs, memory and GPUs (locvit.train.gpus.local_resources),
# with as many training jobs at once as it has GPUs. None leaves one unset.
def job_variant(wildcards):
    """The variant a training job trains (a mask-search round trains the search's variant)."""
    return wildcards.get("variant") or SEARCH["variant"]


def cluster_run():
    """Whether the jobs go to a cluster: the SLURM executor (--profile cluster) submits them, or this is
    the Snakemake inside a cluster job (the job step's, and the one it starts for the job itself, which
    evaluates the job's resources again: it must size the job as the submitter did), dry runs and --touch
    of a cluster run included. Known once Snakemake executes (resources are evaluated then); without an
    executor (--lint, --summary) a local run."""
    if workflow.remote_exec:
        return True
    plugin = workflow.executor_plugin
    if plugin is None:
        return False
    if not plugin.common_settings.local_exec:
        return True
    # -n and --touch run a stand-in executor; Snakemake uses threads for the one asked for when it is remote
    return (workflow.dryrun or workflow.touch) and workflow.execution_settings.use_threads


def local_main_run():
    """Whether this Snakemake runs the jobs here itself (no --jobs: a local run or its dry run); known when
    the Snakefile is read, unlike the executor."""
    return workflow.is_main_process and workflow.resource_settings.nodes is None


# This machine's sizes (locvit.device.machine), said once; in a local run the `gpu` resource is limited to
# its GPUs (unless --resources gpu=N says otherwise): one training job per GPU at a time.
MACHINE = device.machine() if local_main_run() else None
# There a training job takes GPUs no other job holds (locvit.train.gpus: the rules' `claim` param, the same
# text in every run; this variable turns it on).
os.environ.pop(gpus.CLAIM_ENV, None)
if MACHINE and MACHINE["gpus"]:
    os.environ[gpus.CLAIM_ENV] = "1"
if MACHINE:
    workflow.global_resources.setdefault("gpu", MACHINE["gpus"])
    at_once = workflow.global_resources["gpu"].value
    print(f"locvit: local sizes: this machine's {MACHINE['cpus']} CPUs, {MACHINE['mem_mb']} MB, "
          f"{MACHINE['gpus']} GPU(s); " + (f"training jobs on GPUs at once: {at_once} (--resources gpu=N)"
                                           if MACHINE["gpus"] else "training on the CPU, within --cores") +
          "; params' cluster sizes apply under --profile cluster", file=sys.stderr)


def job_resources(wildcards):
    sizes = train_resources(P, job_variant(wildcards))
    return launch.slurm_resources(sizes) if cluster_run() else gpus.local_resources(sizes, MACHINE or device.machine())


def train_resource(key):
    return lambda wildcards: job_resources(wildcards)[key]


TRAIN_RESOURCES = {key: train_resource(key) for key in launch.SLURM_KEYS}  # rules train, search_train


def train_launcher(wildcards, resources):
    """`python -m locvit`, torchrun over the node's GPUs, or `locvit launch` over several nodes."""
    return launch.rule_prefix(resources)


def grouped_with(rule_name, alone_if_side_by_side=False):
    """A training job's group on the cluster: its evaluation's (the profile's `groups`), or none.

    None over several nodes (their allocation is not held for the one-GPU steps after them), and,
    with alone_if_side_by_side, where a group would hold several trainings side by side (seeds with
    train_jobs per_run, group-components > 1): the SLURM executor runs a group's jobs one at a
    time, but Snakemake sizes side-by-side jobs as parallel (sizes added, the longest runtime).
    """
    def group(wildcards):
        name = workflow.group_settings.overwrite_groups.get(rule_name)
        if name is None or train_resources(P, job_variant(wildcards))["nodes"] > 1:
            return None
        several = workflow.group_settings.group_components.get(name, 1) > 1 or (
            P["train_jobs"] == "per_run" and len(variant_seeds(P, job_variant(wildcards))) > 1)
        return None if alone_if_side_by_side and several else name
    return group


# train_jobs: one training job per run (variant, seed), or per variant (its seeds one after another in one process).
TRAIN_PER_VARIANT = P["train_jobs"] == "per_variant"


def train_outputs(role, seeds):
    """A training job's outputs: one run's file (RunFiles' ``best``, ``metrics``), or every seed's of a
    variant (train_jobs: per_variant)."""
    path = str(getattr(RUN_FILES, role))
    return expand(path, seed=seeds, allow_missing=True) if TRAIN_PER_VARIANT else path


def job_seeds(wildcards):
    return variant_seeds(P, wildcards.variant) if TRAIN_PER_VARIANT else [int(wildcards.seed)]


def run_configs(wildcards):
    """The config files of the job's runs (locvit.config.jobs): a changed variant re-trains only itself."""
    return [config_path(path) for path in expand(RUN_CONFIG, variant=wildcards.variant, seed=job_seeds(wildcards))]


def keep_finished(wildcards):
    """A variant's job re-run (a seed added, one of its runs cut) restores its finished runs, never retrains them."""
    return "--keep-finished" if TRAIN_PER_VARIANT else ""


def run_dirs(wildcards):
    """The job's run folders, in the order of run_configs."""
    return expand(RUN_DIR, variant=wildcards.variant, seed=job_seeds(wildcards))

