"""Packed plans for the store, audit, release and report tests and the store benchmark, written
without the planner: every residual block of a spec's identity marginals in closed form
(:func:`distfit.mathematics.packing.marginal_pack`), all scaled by one factor so that the largest
variance/target is 1 (accuracy first; the allocation is not this helper's business).
``explicit`` moves some blocks out of the pack into one group each (a mixed plan)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from distfit.mathematics.packing import PackedBlocks, block_arrays, marginal_pack
from distfit.plan.composition import stitched_profile
from distfit.plan.residual import block_id_for
from distfit.mathematics.privacy import privacy_account
from distfit.spec.parse import parse_spec
from distfit.stores.plan import BlockRecord
from distfit.stores.plan_writer import PlanWriter


def marginals_spec(sizes, order: int = 2, targets=None, name: str = "packed") -> dict:
    """All ``order``-way identity marginals of attributes ``x0, x1, ..`` of ``sizes``; ``targets``
    one per marginal (lexicographic clique order), default 1."""
    cliques = list(itertools.combinations(range(len(sizes)), order))
    targets = np.ones(len(cliques)) if targets is None else np.broadcast_to(targets, (len(cliques),))
    return {
        "name": name,
        "attributes": [{"name": f"x{i}", "size": int(n)} for i, n in enumerate(sizes)],
        "queries": [{"name": "m-" + "-".join(f"x{i}" for i in c), "attributes": {f"x{i}": "identity" for i in c},
                     "target": float(t)} for c, t in zip(cliques, targets)],
    }


def attributes_for(blocks: int) -> int:
    """The fewest attributes ``a >= 2`` whose 2-way :func:`marginals_spec` has at least ``blocks``
    residual blocks: ``1 + a + C(a, 2)`` (the total, one per attribute, one per pair): the
    size of a plan in the store and packed-release benchmarks."""
    a = 2
    while 1 + a + a * (a - 1) // 2 < blocks:
        a += 1
    return a


def select(pack: PackedBlocks, keep: np.ndarray) -> PackedBlocks:
    """The blocks ``keep`` (positions, ascending) of ``pack`` as a pack of their own."""
    counts = np.diff(pack.segment_offsets)[keep]
    segments = np.concatenate([np.arange(pack.segment_offsets[b], pack.segment_offsets[b + 1]) for b in keep])
    where = np.full(pack.segments, -1)
    where[segments] = np.arange(segments.size)
    return PackedBlocks(attributes=pack.attributes[keep], scale=pack.scale[keep], alpha=pack.alpha[keep],
                        lower_bound=pack.lower_bound[keep], certificate=where[pack.certificate[keep]],
                        segment_offsets=np.concatenate([[0], np.cumsum(counts)]),
                        segment_clique=pack.segment_clique[segments], segment_query=pack.segment_query[segments],
                        segment_target=pack.segment_target[segments],
                        segment_variance=pack.segment_variance[segments], solver=pack.solver)


def packed_plan_parts(spec_dict: dict) -> tuple[PackedBlocks, np.ndarray, np.ndarray]:
    """``(pack, query targets, query variances)`` of the spec's closed-form plan (module docstring)."""
    spec = parse_spec(spec_dict)
    domain = spec.domain
    position = {name: i for i, name in enumerate(domain.names)}
    cliques = [tuple(position[a] for a in group.attributes) for group in spec.groups]
    per_group = [float(group.targets[0]) for group in spec.groups]
    sizes = list(domain.sizes)
    pack, targets = marginal_pack(sizes, cliques, per_group)
    cells = pack.segment_clique.copy()
    rows = np.where(cells >= 0, np.asarray(sizes)[np.maximum(cells, 0)], 1).prod(axis=1)
    query = np.repeat(pack.segment_query, rows) + np.arange(rows.sum()) - np.repeat(np.cumsum(rows) - rows, rows)
    variances = np.bincount(query, np.repeat(pack.segment_variance, rows), minlength=targets.size)
    factor = float(np.max(variances / targets))  # one scale for all: the largest variance/target becomes 1
    pack, _ = marginal_pack(sizes, cliques, per_group, scale=pack.scale * (1.0 / factor))
    variances = np.bincount(query, np.repeat(pack.segment_variance, rows), minlength=targets.size)
    return pack, targets, variances


def write_packed_plan(path, spec_dict: dict, *, explicit: int = 0, fsync: bool = False) -> str:
    """Write the spec's closed-form plan to ``path`` (module docstring): the first ``explicit``
    blocks one group each, the rest packed. Returns the checksum."""
    spec = parse_spec(spec_dict)
    domain = spec.domain
    pack, targets, variances = packed_plan_parts(spec_dict)
    sizes = list(domain.sizes)
    names = list(domain.names)
    alpha_sum = float(pack.alpha.sum())
    profiles = []
    with PlanWriter(Path(path), fsync=fsync) as writer:
        for b in range(min(explicit, len(pack))):
            own = tuple(names[i] for i in pack.attributes[b] if i >= 0)
            arrays = block_arrays(pack, sizes, b)
            writer.write_block(BlockRecord(block_id=block_id_for(own), attributes=own, alpha=pack.alpha[b],
                                           lower_bound=pack.lower_bound[b], solver=pack.solver, **arrays))
        if explicit < len(pack):
            writer.write_packed(select(pack, np.arange(explicit, len(pack))) if explicit else pack)
        exact = domain.size <= 5_000_000
        if exact:
            for b in range(len(pack)):
                own = tuple(names[i] for i in pack.attributes[b] if i >= 0)
                profiles.append((own, np.full(int(np.prod([domain.size_of(a) for a in own])), pack.alpha[b])))
        alpha = float(stitched_profile(domain, profiles).max()) if exact else alpha_sum
        return writer.finish(
            spec=spec.to_dict(), schema=domain.schema(), queries_targets=targets, queries_variances=variances,
            alpha=alpha, alpha_exact=exact, rho=alpha / 2, composition="sequential across blocks, parallel across units",
            extra_attrs={"account": privacy_account(alpha).to_dict(),
                         "planner": {"spec_hash": spec.spec_hash, "alpha_sum_bound": alpha_sum,
                                     "variance_scale": float(np.max(variances / targets))}})


def reference_release(plan, counts: np.ndarray, entropy: int, chunk_units: int) -> tuple[np.ndarray, dict]:
    """The release of ``counts`` (units x d, full domain) through ``plan`` block by block, from
    the materialised blocks (``plan.block``) and the literal formulas: each explicit block
    ``L (B x + xi C^T)`` with its own stream, each packed block ``B x + xi_b chol(Sigma_b)^T``
    with ``xi_b`` its columns of its pack's draw (``pack_stream``), answers ``L (B x + z)``
    summed per query. Returns ``(query answers, {pack_id: measurements})``."""
    from distfit.mathematics.domain import Domain
    from distfit.release.noise import block_positions, marginal_counts, noise_stream
    from distfit.release.packed import pack_offsets, pack_stream

    domain = Domain.from_schema(plan.attrs["schema"])
    sizes = list(domain.sizes)
    positions = block_positions(plan)
    m = plan.queries_targets.size
    answers, measured = [], {}
    for c, start in enumerate(range(0, counts.shape[0], chunk_units)):
        x = counts[start:start + chunk_units]
        out = np.zeros((x.shape[0], m))
        for block_id in plan.explicit_block_ids:
            block = plan.block(block_id)
            xi = noise_stream(entropy, positions[block_id], c).standard_normal((x.shape[0], block.basis.shape[0]))
            y = xi @ np.linalg.cholesky(block.sigma).T + marginal_counts(x, domain, block.attributes) @ block.basis.T
            np.add.at(out.T, block.query_index, (y @ block.recon.T).T)
        for p, (pack_id, pack) in enumerate(zip(plan.pack_ids, plan.packs())):
            offsets = pack_offsets(pack, sizes)
            xi = pack_stream(entropy, p, c).standard_normal((x.shape[0], int(offsets[-1])))
            ys = []
            for b, block_id in enumerate(plan.packed_block_ids(p)):
                block = plan.block(block_id)
                y = (xi[:, offsets[b]:offsets[b + 1]] @ np.linalg.cholesky(block.sigma).T
                     + marginal_counts(x, domain, block.attributes) @ block.basis.T)
                np.add.at(out.T, block.query_index, (y @ block.recon.T).T)
                ys.append(y)
            measured.setdefault(pack_id, []).append(np.concatenate(ys, axis=1))
        answers.append(out)
    return np.concatenate(answers), {k: np.concatenate(v) for k, v in measured.items()}


def write_marginals_data(path, spec_dict: dict, units: int, *, people: int = 30, chunk_units: int = 64,
                         seed: int = 0, fsync: bool = False):
    """A marginals data store (:mod:`distfit.stores.data`) for the spec's identity marginals:
    ``people`` random people per unit (uniform values), tabulated on each query's clique,
    written with the store's public writers (no microdata file, no Dask: quick for thousands of
    cliques). Returns the path."""
    from distfit.stores.data import MARGINALS_FORMAT, MarginalsWriter, create_marginals, staged_store, \
        write_marginals_attrs

    spec = parse_spec(spec_dict)
    domain = spec.domain
    sizes = np.asarray(domain.sizes, dtype=np.int64)
    position = {name: i for i, name in enumerate(domain.names)}
    cliques = [tuple(position[a] for a in group.attributes) for group in spec.groups]
    rng = np.random.default_rng(seed)
    values = rng.integers(0, sizes, size=(units * people, sizes.size))  # person x attribute
    unit = np.repeat(np.arange(units), people)
    widths = [int(np.prod(sizes[list(c)])) for c in cliques]
    with staged_store(path, MARGINALS_FORMAT, fsync=fsync) as (_staging, group):
        create_marginals(group, widths, units, chunk_units, integer_ids=True)
        writer = MarginalsWriter(_staging)
        for i, clique in enumerate(cliques):
            cell = np.ravel_multi_index(tuple(values[:, p] for p in clique), tuple(sizes[list(clique)]))
            counts = np.bincount(unit * widths[i] + cell, minlength=units * widths[i]).reshape(units, widths[i])
            writer.write_marginal(i, 0, counts.astype(np.int64))
        writer.write_unit_ids(0, np.arange(units, dtype=np.int64))
        write_marginals_attrs(group, domain=domain, spec_hash=spec.spec_hash, units=units, chunk_units=chunk_units,
                              cliques=[tuple(domain.names[p] for p in c) for c in cliques],
                              source={"path": "synthetic", "format": "csv", "rows": units * people, "size": 0,
                                      "mtime": 0}, total_people=units * people)
    return Path(path)
