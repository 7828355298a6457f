"""The one progress line of every stage: items done, rate and ETA, on a terminal or in a log.

Light (no Dask): the serial paths of the jobs print it too (``distfit.runtime.placement``'s
docstring: the jobs reach Dask only when a cluster is used)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ETA_AFTER_SHARE", "LONG_STAGE_SECONDS", "Progress"]

#: A stage that may take longer than this shows a progress line; one that ends sooner shows none
#: (``Progress(after=LONG_STAGE_SECONDS)``, for the stages that are short on most inputs).
LONG_STAGE_SECONDS = 2.0
#: The ETA is stated once this share of the items left at the start are done: before, the rate
#: says little (the geography's top-down counts a level's units as their parent's problem stops,
#: and one parent of 2,000 children showed "1/22001 units, ETA 10173101 s" for minutes).
ETA_AFTER_SHARE = 0.01


class Progress:
    """One status line: items done (``unit``: blocks, units, ...), rate and ETA (written to a
    terminal or a log; the ETA "unknown" until :data:`ETA_AFTER_SHARE` of the items are done). ``after``: nothing is printed, the last line included, until that many
    seconds have passed since the start (a stage that ends sooner needs no progress line: the
    audit of a small plan inside every release, the layout of a small store)."""

    def __init__(self, label: str, stream: TextIO | None = None, unit: str = "blocks", after: float = 0.0):
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.last = 0.0
        self.after = after
        self.before = 0

    def resumed(self, done: int) -> None:
        """``done`` items were done before this session (a fit resumed from its checkpoint):
        the rate and the ETA count only the items done from now on."""
        self.before = int(done)
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if (done < total and now - self.last < 0.5) or now - self.start < self.after:
            return
        self.last = now
        elapsed = now - self.start
        rate = (done - self.before) / elapsed if elapsed > 0 else 0.0
        known = rate > 0 and done - self.before >= ETA_AFTER_SHARE * (total - self.before)
        eta = f"{(total - done) / rate:.0f} s" if known else "unknown"
        end = "\n" if done == total else "\r"
        print(f"{self.label}: {done}/{total} {self.unit}, {rate:.1f} {self.unit}/s, ETA {eta}   ", end=end, file=self.stream, flush=True)
