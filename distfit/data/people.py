"""Synthetic people written as microdata: a directory of Parquet files, one row per person.

The people are drawn by :func:`distfit.data.synthetic.synthesize_people`; this module writes
them in the microdata format that :mod:`distfit.data.microdata` tabulates (demos, tests and
multi-level runs: ``distfit run`` on a spec with levels). It lives beside the tabulation and
not in :mod:`distfit.stores`, which holds the Zarr stores: Parquet microdata is the *input* of
a tabulation, not a distfit store. It is written atomically all the same, with the stores'
staging and replacement (:mod:`distfit.stores.files`).
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from distfit.checks import check_integer
from distfit.data.microdata import as_pipeline_spec, microdata_format
from distfit.data.synthetic import synthesize_people
from distfit.stores.files import STAGING_MARKER, fsync_tree, move_into_place

PathLike = str | os.PathLike

__all__ = ["write_synthetic_people"]


def write_synthetic_people(spec: Any, units: int, out: PathLike, *, seed: int | None = None,
                           overwrite: bool = False, fsync: bool = True) -> Path:
    """Synthetic microdata for ``spec``: a directory of Parquet files, one row per person.

    The people of ``units`` finest-level units are drawn from the synthetic-data model
    (:func:`distfit.data.synthetic.synthesize_people`: the cells, skew and correlations of
    :func:`distfit.data.synthetic.synthesize_histograms`, seeded by ``seed``; None: fresh
    entropy), one file per chunk of units: one column per attribute (its data column) and one
    per unit column of the spec (nested ids). The data is synthetic, not private.

    Written atomically: the files go to ``<out>.incomplete-<random>``, which is moved into place
    once complete; an existing ``out`` is refused unless ``overwrite`` (then only a directory of
    Parquet files is replaced). Returns ``out``.
    """
    spec = as_pipeline_spec(spec)
    units = check_integer(units, "units", 1)
    seed = secrets.randbits(63) if seed is None else check_integer(seed, "seed", 0)
    tables = synthesize_people(spec, units, seed)
    path = Path(os.fspath(out))

    def check_target(target: Path) -> None:
        if not (target.exists() or target.is_symlink()):
            return
        if not overwrite:
            raise FileExistsError(f"{target}: already exists (use --overwrite to replace it)")
        if microdata_format(target) != "parquet" or not target.is_dir():
            raise FileExistsError(f"{target}: not a directory of Parquet files; refusing to replace it")

    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    staging.mkdir()
    try:
        for number, table in enumerate(tables):
            pq.write_table(pa.table(table), staging / f"part-{number:05d}.parquet")
        if fsync:
            fsync_tree(staging)
        move_into_place(staging, path, check_target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path
