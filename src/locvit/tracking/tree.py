"""The study's MLflow run tree: one study run, a run per variant under it, the seed runs under those.

Runs nest by ``mlflow.parentRunId`` and are found by their tags (``ROLE``, ``study``, ``variant``), never by
name. MLflow has no "create unless it exists", so ``variant_parent`` finds or creates under a file lock beside
the study's database; without locks (``LOCK_TIMEOUT_S``) ``find_or_create`` searches, creates, searches again
and keeps the oldest, and two jobs may still disagree. The report (``adopt``) settles the tree either way: one
run per role, every seed under its variant (an older locvit's runs too), duplicates merged and deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from locvit.tracking.backend import retry

log = logging.getLogger(__name__)

#: The tag that says what a run is: ``study``, ``variant`` or ``seed``.
ROLE = "locvit.role"
#: MLflow's own tag that nests a run under another (the runs table's tree).
PARENT = "mlflow.parentRunId"


def _filter(tags: dict[str, str]) -> str:
    # Study and variant names are safe names (the schema's pattern), so quoting them needs no escapes.
    return " AND ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())


def find(client, experiment_id: str, tags: dict[str, str]) -> list:
    """The live runs of the experiment with all of ``tags``, the canonical one (oldest, then by id) first."""
    runs = retry(client.search_runs, [experiment_id], filter_string=_filter(tags), max_results=1000)
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def find_or_create(client, experiment_id: str, tags: dict[str, str], run_name: str, parent: str | None = None) -> str:
    """The id of the run with ``tags`` (created under ``parent`` when there is none); see the module."""
    found = find(client, experiment_id, tags)
    if found:
        return found[0].info.run_id
    extra = {PARENT: parent} if parent else {}
    mine = retry(client.create_run, experiment_id, run_name=run_name, tags={**tags, **extra}).info.run_id
    winner = find(client, experiment_id, tags)[0].info.run_id
    if winner != mine:  # another job created it too, first: keep one
        retry(client.delete_run, mine)
    return winner


def study_tags(study: str) -> dict[str, str]:
    return {ROLE: "study", "study": study}


def variant_tags(study: str, variant: str) -> dict[str, str]:
    return {ROLE: "variant", "study": study, "variant": variant}


#: Seconds a job waits for the tree's lock before it goes on without it (with a warning).
LOCK_TIMEOUT_S = 120.0


def variant_parent(client, experiment_id: str, study: str, variant: str, lock: Path | None = None) -> str:
    """The variant's run (and the study's above it), found or created: the parent of a seed run.

    ``lock``: the file lock that makes finding and creating one step for every job (see the module).
    """
    from filelock import FileLock, Timeout

    held = None
    if lock is not None:
        try:
            held = FileLock(str(lock), timeout=LOCK_TIMEOUT_S)
            held.acquire()
        except (Timeout, OSError) as err:
            log.warning(
                f"the MLflow run tree's lock {lock} could not be had ({type(err).__name__}); finding or "
                "creating the study's and variant's runs without it (the report settles any duplicate)"
            )
            held = None
    try:
        study_id = find_or_create(client, experiment_id, study_tags(study), study)
        return find_or_create(client, experiment_id, variant_tags(study, variant), variant, parent=study_id)
    finally:
        if held is not None:
            held.release()


def lock_beside(tracking_db: str | Path) -> Path:
    """The tree's lock file, beside the study's database file (whether or not a server is used)."""
    return Path(f"{tracking_db}.tree.lock")


def seed_tags(parent: str) -> dict[str, str]:
    """The tags that put a seed run under its variant run."""
    return {ROLE: "seed", PARENT: parent}


def adopt(client, experiment_id: str, study: str, variants: dict[str, Iterable[str]]) -> dict[str, str]:
    """Settle the tree: one study run, one run per variant under it, each seed run under its variant.

    ``variants``: variant -> the run ids of its seed runs (from the runs' metrics.json). Duplicate
    study or variant runs (a race the module describes) are merged into the canonical one: their
    children move over, they are deleted. Seed runs without a parent (logged by an older locvit) or
    under the wrong one are moved. Returns variant -> its run id, and ``""`` -> the study run's id.
    """
    study_id = _merge(client, experiment_id, study_tags(study), study, None)
    ids = {"": study_id}
    for variant, seed_runs in variants.items():
        variant_id = _merge(client, experiment_id, variant_tags(study, variant), variant, study_id)
        ids[variant] = variant_id
        for run_id in seed_runs:
            run = retry(client.get_run, run_id)
            wanted = seed_tags(variant_id)
            if any(run.data.tags.get(k) != v for k, v in wanted.items()):
                for key, value in wanted.items():
                    retry(client.set_tag, run_id, key, value)
    return ids


def _merge(client, experiment_id: str, tags: dict[str, str], run_name: str, parent: str | None) -> str:
    """The canonical run with ``tags`` (created if none), under ``parent``; duplicates merged into it."""
    keep = find_or_create(client, experiment_id, tags, run_name, parent)
    for duplicate in find(client, experiment_id, tags):
        dup = duplicate.info.run_id
        if dup == keep:
            continue
        for child in retry(
            client.search_runs, [experiment_id], filter_string=f"tags.`{PARENT}` = '{dup}'", max_results=1000
        ):
            retry(client.set_tag, child.info.run_id, PARENT, keep)
        retry(client.delete_run, dup)
    if parent and retry(client.get_run, keep).data.tags.get(PARENT) != parent:
        retry(client.set_tag, keep, PARENT, parent)
    return keep
