"""Helpers shared by tests that build or edit stores by hand."""
from __future__ import annotations

import os

import zarr

from distfit.stores.sealing import seal_checksum, stated_attrs


def stated_checksum(path: str | os.PathLike) -> str:
    """The checksum of the release, estimate or data store at ``path`` recomputed by its rule
    (every array and every stated attr), as a reader does."""
    group = zarr.open_group(store=str(path), mode="r")
    return seal_checksum(group, dict(group.attrs), stated_attrs)


def reseal(path: str | os.PathLike) -> str:
    """Seal the release, estimate or data store at ``path`` again after a test edited it by
    hand: what a store written by another tool, or by a forger who knows the rule, looks like.
    The readers' own checks (bad counts, duplicate ids, another plan) must then catch what the
    checksum no longer can. Returns the new checksum."""
    checksum = stated_checksum(path)
    zarr.open_group(store=str(path), mode="r+").attrs["checksum"] = checksum
    return checksum
