"""A job in a child process held part-way by construction, for tests that must act while it runs
(kill it, or race it for its store's lock) without sleeping and hoping it is still running.

The child runs ``HOLD`` then the test's code, which passes ``hold_after(n)`` as the job's
``after_chunk`` hook: after the ``n``-th chunk is written the child prints ``held`` on stdout
and waits for a line on stdin. :func:`wait_held` returns once that line is read (the job is then
between chunks, holding its lock, ``n`` chunks written), :func:`let_go` lets it finish; a child
that ends before holding fails the test with its stderr. Nothing is timed: the only waits are on
the pipe, and a child that died closes it.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from typing import Iterator

HOLD = (
    "import sys\n"
    "def hold_after(count):\n"
    "    calls = []\n"
    "    def after_chunk(chunk):\n"
    "        calls.append(chunk)\n"
    "        if len(calls) == count:\n"
    "            print('held', flush=True)\n"
    "            sys.stdin.readline()\n"
    "    return after_chunk\n"
)


@contextlib.contextmanager
def held_job(code: str) -> Iterator[subprocess.Popen]:
    """``python -c HOLD + code`` with stdin and stdout piped (stderr to a file, so a chatty job
    cannot fill a pipe nobody reads); killed on the way out if still running."""
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen([sys.executable, "-c", HOLD + code], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
        process.stderr_file = stderr  # type: ignore[attr-defined]
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=60)
            for pipe in (process.stdin, process.stdout):
                if not pipe.closed:
                    pipe.close()


def _stderr(process: subprocess.Popen) -> str:
    process.stderr_file.seek(0)  # type: ignore[attr-defined]
    return process.stderr_file.read()  # type: ignore[attr-defined]


def wait_held(process: subprocess.Popen) -> None:
    """Block until the child holds (it printed ``held``); AssertionError with its stderr if it
    ended (or printed something else) first."""
    line = process.stdout.readline()
    if line.strip() != "held":
        process.kill()
        process.wait(timeout=60)
        raise AssertionError(f"the job ended before its hold (exit {process.returncode}): {line!r}\n{_stderr(process)}")


def let_go(process: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    """Let a held child go on and wait for it to end: (the rest of its stdout, its stderr)."""
    stdout, _ = process.communicate(input="\n", timeout=timeout)
    return stdout, _stderr(process)
