"""What the report needs of every block, without materialising a pack's blocks one by one.

:mod:`distfit.report.page` lists every block (id, attributes, alpha, lower bound, solver statistics,
``queries x rows x cells``) and, with ``--data``, compares the first units' released answers
with their true answers. For a packed plan (:class:`distfit.mathematics.packing.PackedBlocks`, up to
hundreds of thousands of blocks) both come from the pack's arrays: a block's shape is ``m_b =
sum of its segments' cells``, ``k_b = prod_{i in S}(n_i - 1)``, ``d_b = prod_{i in S} n_i``
(vectorised over the pack), and the true answers are the release's computation without noise
(:func:`distfit.release.packed.pack_measurements` with ``noise=None``, then
:func:`distfit.release.packed.pack_answers`): every block's ``B x`` and its rows added per
query. Blocks stored one group each are read as before (:func:`distfit.release.noise.true_block_answers`).
For validation only: the true answers are never written to a release.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from distfit.mathematics.packing import block_cells
from distfit.release.noise import query_answers, true_block_answers
from distfit.release.packed import pack_answers, pack_measurements, prepare_pack

__all__ = ["block_rows", "true_query_answers"]


def block_rows(plan: Any) -> list[dict]:
    """Every block of ``plan`` in ``block_ids`` order as the report's table has it: ``{"id",
    "attributes", "alpha", "lower_bound", "solver", "shape"}`` (``shape`` the text
    ``"m_b x k_b x d_b"``); packed blocks from their pack's arrays, in bulk."""
    rows: dict[str, dict] = {}
    for block_id in getattr(plan, "explicit_block_ids", plan.block_ids):
        rec = plan.block(block_id)
        rows[block_id] = {"id": block_id, "attributes": rec.attributes, "alpha": rec.alpha,
                          "lower_bound": rec.lower_bound, "solver": rec.solver,
                          "shape": " x ".join(map(str, rec.shape))}
    if getattr(plan, "pack_ids", ()):
        names = list(plan.attrs["schema"]["attributes"])
        sizes = np.asarray(plan.attrs["schema"]["sizes"], dtype=np.int64)
        for p, pack in enumerate(plan.packs()):
            cells = block_cells(sizes, pack.attributes)
            k = np.prod(np.where(pack.attributes >= 0, sizes[np.maximum(pack.attributes, 0)] - 1, 1), axis=1)
            m = np.bincount(pack.segment_block, block_cells(sizes, pack.segment_clique), minlength=len(pack))
            shapes = [f"{a} x {b} x {c}" for a, b, c in zip(m.astype(np.int64).tolist(), k.tolist(), cells.tolist())]
            for block_id, row, alpha, bound, shape in zip(plan.packed_block_ids(p), pack.attributes.tolist(),
                                                          pack.alpha.tolist(), pack.lower_bound.tolist(), shapes):
                rows[block_id] = {"id": block_id, "attributes": tuple(names[i] for i in row if i >= 0),
                                  "alpha": alpha, "lower_bound": bound, "solver": pack.solver, "shape": shape}
    return [rows[block_id] for block_id in plan.block_ids]


def true_query_answers(plan: Any, data: Any, units: int) -> np.ndarray:
    """The true answers (units x m) of the data's first ``units`` units: each query's rows summed
    over the blocks without noise; ``data`` a data store (:func:`distfit.stores.data.open_data`),
    read through ``block_counts``."""
    m = len(plan.queries_targets)
    pieces = []
    for block_id in getattr(plan, "explicit_block_ids", plan.block_ids):
        block = plan.block(block_id)
        pieces.append((block.query_index, true_block_answers(block, data.block_counts(block.attributes, 0, units))))
    out = query_answers(pieces, m) if pieces else np.zeros((units, m))
    if getattr(plan, "pack_ids", ()):
        names = list(plan.attrs["schema"]["attributes"])
        sizes = plan.attrs["schema"]["sizes"]
        for p, (pack_id, pack) in enumerate(zip(plan.pack_ids, plan.packs())):
            prepared = prepare_pack(pack, sizes, pack_id, p)

            def read(i: int, prepared=prepared) -> np.ndarray:
                return data.block_counts(tuple(names[j] for j in prepared.sources[i]), 0, units)

            pack_answers(prepared, pack_measurements(prepared, read, units), out)
    return out
