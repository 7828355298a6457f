"""Helpers shared by the command-line tests."""
from __future__ import annotations

import signal

from distfit.cli import main as cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``distfit ARGV`` in-process; return (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    """stderr is exactly one ``distfit: error: ...`` line containing every fragment."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("distfit: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)


def interruptible() -> None:
    """``preexec_fn`` of a command a test interrupts with Ctrl-C: SIGINT back to its default
    action. A process started with SIGINT ignored keeps it ignored, and its children inherit
    that (a shell ignores SIGINT for a command it runs in the background without job control;
    Python then installs no KeyboardInterrupt handler); a terminal's foreground command has the
    default, which is what these tests are about."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

