"""``locvit status``: what ``snakemake -n`` would re-run in a study, why, and at what cost (29/34).

Snakemake's dry run is the truth; this summarises it per job: the code that changed (a rule's ``code`` param,
``locvit.versioning.job_code``: locvit's shared code as one digest, each family file by name), a config file
or an input that changed, or a job not run yet, with the job's cost class and, for training, the study's cost
estimate (``locvit.analysis.cost``). ``check`` compares each re-planned training run's fingerprint, recorded
when it trained (``locvit.train.fingerprint``), with the one the code computes now.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from locvit.errors import InputError

#: A rule's cost class: what re-running one of its jobs costs.
COST_CLASS = {
    "prepare": "prepare",
    "train": "train",
    "search_train": "train",
    "evaluate": "evaluate",
    "search_evaluate": "evaluate",
    "analyse": "analyse",
    "search_analyse": "analyse",
}
SHARED = "locvit's shared code (engine, data, config, ...)"


@dataclass
class Job:
    rule: str
    wildcards: dict[str, str]
    reason: str

    @property
    def name(self) -> str:
        variant = self.wildcards.get("variant")
        return f"{self.rule} {variant}" if variant else self.rule

    @property
    def cost_class(self) -> str:
        return COST_CLASS.get(re.sub(r"_\d+seeds(_\d+)?$", "", self.rule), "report")


def dry_run(params_file: Path) -> str:
    """The output of ``snakemake -n all`` of ``params_file``'s study (run in the working directory)."""
    snakemake = Path(sys.executable).with_name("snakemake")
    cmd = [str(snakemake), "-n", "all", "--config", f"params={params_file}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        said = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise InputError(f"status: `{' '.join(cmd)}` failed (exit {proc.returncode}): {' | '.join(said[-4:])}")
    return proc.stdout + proc.stderr


def planned_jobs(output: str) -> list[Job]:
    """The jobs of a dry run's output (its ``rule``/``checkpoint`` blocks), ``all`` left out."""
    jobs = []
    for block in re.split(r"^(?=(?:localrule|rule|localcheckpoint|checkpoint) \w+:$)", output, flags=re.M)[1:]:
        rule = re.match(r"\w+ (\w+):", block)[1]
        wildcards = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        reason = re.search(r"^\s+reason: (.*)$", block, re.M)
        pairs = dict(p.split("=", 1) for p in wildcards[1].split(", ")) if wildcards else {}
        if rule != "all":
            jobs.append(Job(rule, pairs, reason[1].strip() if reason else ""))
    return jobs


def why(job: Job) -> str:
    """A job's reason in a few words: the code that changed, by name where Snakemake's params show it."""
    reason = job.reason
    if reason.startswith("Params have changed"):
        before = re.search(r"before: '([^']*)'", reason)
        now = re.search(r"now: '([^']*)'", reason)
        if before and now:
            return "code: " + ", ".join(changed_code(before[1], now[1]))
        return "params changed"
    if reason.startswith("Updated input files"):
        return "its config or input changed: " + reason.split(":", 1)[1].strip()
    if reason.startswith("Input files updated by another job"):
        return "an input it reads re-runs"
    if reason.startswith("Missing output files"):
        return "not run yet"
    return reason


def changed_code(before: str, now: str) -> list[str]:
    """The parts of two ``job_code`` texts that differ: ``SHARED`` for the first digest, else each module."""
    old, new = before.split(), now.split()
    changed = [SHARED] if old[:1] != new[:1] else []
    old_named, new_named = dict(p.split("=", 1) for p in old[1:]), dict(p.split("=", 1) for p in new[1:])
    for name in sorted(set(old_named) | set(new_named)):
        if old_named.get(name) != new_named.get(name):
            changed.append(name if name in new_named else f"{name} (gone)")
    return changed or ["params changed"]


def check_runs(params: dict, variant: str) -> list[str]:
    """Each run of ``variant``: its recorded fingerprint against the one the code computes now."""
    from locvit.config.run import run_config, variant_seeds
    from locvit.layout import StudyLayout
    from locvit.train.fingerprint import fingerprint

    layout, lines = StudyLayout.of(params), []
    for seed in variant_seeds(params, variant):
        path = layout.run_files(variant, seed).metrics
        try:
            recorded = json.loads(path.read_text()).get("fingerprint")
        except (OSError, ValueError):
            recorded = None
        if recorded is None:
            verdict = f"no fingerprint recorded in {path} (not trained, or by a locvit before 29/34): retrain"
        elif fingerprint(run_config(params, variant, seed)) == recorded:
            verdict = "fingerprint equal: the changed code computes this run as before on fixed inputs"
        else:
            verdict = "fingerprint differs: the change alters this run's training; retrain"
        lines.append(f"  {variant} seed {seed}: {verdict}")
    return lines


def status(params_file: Path, check: bool = False) -> list[str]:
    """The lines ``locvit status`` prints."""
    from locvit.analysis.cost import study_cost
    from locvit.config import load_params

    params = load_params(params_file, check_models=False)
    jobs = planned_jobs(dry_run(params_file))
    if not jobs:
        return [f"{params_file}: study {params['study']!r}: nothing would re-run (snakemake -n)"]
    costs = {row["variant"]: row for row in study_cost(params)}
    rows = []
    for job in jobs:
        cost = job.cost_class
        row = costs.get(job.wildcards.get("variant", ""))
        if cost == "train" and row is not None and job.rule == "train":
            hours = row["gpu_hours"]
            gpu_h = "?" if hours is None else f"{hours:.2f}" if hours >= 0.01 else "<0.01"
            cost = f"train: {gpu_h} GPU-h, {row['runs']} run(s) (locvit validate's estimate)"
        rows.append((job.name, why(job), cost))
    width = [max(len(r[i]) for r in rows + [("job", "why", "cost")]) for i in range(2)]
    lines = [f"{params_file}: study {params['study']!r}: {len(jobs)} job(s) would run (snakemake -n)"]
    lines += [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in [("job", "why", "cost"), *rows]]
    if check:
        trained = [j for j in jobs if j.rule.startswith("train") and j.reason.startswith("Params have changed")]
        lines.append("fingerprints of the training runs whose code changed (locvit.train.fingerprint):")
        for job in trained:
            lines += check_runs(params, job.wildcards["variant"])
        if not trained:
            lines.append("  none: no training job re-runs for a code change")
    return lines


# Accepting a change ------------------------------------------------------------------------------------------
# `locvit accept` records, per job, that its new code may keep what it made: the ledger (layout.accepted_code)
# maps the job's new `code` param to the one Snakemake recorded (the Snakefile then finds it unchanged), and a
# training job's runs record the acceptance in metrics.json, best.pt and last.pt (their run key and model code
# now the new code's, so evaluation loads the checkpoint and a later re-run of the job restores it) and in the
# MLflow run's tags. The outputs keep their file times: Snakemake sees nothing newer.

COMMANDS = {"search_train": "train", "search_evaluate": "evaluate", "search_analyse": "analyse"}


def command_of(job: Job) -> str:
    """The ``locvit`` command a job's rule runs (whose code its ``code`` param is)."""
    rule = re.sub(r"_\d+seeds(_\d+)?$", "", job.rule)
    return COMMANDS.get(rule, rule).replace("_", "-")


def code_change(job: Job) -> tuple[str, str] | None:
    """(the code it ran with, its code now) of a job re-planned for its code alone, else None."""
    found = re.search(r"before: '([0-9a-f]{16}[^']*)' now: '([0-9a-f]{16}[^']*)'$", job.reason)
    return (found[1], found[2]) if found else None


def accept(params_file: Path, names: list[str], cleared: bool, because: str) -> list[str]:
    """Accept the code change of the jobs ``names`` (by hand) and, with ``cleared``, of every training job
    whose runs' fingerprints are all equal, ``because`` (the user's reason, recorded); the lines to print."""
    import datetime

    from locvit.config import load_params
    from locvit.io import write_json
    from locvit.layout import StudyLayout
    from locvit.versioning import accepted, commit_after_snakemake, job_key

    params = load_params(params_file, check_models=False)
    layout = StudyLayout.of(params)
    planned = planned_jobs(dry_run(params_file))
    unknown = [name for name in names if name not in {job.name for job in planned}]
    if unknown:
        raise InputError(
            f"accept: {', '.join(map(repr, unknown))}: not a job snakemake -n plans; it plans: "
            f"{', '.join(job.name for job in planned) or 'nothing'} (locvit status says why)"
        )
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines, done, checked = [], [], set()
    while True:  # a job re-planned after an accepted one shows its own change only once that one is accepted
        chosen = {}
        for job in planned:
            if not code_change(job) or job.name in done:
                continue
            if job.name in names:
                chosen[job.name] = (job, "by hand")
            elif cleared and command_of(job) == "train" and job.rule == "train" and job.name not in checked:
                checked.add(job.name)
                checks = check_runs(params, job.wildcards["variant"])
                lines += checks
                if all("fingerprint equal" in line for line in checks):
                    chosen[job.name] = (job, "fingerprint equal")
        if not chosen:
            break
        ledger = accepted(layout)
        for name, (job, how) in chosen.items():
            ran_with, now = code_change(job)
            entry = {"now": now, "ran_with": ran_with, "how": how, "why": because, "at": at}
            ledger[job_key(command_of(job), job.wildcards.get("variant"))] = entry
            if command_of(job) == "train":
                lines += record_in_runs(params, job.wildcards["variant"], entry)
            lines.append(f"accepted {name} ({how}): {because}")
            done.append(name)
        write_json(layout.accepted_code, ledger)
        planned = planned_jobs(dry_run(params_file))
    lines += [
        f"not accepted: {job.name} re-runs for another reason ({why(job)})"
        for job in planned
        if job.name in names and job.name not in done
    ]
    if not done:
        return [*lines, "accept: nothing accepted (no named job re-runs for its code, no training run cleared)"]
    left = [job.name for job in planned]
    lines.append(f"recorded in {layout.accepted_code}; snakemake -n now plans: {', '.join(left) or 'nothing'}")
    return [*lines, f"DVC: {commit_after_snakemake(str(params_file))}"]


def record_in_runs(params: dict, variant: str, entry: dict) -> list[str]:
    """Write the acceptance into each run of ``variant``: metrics.json, best.pt and last.pt (the run key and
    model code of the code now) and its MLflow run's tags; the files keep their times."""
    import os

    from locvit import models
    from locvit.config.run import run_config, variant_fraction, variant_seeds
    from locvit.io import write_json
    from locvit.layout import StudyLayout
    from locvit.train.state import run_key

    models.import_modules(params["model_modules"])  # model_code reads the model's module: registered first
    layout, lines = StudyLayout.of(params), []
    for seed in variant_seeds(params, variant):
        files, cfg = layout.run_files(variant, seed), run_config(params, variant, seed)
        manifest = layout.data_files(variant_fraction(params, variant), seed=seed if layout.per_seed else None)
        key = run_key(cfg, json.loads(manifest["manifest"].read_text())["data_hash"])
        metrics = json.loads(files.metrics.read_text())
        times = {path: path.stat() for path in (files.metrics, files.best, files.last) if path.is_file()}
        write_json(
            files.metrics, {**metrics, "run_key": key, "code_accepted": [*metrics.get("code_accepted", []), entry]}
        )
        for path in (files.best, files.last):
            if path in times:
                _resave(path, entry, key if path == files.last else None)
        for path, stat in times.items():  # Snakemake decides by file times: nothing here is newer than it was
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        lines.append(f"  {variant} seed {seed}: acceptance recorded in {files.metrics.parent}")
        run_id = metrics.get("mlflow_run_id")
        try:
            from locvit.tracking.backend import connect, set_tags

            connect(params["study"], layout.tracking_db)
            set_tags(run_id, {"locvit.code_accepted": json.dumps(entry, sort_keys=True)})
        except Exception as err:  # noqa: BLE001 - the files hold the record; the tracking store is a view of it
            lines.append(f"  {variant} seed {seed}: MLflow run {run_id} not tagged ({type(err).__name__}: {err})")
    return lines


def _resave(path: Path, entry: dict, key: str | None) -> None:
    """A checkpoint written again with ``entry`` among its acceptances (and ``key`` as its run key, where
    given), recording the model code of the code now (``save_checkpoint``)."""
    from locvit.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(path, allow_code_change=True)
    state["code_accepted"] = [*state.get("code_accepted", []), entry]
    save_checkpoint(path, {**state, **({"run_key": key} if key else {})})
