"""Two kinds of error: a user's mistake is one line naming it; anything else keeps its traceback.

``locvit`` prints a :class:`locvit.errors.LocvitError` as ``locvit <command>: error: ...`` and
exits 1 (a config that breaks the schema: its list of problems and exit 2, as before). Any other
exception, a ValueError from numpy say, is a bug or a failure below locvit: a line saying where
to report it, then Python's traceback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from helpers import REPO, env_with_venv

import locvit
from locvit import cli
from locvit.config import ConfigError
from locvit.errors import InputError, LocvitError, MissingFileError

TINY = REPO / "presets" / "tiny.yaml"

# `locvit` with a library's own ValueError where a command's work would be (numpy's, as raised below locvit).
LIBRARY_FAILURE = """
import sys

import numpy as np

import locvit.versioning
from locvit.cli import main


def stage_targets(*args):
    return np.zeros(-1)


locvit.versioning.stage_targets = stage_targets
sys.exit(main(sys.argv[1:]))
"""


def run(*argv: str, script: str | None = None) -> subprocess.CompletedProcess:
    """``python -m locvit <argv>`` (or ``script`` with ``argv``) in a fresh process, as a shell runs it."""
    cmd = [sys.executable, "-c", script, *argv] if script else [sys.executable, "-m", "locvit", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env_with_venv(), timeout=120)


def test_user_facing_errors_are_locvit_errors_and_keep_their_builtin_bases():
    from locvit.device import ToolchainError
    from locvit.tracking.backend import TrackingAuthError, TrackingUnreachable
    from locvit.train.engine import NonFiniteLoss
    from locvit.train.launch import LaunchError

    for cls, base in [
        (ConfigError, ValueError),
        (ToolchainError, ValueError),
        (NonFiniteLoss, FloatingPointError),
        (LaunchError, RuntimeError),
        (TrackingAuthError, PermissionError),
        (TrackingUnreachable, ConnectionError),
        (InputError, ValueError),
        (MissingFileError, FileNotFoundError),
    ]:
        assert issubclass(cls, LocvitError) and issubclass(cls, base), cls


@pytest.mark.parametrize("command", [None, *sorted(cli.build_parser()._subparsers._group_actions[0].choices)])
def test_every_help_renders(command, capsys):
    """`locvit --help` and each command's (a bare % in a help string once made `locvit --help` a traceback)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"] if command else ["--help"])
    assert exit_.value.code == 0 and "usage: locvit" in capsys.readouterr().out


@pytest.mark.e2e
def test_a_users_mistake_is_one_line_without_a_traceback_and_exit_1():
    proc = run("targets", "deploy", "--params", str(TINY))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "locvit targets: error: stage: 'deploy' is not allowed; allowed values: "
        "prepare, train, evaluate, analyse, report"
    ]


def test_a_missing_file_and_an_option_that_is_not_json_are_named(tmp_path, capsys):
    missing = tmp_path / "results.csv"
    assert cli.main(["results", "--csv", str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"locvit results: error: {missing} does not exist; give a results.csv written by the report step\n"
    )
    (tmp_path / "search.json").write_text("{variant: m")
    assert (
        cli.main(
            [
                "search-spec",
                "--round",
                "0",
                "--search-config",
                str(tmp_path / "search.json"),
                "--out",
                str(tmp_path / "spec.json"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        err.startswith(
            f"locvit search-spec: error: --search-config file {tmp_path / 'search.json'} is not valid JSON ("
        )
        and err.count("\n") == 1
    )
    assert not (tmp_path / "spec.json").exists()


@pytest.mark.e2e
def test_a_librarys_value_error_keeps_its_traceback_after_the_line_saying_where_to_report_it():
    proc = run("targets", "train", "deit_a", "--params", str(TINY), script=LIBRARY_FAILURE)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert lines[0] == cli.bug_report_line("targets", ValueError()), lines[0]
    assert "a bug in locvit or a failure below it" in lines[0] and f"locvit {locvit.__version__}" in lines[0]
    assert cli.ISSUES in lines[0]
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: negative dimensions are not allowed"


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a library's complaint"),
        FileNotFoundError(2, "No such file", "x.bin"),
        FloatingPointError("overflow"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_builtin_errors_that_are_not_locvits_propagate(error, monkeypatch, capsys):
    """ValueError, FileNotFoundError and FloatingPointError were once all printed as one line; only locvit's are now."""
    import locvit.versioning

    def fail(*args):
        raise error

    monkeypatch.setattr(locvit.versioning, "stage_targets", fail)
    with pytest.raises(type(error)) as caught:
        cli.main(["targets", "report", "--params", str(TINY)])
    assert caught.value is error
    assert capsys.readouterr().err.splitlines() == [cli.bug_report_line("targets", error)]


def test_a_config_error_still_lists_its_problems_and_exits_2(tmp_path, raw_tiny, capsys):
    raw_tiny["epochz"] = 3
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw_tiny))
    assert cli.main(["validate", "--params", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"locvit: {path} is invalid (1 problem(s)); nothing was run:\n  - unknown key 'epochz'")
