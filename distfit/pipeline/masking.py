"""The mask stage of ``distfit run``: a spec's ``mask`` section (pipelines/README.md, "Masked
pseudo-data") releases numeric columns of the run's microdata as masked pseudo-data into
``RUNDIR/mask.zarr`` after the release and its estimate (:func:`distfit.mask.job.mask_in_run`:
written, resumed or reused, then audited). Its budget is its own, spent on top of the plan's.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from distfit.mask.job import check_run_data, mask_in_run
from distfit.runtime.placement import Placement
from distfit.spec.model import MaskSpec

__all__ = ["check_mask_data", "mask_stage"]


def check_mask_data(mask: MaskSpec | None, source: str | os.PathLike | None) -> None:
    """Refuse (ValueError naming ``mask``), before the run does any work, a mask section without
    a CSV ``--data`` (``source``) holding its columns; nothing without a mask section."""
    if mask is not None:
        check_run_data(source, mask.columns)


def mask_stage(mask: MaskSpec | None, source: str | os.PathLike | None, out: Path,
               placement: Callable[[], Placement], log: TextIO, fsync: bool, stages: dict[str, str],
               timings: dict[str, float]) -> dict[str, Any] | None:
    """Run the mask stage into ``out`` when there is a mask section (``placement`` is called
    only if blocks are drawn), recording its status in ``stages`` and its seconds in
    ``timings``; returns the manifest's ``mask`` entry (None without a section)."""
    if mask is None:
        return None
    started = time.perf_counter()
    entry, stages["mask"] = mask_in_run(source, out, **mask.arguments(), placement=placement, log=log, fsync=fsync)
    timings["mask"] = time.perf_counter() - started
    return entry
