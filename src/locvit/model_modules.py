"""params' ``model_modules`` (model families outside locvit) are found on PYTHONPATH or in the working directory.

A study keeps its own family beside ``params.yaml`` (``my_family.py``), and its jobs run in
that folder, so the working directory goes first on ``sys.path`` while such a module is looked
up (:func:`locvit.model_checks.check_model`'s cache key) or imported (:func:`locvit.models.import_modules`),
and comes off again after: nothing else is resolved against it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


@contextlib.contextmanager
def working_dir_on_path() -> Iterator[str]:
    """The working directory first on ``sys.path`` for the block; yields it."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        yield cwd
    finally:
        sys.path.remove(cwd)  # the first occurrence: the one inserted here
