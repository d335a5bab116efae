"""The study's MLflow run tree (locvit.tracking.tree) on a real SQLite backend: found by tags, made once
by jobs racing for it, settled by the report (duplicates merged, flat runs of an older locvit adopted).

Training jobs, a tracking server, the offline spool and the report's metrics are checked on real
runs in test_tracking.py and test_pipeline.py; these are the tree's own rules, fast.
"""

from __future__ import annotations

import multiprocessing

import pytest

from locvit import tracking
from locvit.tracking.tree import (
    PARENT,
    ROLE,
    adopt,
    find,
    find_or_create,
    lock_beside,
    study_tags,
    variant_parent,
    variant_tags,
)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """An MLflow client on a fresh study database, and the experiment's id."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    exp = tracking.setup("tiny", db)
    yield mlflow.MlflowClient(), exp, db
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # setup sets it


def _parent_in_a_process(db, barrier, out):
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    import mlflow

    exp = tracking.setup("tiny", db)
    barrier.wait()  # every process searches at once: none finds a run, all create one
    out.put(variant_parent(mlflow.MlflowClient(), exp, "tiny", "deit", lock_beside(db)))


@pytest.mark.e2e  # four processes race (multiprocessing)
def test_jobs_racing_for_the_parents_all_get_the_same_ones(backend):
    client, exp, db = backend
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_parent_in_a_process, args=(db, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    parents = {out.get(timeout=10) for _ in procs}
    assert len(parents) == 1  # every job puts its seed run under one variant run
    studies, variants = find(client, exp, study_tags("tiny")), find(client, exp, variant_tags("tiny", "deit"))
    assert len(studies) == 1 and len(variants) == 1  # the losers deleted theirs
    assert variants[0].info.run_id in parents
    assert variants[0].data.tags[PARENT] == studies[0].info.run_id and studies[0].info.run_name == "tiny"


def test_found_by_tags_not_by_name(backend):
    client, exp, _ = backend
    first = variant_parent(client, exp, "tiny", "deit")
    client.set_tag(first, "mlflow.runName", "renamed in the UI")
    assert variant_parent(client, exp, "tiny", "deit") == first
    impostor = client.create_run(exp, run_name="deit").info.run_id  # a run of that name, not a variant run
    assert variant_parent(client, exp, "tiny", "deit") == first != impostor


def test_the_report_merges_duplicates_and_adopts_flat_runs(backend):
    client, exp, _ = backend
    # Two variant runs (a race across nodes whose clocks disagree), each with a seed run under it,
    # and a flat seed run as an older locvit logged it.
    study = find_or_create(client, exp, study_tags("tiny"), "tiny")
    twins = [
        client.create_run(exp, run_name="deit", tags={**variant_tags("tiny", "deit"), PARENT: study}).info.run_id
        for _ in range(2)
    ]
    seeds = [
        client.create_run(exp, run_name=f"deit-seed{i}", tags={PARENT: twins[i], ROLE: "seed"}).info.run_id
        for i in range(2)
    ]
    flat = client.create_run(exp, run_name="deit-seed2", tags={"variant": "deit"}).info.run_id
    ids = adopt(client, exp, "tiny", {"deit": [*seeds, flat]})
    assert ids[""] == study and ids["deit"] == twins[0]  # the oldest one stays
    assert [r.info.run_id for r in find(client, exp, variant_tags("tiny", "deit"))] == [twins[0]]
    assert client.get_run(twins[1]).info.lifecycle_stage == "deleted"
    for run_id in [*seeds, flat]:
        tags = client.get_run(run_id).data.tags
        assert tags[PARENT] == twins[0] and tags[ROLE] == "seed"
    # Settled: a second pass changes nothing and makes nothing.
    before = {r.info.run_id for r in client.search_runs([exp])}
    assert adopt(client, exp, "tiny", {"deit": [*seeds, flat]}) == ids
    assert {r.info.run_id for r in client.search_runs([exp])} == before
