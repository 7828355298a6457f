"""The command's errors and its one error line.

Every error reaches the user as one line ``distfit: error: <message>`` on stderr
(``print_error``); ``distfit.cli.main.main`` maps each kind of error to its exit code
(module docstring of ``distfit.cli.main``).
"""
from __future__ import annotations

import sys

#: the command's name: the prefix of every error line and of every command's summary
PROG = "distfit"


#: What an interrupted command that kept nothing says.
NOTHING_KEPT = "nothing was written (stores are moved into place only when complete); run the command again"


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2."""


class OutputError(Exception):
    """An output file could not be written: one line on stderr, exit code 1."""


def print_error(message: object) -> None:
    """Print ``distfit: error: <message>`` on stderr, the message's whitespace folded onto one
    line (a multi-line library message stays one line, so scripts can grep for it)."""
    text = " ".join(str(message).split()) or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised by a command that knows what it kept: ``hint`` says what and how to go on
    (one line, exit code 130)."""

    def __init__(self, hint: str):
        super().__init__(hint)
        self.hint = hint
