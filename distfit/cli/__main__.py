"""``python -m distfit.cli`` and the ``distfit`` console script: the distfit command.

Ctrl-C at any moment ends the command with one line and exit code 130. A terminal sends SIGINT
to every process of its foreground process group: the driver and, while a local Dask cluster
starts or runs, its worker processes. Three things make that one line (Python alone printed up
to 170 lines and three tracebacks when Ctrl-C came during start-up):

- :func:`entry` imports the command line (``distfit.cli.main``: the parser, tens of
  milliseconds, no numpy) inside its ``try``, the one late import of the command, on purpose: a
  Ctrl-C while it loads is caught like any other (``import distfit`` itself is light: its public
  names load on first use). The command's handler, and with it numpy, scipy, zarr and Dask for
  up to seconds, is imported inside ``distfit.cli.main.main``, which catches a Ctrl-C there.
  Once the command has returned, SIGINT is ignored, so a second Ctrl-C while the process
  ends adds nothing; after an interrupt the process leaves at once (``os._exit``): the
  interrupt has already unwound through every store and cluster the command opened, and the
  interpreter's exit handlers would only report on a cluster whose start it cut short (and
  multiprocessing's resource tracker is told not to: :data:`QUIET_TRACKER`).
- A process that ``multiprocessing`` spawns for the command (a local cluster's worker) runs
  the command's main module as it starts (this file, or the console script that imports it),
  before it unpickles its work (which imports Dask for seconds), and so ignores SIGINT from
  there on: the driver stops it (``distfit.runtime.cluster.dask_setup`` does the same once a
  worker has started; this covers its start).
- ``distfit.cli.main.main`` turns a ``KeyboardInterrupt`` into the line that says what was kept.

Only the first few tens of milliseconds of a process, before Python runs any of distfit's code,
are left to Python: Ctrl-C then ends the process without a word (killed by SIGINT).
"""
import importlib
import multiprocessing
import os
import signal
import sys

from distfit.cli.errors import print_error

#: Exit code of an interrupted command (128 + SIGINT, as shells report a process stopped by Ctrl-C).
INTERRUPTED = 130

if multiprocessing.current_process().name != "MainProcess":  # a worker spawned for the command (docstring)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: Passed to every Python process the command spawns (``-W``, as multiprocessing passes the
#: interpreter's options): the resource tracker must not warn, when the process left at once
#: after an interrupt, about the semaphores of a cluster whose start it cut short (it frees them).
QUIET_TRACKER = "ignore:resource_tracker:UserWarning"


def entry() -> int:
    """Run the command line of this process (``sys.argv``); returns the exit code."""
    sys.warnoptions.append(QUIET_TRACKER)
    try:
        code = importlib.import_module("distfit.cli.main").main()
    except KeyboardInterrupt:  # while the command loaded: nothing was done yet
        print_error("interrupted while starting; nothing was written")
        code = INTERRUPTED
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    # Run as ``python -m distfit.cli``: multiprocessing starts a spawned child by importing the
    # parent's main module, by its module name when it has one, except a ``*.__main__`` module,
    # which it skips; without the name it runs the main module's file, this one (docstring).
    __spec__ = None
    sys.exit(entry())
