"""The errors locvit raises for its users (bad input named with what to do, printed as one line), and the
console its log messages go to.

``locvit``'s command line prints a :class:`LocvitError` as one line (the file, key or command it
names, and what to do) and exits non-zero; any other exception is a bug or a failure of something
below locvit (numpy, torch, timm, the file system) and keeps its traceback, with a line saying where
to report it. The subclasses also derive from the built-in type a caller would catch (ValueError,
FileNotFoundError), so code that catches those keeps working.

Every module logs to ``logging.getLogger(__name__)``; :func:`configure_logging` (called by the CLI, and by the
tests) sends what ``locvit.*`` logs to the console: information to stdout as plain lines, warnings and errors to
stderr after ``WARNING:`` or ``ERROR:``, so a job's log reads as before. A command's own output (a table, a path
it wrote) stays ``print``; so do progress bars (tqdm, on stderr). The streams are looked up at each message, so
a test that swaps ``sys.stdout`` sees what is logged after.
"""

from __future__ import annotations

import logging
import sys


class LocvitError(Exception):
    """A user-facing error: what is wrong with the input, named, and what to do."""


class InputError(LocvitError, ValueError):
    """A value a user gave (a config key, a model option, a command-line argument) that cannot be used."""


class MissingFileError(LocvitError, FileNotFoundError):
    """A file or folder a step needs is not there (named, with the step that makes it)."""


#: ``locvit train``'s exit status after a stop on request (sysexits' EX_TEMPFAIL: try again).
EXIT_STOPPED = 75


class Stopped(Exception):
    """A run stopped on request at a step boundary; last.pt holds that step (:mod:`locvit.train.state`).

    Not a mistake: the command line exits with :data:`EXIT_STOPPED`, and the job resumes when run again.
    Here, beside the errors, so that the command line catches it without importing the trainer."""


def allowed(name: str, value, choices) -> None:
    """Raise :class:`InputError` naming ``name``, ``value`` and the allowed values unless ``value`` is one."""
    choices = tuple(choices)
    if value not in choices:
        raise InputError(f"{name}: {value!r} is not allowed; allowed values: {', '.join(map(str, choices))}")


# The console -------------------------------------------------------------------------------------------------

LOGGER = "locvit"


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


def configure_logging(level: int = logging.INFO) -> None:
    """Send ``locvit.*`` messages at ``level`` and above to the console (once per process)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    if not any(isinstance(h, _Console) for h in logger.handlers):
        logger.addHandler(_Console())
