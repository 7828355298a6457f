"""The progress line (distfit.runtime.progress): rate and ETA, also for a fit resumed part way."""
from __future__ import annotations

import io
from types import SimpleNamespace

import distfit.runtime.progress as progress_module
from distfit.runtime.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rate_and_eta_count_only_the_items_done_in_this_session(monkeypatch):
    """On a clock the test moves: 50 of 1000 steps in 2 s is 25 steps/s and 38 s to go; a fit
    resumed at 250 steps (``resumed``) that reaches 300 two seconds later runs at 25 steps/s
    too, not 150 (its earlier steps are not this session's), ETA 28 s; the last line ends it."""
    clock = Clock()
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(perf_counter=clock))  # this module's clock only
    out = io.StringIO()
    fresh = Progress("fit", out, unit="steps")
    clock.now += 2.0
    fresh(50, 1000)
    assert out.getvalue() == "fit: 50/1000 steps, 25.0 steps/s, ETA 38 s   \r"
    out = io.StringIO()
    resumed = Progress("fit", out, unit="steps")
    clock.now += 7.0  # the checkpoint is found after the problem is built: not counted
    resumed.resumed(250)
    clock.now += 2.0
    resumed(300, 1000)
    clock.now += 2.0
    resumed(1000, 1000)
    assert out.getvalue() == ("fit: 300/1000 steps, 25.0 steps/s, ETA 28 s   \r"
                              "fit: 1000/1000 steps, 187.5 steps/s, ETA 0 s   \n")


def test_no_eta_before_one_percent_of_the_items_are_done(monkeypatch):
    """1 of 22,001 units after 300 s (a level's one large problem still running): the rate, and
    the ETA "unknown" rather than 6.6 million s; from 1 % of the items on, the ETA."""
    clock = Clock()
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(perf_counter=clock))
    out = io.StringIO()
    stage = Progress("estimate", out, unit="units")
    clock.now += 300.0
    stage(1, 22001)
    clock.now += 100.0
    stage(2201, 22001)
    assert out.getvalue() == ("estimate: 1/22001 units, 0.0 units/s, ETA unknown   \r"
                              "estimate: 2201/22001 units, 5.5 units/s, ETA 3598 s   \r")
