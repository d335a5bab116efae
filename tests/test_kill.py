"""Kill anywhere: SIGKILL a study's jobs at random moments, re-run the same Snakemake target each time.

One study (deit_a, seed 0, 2 epochs with EMA, CPU, fixed seed) is run to its evaluation twice,
in two copies of the workflow: once without interruption, once killed again and again
with ``kill -9``, re-running the same target after every kill. The kills:

* one from outside, at a random moment of the training process's life;
* then one at each of these, the moment drawn at random within it (``LOCVIT_KILL_AT``,
  tests/faultinject): in the middle of an epoch (after a random optimiser step),
  during a validation pass (a random batch), while a checkpoint or the metrics are being
  written (a random one of last.pt, best.pt's next write, metrics.json: written in full
  under a temporary name, not yet renamed), during the test evaluation (a random batch)
  and while its result is being written.

Afterwards the killed study must have the same weights, history and test score as the
uninterrupted one, one MLflow run with each epoch logged once, no temporary file left,
and nothing more to do. The draws come from ``LOCVIT_KILL_SEED`` (else a fresh seed,
printed and in every assertion message, so any failure can be replayed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from helpers import BIN, copy_workflow, env_with_venv, seed_runs

from locvit.checkpoint import load_checkpoint

pytestmark = pytest.mark.e2e
EPOCHS = 2
RUN = "results/kill/runs/deit_a/seed0"
TARGET = "results/kill/eval/deit_a/seed0.json"
# The outside kill comes within this many seconds of the training process starting: it lives about
# 14 s alone on a 2-core machine (imports, loaders, 2 epochs), longer beside the uninterrupted run.
LIFE_S = 8.0
SEED = int(os.environ.get("LOCVIT_KILL_SEED", random.SystemRandom().randrange(10**6)))


def study_params(tiny: dict) -> dict:
    params = {**tiny, "study": "kill", "seeds": [0], "variants": {"deit_a": tiny["variants"]["deit_a"]}}
    params.pop("mask_search")
    params["train"] = {**tiny["train"], "epochs": EPOCHS, "ema": True, "ema_decay": 0.9}
    return params


@pytest.fixture(scope="module")
def works(tmp_path_factory, raw_tiny_module) -> dict[str, Path]:
    works = {}
    for name in ("whole", "cut"):
        work = copy_workflow(tmp_path_factory.mktemp(name))
        (work / "kill.yaml").write_text(yaml.safe_dump(study_params(raw_tiny_module)))
        works[name] = work
    return works


@pytest.fixture(scope="module")
def raw_tiny_module(repo) -> dict:
    return yaml.safe_load((repo / "presets" / "tiny.yaml").read_text())


def snakemake(work: Path, kill_at: str | None = None) -> subprocess.Popen:
    env = env_with_venv()
    if kill_at:
        env["LOCVIT_KILL_AT"] = kill_at
    return subprocess.Popen(
        [str(BIN / "snakemake"), "--cores", "1", TARGET, "--config", "params=kill.yaml"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def training_process(parent: psutil.Process) -> psutil.Process | None:
    for child in parent.children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "train" in cmd and "--run-config" in cmd:
            return child
    return None


def kill_from_outside(work: Path, rng: random.Random, life_s: float) -> str:
    """Start the target; SIGKILL the training process a random time after it starts."""
    proc = snakemake(work)
    parent, victim = psutil.Process(proc.pid), None
    while victim is None and proc.poll() is None:
        victim = training_process(parent)
        time.sleep(0.05)
    delay = rng.uniform(0.0, life_s)
    time.sleep(delay)
    with contextlib.suppress(psutil.Error, AttributeError):
        victim.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    landed = proc.returncode != 0
    assert landed, f"seed {SEED}: training ended within {delay:.1f} s, before the outside kill (lower LIFE_S)"
    assert "Error in rule train" in out, f"seed {SEED}: {out[-3000:]}"
    return f"from outside, {delay:.1f} s after the training process started"


def kill_at_point(work: Path, point: str) -> str:
    proc = snakemake(work, point)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, f"seed {SEED}: {point} never fired:\n{out[-3000:]}"
    assert "Error in rule" in out, out[-3000:]
    return point


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp") if ".snakemake" not in p.parts]


def improving_epochs(work: Path) -> list[int]:
    """The epochs that write best.pt (their val_top1 beats every earlier epoch's)."""
    best, epochs = -1.0, []
    for row in json.loads((work / RUN / "metrics.json").read_text())["history"]:
        if row["val_top1"] > best:
            best, epochs = row["val_top1"], [*epochs, row["epoch"]]
    return epochs


@pytest.fixture(scope="module")
def killed(works, prepared) -> dict:
    rng = random.Random(SEED)
    split = prepared["manifest_data"]["splits"]
    steps = sum(split["train"]["class_counts"]) // 64  # tiny's batch; the last partial batch is dropped
    started = time.monotonic()
    whole = snakemake(works["whole"])  # alongside the first kill
    kills = [kill_from_outside(works["cut"], rng, life_s=LIFE_S)]
    out, _ = whole.communicate(timeout=600)
    assert whole.returncode == 0, out[-3000:]
    # Each point is drawn from where the killed run will pass next, so that every kill lands. The runs
    # are deterministic: the uninterrupted one says which epochs improve and so write best.pt.
    last = works["cut"] / RUN / "last.pt"
    resume = load_checkpoint(last)["epoch"] + 1 if last.exists() else 0
    if resume < EPOCHS:
        step = rng.randrange(resume * steps, EPOCHS * steps)
        epoch = step // steps  # the mid-epoch, validation and checkpoint kills all hit this epoch
        file = rng.choice(
            ["last.pt", "metrics.json"] + (["best.pt"] if epoch in improving_epochs(works["whole"]) else [])
        )
        points = [
            f"train_step_{step}@{RUN}",
            f"eval_batch_{rng.randrange(-(-split['val']['size'] // 256))}@{RUN}",
            f"before_rename_{file}@{RUN}",  # metrics.json: once training has ended
        ]
    else:  # the outside kill came after the last epoch's last.pt (while the run was being finished): no step is left
        points = [f"before_rename_metrics.json@{RUN}"]  # Snakemake removed the failed job's outputs: written again
    points += [
        f"eval_batch_{rng.randrange(-(-split['test']['size'] // 256))}@eval/",  # locvit evaluate
        "before_rename_seed0.json@eval/",
    ]
    kills += [kill_at_point(works["cut"], point) for point in points]
    leftovers = temporaries(works["cut"] / "results")
    final = snakemake(works["cut"])
    out, _ = final.communicate(timeout=600)
    assert final.returncode == 0, f"seed {SEED}: {out[-3000:]}"
    print(f"\nkill seed {SEED}: {len(kills)} kills in {time.monotonic() - started:.0f} s: " + "; ".join(kills))
    return {"kills": kills, "leftovers": leftovers}


def test_a_study_killed_anywhere_ends_as_if_never_killed(works, killed):
    whole, cut = works["whole"] / RUN, works["cut"] / RUN
    for name in ("best.pt", "last.pt"):
        a, b = load_checkpoint(whole / name), load_checkpoint(cut / name)
        for part in ("model", "ema", "best_model"):
            if part in a:
                assert a[part].keys() == b[part].keys()
                assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), f"seed {SEED}: {name} {part}"
        assert a["epoch"] == b["epoch"]

    def history(work):
        rows = json.loads((work / RUN / "metrics.json").read_text())["history"]
        return [{k: v for k, v in row.items() if k != "train_images_per_s"} for row in rows]

    assert len(history(works["whole"])) == EPOCHS and history(works["cut"]) == history(works["whole"]), SEED
    scores = [json.loads((w / TARGET).read_text()) for w in (works["whole"], works["cut"])]
    for key in ("test_top1", "test_loss", "n", "checkpoint_epoch", "val_top1", "data_hash"):
        assert scores[0][key] == scores[1][key], f"seed {SEED}: {key}"


def test_the_killed_study_is_one_mlflow_run_with_each_epoch_once(works, killed):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{works['cut'] / 'results/kill/mlflow.db'}")
    (run,) = seed_runs(client, "kill")
    assert run.info.status == "FINISHED", SEED
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_top1")]
    assert sorted(steps) == list(range(EPOCHS)), f"seed {SEED}: {steps}"
    score = json.loads((works["cut"] / TARGET).read_text())
    assert run.data.metrics["test_top1"] == score["test_top1"]


def test_no_temporary_file_is_left_and_nothing_is_left_to_do(works, killed):
    # Kills before a rename leave the temporary file; the step's next run removes it.
    assert any("before_rename" in k for k in killed["kills"])
    assert temporaries(works["cut"] / "results") == [], SEED
    dry = subprocess.run(
        [str(BIN / "snakemake"), "-n", TARGET, "--config", "params=kill.yaml"],
        cwd=works["cut"],
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
