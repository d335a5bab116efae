"""Fault injection for the reliability tests: kill the process at a named point.

``LOCVIT_KILL_AT=<point>`` in the environment makes the process SIGKILL itself when it
reaches that point (no clean-up, no Python handlers run: as an OOM killer or a
preempting scheduler would). Unset, a point costs one dictionary lookup. Points:
``after_epoch_<k>`` (training, once epoch k's last.pt is written).
"""

from __future__ import annotations

import os
import signal


def kill_point(name: str) -> None:
    if os.environ.get("LOCVIT_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
