"""Helpers shared by the command-line tests."""
from __future__ import annotations

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
