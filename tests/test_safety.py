"""Safety: config values reach the shell only quoted; checkpoints load without unpickling code.

A study whose strings are full of shell syntax is planned by Snakemake (`-n -p`); every
printed command is split the way a POSIX shell would, and the config each job receives
must be exactly the study's, hostile strings included, with no stray word of it left
for the shell to run. Every `torch.load` in the code asks for `weights_only=True`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess

import pytest
import yaml
from helpers import BIN, REPO, copy_workflow, env_with_venv

HOSTILE = 'data dir/it\'s "quoted" $(touch PWNED) `id`; rm -rf x & | > y'


@pytest.mark.e2e
def test_hostile_strings_reach_every_job_quoted(tmp_path):
    work = copy_workflow(tmp_path)
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    params["data"]["root"] = HOSTILE  # the digits source never reads it; the jobs still receive it
    (work / "hostile.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [str(BIN / "snakemake"), "-n", "-p", "all", "--config", "params=hostile.yaml"],
        cwd=work,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    commands = [line for line in proc.stdout.splitlines() if " -m locvit " in line]
    assert len(commands) >= 5  # prepare, trains, evaluates, analyses, report (and the search's jobs)
    seen = 0
    for command in commands:
        words = shlex.split(command)  # what the shell hands the program, redirections aside
        assert not any("PWNED" in w and not w.startswith(("{", "[")) for w in words), command
        for flag in ("--data-config", "--run-config"):
            if flag in words:  # the job's config files (locvit.config.jobs), one per run for training
                files = words[words.index(flag) + 1 :]
                for file in files[: next((i for i, w in enumerate(files) if w.startswith("--")), len(files))]:
                    cfg = json.loads((work / file).read_text())
                    assert (cfg.get("data") or cfg)["root"] == HOSTILE
                seen += 1
    assert seen >= 5
    assert not (work / "PWNED").exists()


def test_every_torch_load_is_weights_only():
    """pickle can run code; a checkpoint is only ever read as tensors and plain containers."""
    calls = []
    for path in sorted((REPO / "src").rglob("*.py")) + sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and re.fullmatch(r"(torch\.)?load", ast.unparse(node.func))
                and "torch" in ast.unparse(node.func)
            ):
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((path.relative_to(REPO), node.lineno, keywords.get("weights_only")))
    assert calls, "no torch.load found: the test lost its target"
    assert all(w == "True" for *_, w in calls), [c for c in calls if c[2] != "True"]
