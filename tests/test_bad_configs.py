"""The bad-config corpus: every file in tests/bad_configs/ is rejected before any job runs.

Each file says what it breaks on its first line and, on its second (``# expect: ...``),
the text the error must contain: the key it names and what is wrong or allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import BAD_CONFIGS

from locvit.cli import main


def _expected(path: Path) -> str:
    line = path.read_text().splitlines()[1]
    assert line.startswith("# expect: "), f"{path.name}: second line must be '# expect: <text>'"
    return line.removeprefix("# expect: ")


def test_the_corpus_has_at_least_30_files():
    assert len(BAD_CONFIGS) >= 30, len(BAD_CONFIGS)


@pytest.mark.parametrize("path", BAD_CONFIGS, ids=lambda p: p.stem)
def test_each_bad_config_is_refused_with_the_key_named(path, capsys):
    assert main(["validate", "--params", str(path)]) == 2  # 2: a config error, before anything runs
    err = capsys.readouterr().err
    assert "nothing was run" in err and _expected(path) in err, err
