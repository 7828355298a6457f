"""Helpers shared by tests that build or edit stores by hand."""
from __future__ import annotations

import os

import zarr

from distfit.stores.checksum import DIGESTS
from distfit.stores.sealing import lay_out_digests, seal_checksum, stated_attrs, write_digests


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
