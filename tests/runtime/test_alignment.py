"""``runtime.alignment.realigned``: every unaligned array in a value a worker unpickled becomes an
aligned copy with the same values and memory order; aligned ones are kept as they are."""
from __future__ import annotations

import pickle
from collections import namedtuple

import numpy as np
import scipy.sparse

from distfit.runtime.alignment import realigned
from distfit.solver.basis import Representation
from distfit.solver.solve import WarmStart

from tests.alignment import unaligned

Pair = namedtuple("Pair", "left right")


def test_arrays_in_distfit_objects_tuples_lists_dicts_and_sparse_matrices_are_realigned():
    rng = np.random.default_rng(1)
    recon = np.asfortranarray(rng.standard_normal((9, 4)))
    start = WarmStart(unaligned(rng.standard_normal((4, 4))), unaligned(rng.random(6)), rng.random(9),
                      Representation(unaligned(rng.standard_normal((4, 6))), unaligned(recon), "custom", False))
    sparse = scipy.sparse.random(30, 20, density=0.2, format="csr", random_state=2)
    sparse.data = unaligned(sparse.data)
    value = {"start": start, "pair": Pair(unaligned(np.arange(7.0)), "text"), "list": [unaligned(np.ones(3)), 4],
             "sparse": sparse, "plain": (np.zeros(5), None)}
    expected = pickle.loads(pickle.dumps(value))  # aligned copies of the same values
    kept_plain = value["plain"]
    kept_queries = start.query_weights

    out = realigned(value)

    assert out is value and out["start"] is start and out["plain"] is kept_plain  # walked in place; nothing to do: kept
    assert start.query_weights is kept_queries
    assert isinstance(out["pair"], Pair) and out["pair"].right == "text"
    for got, want in ((start.sigma, expected["start"].sigma), (start.cell_weights, expected["start"].cell_weights),
                      (start.representation.basis, expected["start"].representation.basis),
                      (start.representation.recon, recon), (out["pair"].left, np.arange(7.0)),
                      (out["list"][0], np.ones(3)), (out["sparse"].data, expected["sparse"].data)):
        assert got.flags.aligned and got.tobytes() == want.tobytes()
    assert start.representation.recon.flags.f_contiguous and not start.representation.recon.flags.c_contiguous
    assert (out["sparse"] != expected["sparse"]).nnz == 0
