"""The estimate's compiled kernels (distfit.estimate.compiled, docs/compiled.md): one compiled
signature serves every structure, and after the warm-up a fresh process compiles nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distfit.estimate.orthant import solve_free, solve_orthant
from distfit.estimate.query_sums import add_query_sums, query_sums
from distfit.estimate.structure import block_low_rank
from distfit.estimate.warm import KERNELS
from tests.estimate.test_structure import structured_blocks
from distfit.estimate.measurements import model_from_blocks
from distfit.estimate.projection import normal_equations

ROOT = Path(__file__).resolve().parents[2]

#: Run in a fresh process after the warm-up: every kernel on two structures of different group
#: sizes and ranks, outputs as arrays and as strided views; prints the compilations numba made
#: (its "numba:compile" events: none on a cache hit) and each kernel's cache hits and misses.
FRESH = """
import json
import numpy as np
from numba.core import event
from tests.estimate.test_compiled import exercise
from distfit.estimate.warm import KERNELS
with event.install_recorder("numba:compile") as compiled:
    exercise()
print(json.dumps({"compiled": len(compiled.buffer), "kernels": {
    k.__name__: [sum(k.dispatcher.stats.cache_hits.values()), sum(k.dispatcher.stats.cache_misses.values()),
                 len(k.dispatcher.signatures)] for k in KERNELS}}))
"""


def _structure(seed: int, sizes: tuple[int, int, int]):
    rng = np.random.default_rng(seed)
    domain, blocks = structured_blocks(rng, sizes)
    model = model_from_blocks(domain, blocks)
    hessian = normal_equations(model, {b.block_id: rng.standard_normal((1, b.rows)) for b in model.blocks})[0]
    return block_low_rank(hessian, model.sizes), hessian


def exercise() -> list[tuple[int, int]]:
    """Every kernel run on two structures (groups of 4 and 3 cells, ranks 5 and 4), with
    contiguous outputs and with strided views; the (group cells, rank) of each."""
    shapes = []
    for seed, sizes in ((0, (2, 2, 9)), (2, (3, 1, 10))):
        structure, hessian = _structure(seed, sizes)
        shapes.append((structure.group_cells, structure.rank))
        rng = np.random.default_rng(seed)
        g = rng.poisson(2.0, (9, hessian.shape[0])) @ hessian + rng.standard_normal((9, hessian.shape[0]))
        solve_orthant(structure, g, tol=1e-10, max_steps=25)
        wide = np.zeros((9, hessian.shape[0] + 3))
        solve_orthant(structure, None, unconstrained=np.linalg.solve(hessian, g.T).T, tol=1e-10, max_steps=25,
                      out=wide[:, 1:-2], values=np.empty((9, 3))[:, :2], gradient=False)
        solve_free(structure, g, rng.random(g.shape) < 0.5)
        workload = np.vstack([np.eye(hessian.shape[0]), np.eye(hessian.shape[0])[:5] + np.eye(hessian.shape[0])[1:6]])
        estimates = np.zeros((9, workload.shape[0] + 2))
        add_query_sums(query_sums(workload, np.arange(hessian.shape[0], workload.shape[0])), g,
                       estimates[:, 1:-1])
    return shapes


def test_one_compilation_serves_every_structure():
    # two structures of different shapes, outputs of either layout: each kernel holds its one
    # signature (the sizes are arguments, not types) and compiles no other
    assert len(set(exercise())) == 2
    assert [len(k.dispatcher.signatures) for k in KERNELS] == [1] * len(KERNELS)
    sums = query_sums(np.eye(40)[:2] + np.eye(40)[1:3], np.array([0, 1]))
    with pytest.raises(TypeError):  # a type that does not convert to the signature's is refused, not compiled
        add_query_sums(sums, np.ones((3, 40), dtype=np.float32), np.zeros((3, 2)))
    assert [len(k.dispatcher.signatures) for k in KERNELS] == [1] * len(KERNELS)


def test_after_the_warm_up_a_fresh_process_compiles_nothing():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    warm = subprocess.run([sys.executable, "-m", "distfit.estimate.warm"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.count("distfit: kernel ") == len(KERNELS)
    fresh = subprocess.run([sys.executable, "-c", FRESH], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert fresh.returncode == 0, fresh.stderr
    report = json.loads(fresh.stdout)
    assert report["compiled"] == 0  # no numba:compile event: every kernel came from the cache
    assert report["kernels"] == {k.__name__: [1, 0, 1] for k in KERNELS}  # one signature each, loaded
