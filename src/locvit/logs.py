"""locvit's one channel for messages: the ``locvit`` logger of Python's logging.

Every module logs to ``logging.getLogger(__name__)``; :func:`configure` (called by the CLI,
and by the tests) sends what ``locvit.*`` logs to the console: information to stdout as
plain lines, warnings and errors to stderr after ``WARNING:`` or ``ERROR:``, so a job's log
reads as before. A command's own output (a table, a path it wrote) stays ``print``; so do
progress bars (tqdm, on stderr). The streams are looked up at each message, so a test that
swaps ``sys.stdout`` sees what is logged after.
"""

from __future__ import annotations

import logging
import sys

ROOT = "locvit"


class _Console(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.levelno >= logging.WARNING:
                stream, text = sys.stderr, f"{record.levelname}: {text}"
            else:
                stream = sys.stdout
            stream.write(text + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (logging's own rule: a message never breaks the program)
            self.handleError(record)


def configure(level: int = logging.INFO) -> None:
    """Send ``locvit.*`` messages at ``level`` and above to the console (once per process)."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    if not any(isinstance(h, _Console) for h in logger.handlers):
        logger.addHandler(_Console())
