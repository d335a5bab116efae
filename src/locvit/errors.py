"""The errors locvit raises for its users (printed as one line), and the console its log messages go to.

The command line prints a ``LocvitError`` as one line (the file, key or command, and what to do) and exits
non-zero; any other exception is a bug or a failure below locvit and keeps its traceback, with where to report
it. The subclasses also derive from the built-in type a caller would catch (ValueError, FileNotFoundError).
``configure_logging`` sends ``locvit.*``'s logs to the console: information to stdout, warnings and errors to
stderr after ``WARNING:``/``ERROR:``; the streams are looked up per message (a test may swap them). A command's
own output and progress bars stay ``print``/tqdm.
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
    """A run stopped on request at a step boundary; last.pt holds that step (``locvit.train.state``).

    Not a mistake: the command line exits with ``EXIT_STOPPED``, and the job resumes when run again.
    Here, beside the errors, so that the command line catches it without importing the trainer."""


def allowed(name: str, value, choices) -> None:
    """Raise ``InputError`` naming ``name``, ``value`` and the allowed values unless ``value`` is one."""
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
