"""Resumability within a chunk: the local polytope's ADMM state saved now and then (issue 26).

A chunk of a wide estimate is one long fit (Adult: one unit, ~500-1,000 ADMM iterations,
30-60 s). :class:`ChunkCheckpoints` is the :class:`distfit.estimate.local_polytope.Checkpoints`
of chunk ``chunk`` of the estimate store being written: the solver offers it its state
(:class:`~distfit.estimate.local_polytope.AdmmState`: ``u``, ``z``, ``lam``, each unit's last
objective and active flag, the iterations done) after every batch of
:data:`~distfit.estimate.local_polytope.CHECK_EVERY` iterations, and it writes one through
:func:`distfit.stores.checkpoint.write_checkpoint` (atomic, under a checksum) when
:data:`CHECKPOINT_SECONDS` have passed since the fit started or since the last one was
written. ``distfit estimate --resume`` then continues a chunk killed mid-fit from its last
checkpoint, to the bits an uninterrupted run gives (the solver's iterations read nothing else).

Cadence, by the clock rather than by iterations: a batch costs from milliseconds (a small
plan) to ~0.1 s (Adult, under load), so a fixed count would write far too often on one and
rarely on the other. Every :data:`CHECKPOINT_SECONDS` = 5 s, a kill loses at most ~5 s of a
fit, and the cost stays near 1 % at most: a checkpoint of Adult's one unit is ~0.9 MB (22,490 +
2 x 42,301 float64), written, hashed and fsynced in ~40 CPU-ms (~0.1 s wall), plus the
fingerprint of the fit's inputs once (~30 CPU-ms; benchmarks/README.md, issue 26). Adult's
ADMM runs ~6-10 s, so it gets one or two; 10 s would often give it none. The state after the
last iteration is offered too (by the same rule): a kill during the post-processing (the
I-projection onto agreement, ~6 s on Adult) then resumes with the fit done. A fit shorter
than the cadence writes none.

A checkpoint that fails verification (:class:`distfit.stores.checkpoint.CheckpointError`:
unreadable, or its contents do not hash to its checksum) or that was saved from other inputs
(another ``key``: the :func:`distfit.stores.checksum.fingerprint` of the fit's
:func:`distfit.estimate.local_polytope.state_inputs`, stored with it) is refused: one line on the
log says which and why, it is deleted, and the chunk's fit starts from the beginning. Not an
error that stops the estimate: the fit is deterministic, so starting over gives the same bits,
only later; a bad checkpoint is never used, and never dropped without a word.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

import numpy as np

from distfit.estimate.local_polytope import AdmmState, StateInputs
from distfit.stores.checkpoint import CheckpointError, read_checkpoint, remove_checkpoints, write_checkpoint
from distfit.stores.checksum import fingerprint

__all__ = ["CHECKPOINT_SECONDS", "ChunkCheckpoints"]

#: Seconds of fitting between two checkpoints (module docstring); read when a chunk's fit starts.
CHECKPOINT_SECONDS = 5.0
_STATE = ("u", "z", "lam", "previous", "active")


class ChunkCheckpoints:
    """The checkpoints of chunk ``chunk`` of the estimate store at ``store`` (module docstring).
    ``label`` names the chunk in the lines written on ``log`` (default stderr); ``seconds``:
    the cadence (default :data:`CHECKPOINT_SECONDS`); ``fsync``: as the store's;
    ``on_resume(iterations)``: called when a checkpoint is loaded (the progress line's
    :meth:`distfit.runtime.progress.Progress.resumed`). ``resumed_at``: the iterations a loaded
    checkpoint had done (0: none loaded); ``written``: how many checkpoints this session wrote;
    ``key``: the fit's (:meth:`load`)."""

    def __init__(self, store: str | os.PathLike, chunk: int, label: str, *, log: TextIO | None = None,
                 seconds: float | None = None, fsync: bool = True,
                 on_resume: Callable[[int], None] | None = None) -> None:
        self.store, self.chunk, self.label = store, int(chunk), label
        self.log = log or sys.stderr
        self.seconds = CHECKPOINT_SECONDS if seconds is None else float(seconds)
        self.fsync = fsync
        self.on_resume = on_resume
        self.resumed_at = 0
        self.written = 0
        self.key: str | None = None
        self._last = time.monotonic()

    def load(self, inputs: StateInputs) -> AdmmState | None:
        """The chunk's checkpoint saved from the same ``inputs`` (their fingerprint, the
        checkpoint's ``key``), verified; None (and one line on the log when one was there but
        refused) to start from the beginning. Called once, as the fit starts."""
        self.key = fingerprint(inputs.claims, inputs.arrays)
        self._last = time.monotonic()
        try:
            found = read_checkpoint(self.store, self.chunk)
        except CheckpointError as refused:
            self._refuse(f"{refused}; not used")
            return None
        if found is None:
            return None
        arrays, attrs = found
        if attrs.get("key") != self.key or set(arrays) != set(_STATE):
            self._refuse(f"{self.store}: the checkpoint of chunk {self.chunk} was saved from other inputs "
                         f"(key {attrs.get('key')}, now {self.key}); not used")
            return None
        state = AdmmState(done=int(attrs["step"]), **{name: arrays[name] for name in _STATE})
        self.resumed_at = state.done
        print(f"distfit: {self.label}: resuming the fit from its checkpoint at {state.done} iterations", file=self.log)
        if self.on_resume is not None:
            self.on_resume(state.done)
        return state

    def save(self, state: AdmmState) -> None:
        """Write ``state`` as the chunk's checkpoint (under the key :meth:`load` took) when
        :attr:`seconds` have passed since the fit started or the last checkpoint was written
        (the interval counts from the end of that write); otherwise nothing."""
        if time.monotonic() - self._last < self.seconds:
            return
        write_checkpoint(self.store, self.chunk, state.done,
                         {"u": state.u, "z": state.z, "lam": state.lam, "previous": state.previous,
                          "active": np.asarray(state.active, dtype=bool)}, {"key": self.key}, fsync=self.fsync)
        self.written += 1
        self._last = time.monotonic()

    def _refuse(self, why: str) -> None:
        print(f"distfit: {self.label}: {why}; the fit starts from the beginning", file=self.log)
        remove_checkpoints(self.store, self.chunk)
