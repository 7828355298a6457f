"""Arrays a Dask worker unpickled, made aligned (:func:`realigned`).

A worker unpickles a task's arguments as views into the message it received, at any byte
offset, and numpy sums an unaligned float64 array along another loop than an aligned one, with
other rounding (benchmarks/README.md, "Session 24 (lead)": Adult's plan on 2 workers changed its
checksum run to run until ``solver.solve`` aligned its inputs). A value held on every worker for
a job's tasks (:func:`distfit.runtime.cluster.held_on_every_worker`: the estimate's measurement
model, the geography's forests job) is realigned once where it lands, so that the tasks compute
the bits the driver computes from the same value.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse

from distfit.mathematics.workload import aligned

__all__ = ["realigned"]

#: The index arrays of scipy's sparse formats (``data`` besides).
SPARSE_ARRAYS = ("data", "indices", "indptr", "row", "col", "offsets")


def realigned(value: Any) -> Any:
    """``value`` with every unaligned numpy array in it replaced by an aligned copy
    (:func:`distfit.mathematics.workload.aligned`: same values, same memory order). Walked:
    arrays, tuples (rebuilt where an item changed), lists and dicts (in place), scipy sparse
    matrices and arrays, and the attributes of distfit's own objects (in place, frozen
    dataclasses and cached properties included); anything else is left as it is. Meant for a
    freshly unpickled value that nothing else refers to yet."""
    return _walk(value, set())


def _walk(value: Any, seen: set[int]) -> Any:
    if isinstance(value, np.ndarray):
        return aligned(value)
    if id(value) in seen:
        return value
    seen.add(id(value))
    if isinstance(value, tuple):
        items = [_walk(item, seen) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return type(value)._make(items) if hasattr(type(value), "_make") else type(value)(items)
    if isinstance(value, list):
        value[:] = [_walk(item, seen) for item in value]
    elif isinstance(value, dict):
        for key, item in value.items():
            value[key] = _walk(item, seen)
    elif scipy.sparse.issparse(value):
        for name in SPARSE_ARRAYS:
            if isinstance(getattr(value, name, None), np.ndarray):
                setattr(value, name, aligned(getattr(value, name)))
    elif type(value).__module__.startswith("distfit.") and hasattr(value, "__dict__"):
        attributes = vars(value)  # frozen dataclasses too: their __setattr__ is not called
        for name, item in list(attributes.items()):
            attributes[name] = _walk(item, seen)
    return value
