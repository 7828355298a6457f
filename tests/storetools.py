"""Helpers shared by tests that build or edit stores by hand."""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
import zarr

from distfit.plan.job import run_plan
from distfit.runtime.placement import Placement
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import load_spec
from distfit.stores.checksum import DIGESTS
from distfit.stores.sealing import lay_out_digests, seal_checksum, stated_attrs, write_digests


@dataclass(frozen=True)
class PlannedSpec:
    """A spec mapping written to ``spec_path`` as YAML, loaded (``spec``) and planned serially
    into ``plan``, all under ``root``."""

    root: Path
    spec_path: Path
    spec: PipelineSpec
    plan: str


def planned(root: Path, mapping: dict[str, Any], spec_name: str = "spec.yaml",
            plan_name: str = "plan.zarr") -> PlannedSpec:
    """Write ``mapping`` to ``root/spec_name`` as YAML, load it and plan it (serially, quietly)
    into ``root/plan_name``: the way a user makes a plan, in one call."""
    spec_path = root / spec_name
    spec_path.write_text(yaml.safe_dump(mapping))
    spec = load_spec(spec_path)
    plan = root / plan_name
    run_plan(spec, str(plan), placement=Placement(serial=True), log=io.StringIO())
    return PlannedSpec(root, spec_path, spec, str(plan))


def stated_checksum(path: str | os.PathLike) -> str:
    """The checksum of the release, estimate or data store at ``path`` recomputed by its rule
    (every array and every stated attr), as a reader does."""
    group = zarr.open_group(store=str(path), mode="r")
    return seal_checksum(group, dict(group.attrs), stated_attrs)


def relist_digests(path: str | os.PathLike) -> None:
    """Recompute the per-chunk digests of the store at ``path`` (if it has them) from its arrays
    as they are stored, after a test edited them; arrays it lists that a test removed are
    dropped from the list (a store laid out without them)."""
    group = zarr.open_group(store=str(path), mode="r+")
    if DIGESTS not in group:
        return
    digests = group[DIGESTS]
    names = list(digests.attrs["arrays"])
    kept = [name for name in names if name in group]
    if kept != names:
        units, chunk_units = int(group[kept[0]].shape[0]), int(digests.attrs["chunk_units"])
        del group[DIGESTS]
        lay_out_digests(group, kept, units=units, chunk_units=chunk_units)
    write_digests(group)


def reseal(path: str | os.PathLike) -> str:
    """Seal the release, estimate or data store at ``path`` again after a test edited it by
    hand (its per-chunk digests recomputed first): what a store written by another tool, or by a
    forger who knows the rule, looks like.
    The readers' own checks (bad counts, duplicate ids, another plan) must then catch what the
    checksum no longer can. Returns the new checksum."""
    relist_digests(path)  # the per-chunk digests of what the test wrote, then the root over them
    group = zarr.open_group(store=str(path), mode="r+")
    checksum = stated_checksum(path)
    group.attrs["checksum"] = checksum
    return checksum
