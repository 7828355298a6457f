"""Streamed planning: results go to the staging plan store as they complete (plan/job.py).

The streamed path must write the very plan store the in-memory path writes (the joint block
dual aside: only the in-memory path runs it, so it is switched off there for the comparison),
and an interrupted streamed write must leave nothing a reader accepts.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

import distfit.plan.planner as plan_module
import distfit.plan.job as planning
from distfit.audit.plan import audit_plan
from distfit.plan.planner import (
    BlockRef, decompose, plan_blocks, plan_streamed, serial_executor, solve_block, write_streamed_blocks,
)
from distfit.plan.job import StoreSink, finish_plan, planned_decomposition, run_plan, write_plan
from distfit.spec.parse import load_spec
from distfit.stores.checksum import compute_checksum
from distfit.stores.plan import BLOCK_ARRAYS, StoreError, read_plan
from distfit.stores.plan_writer import PlanWriter
from distfit.runtime.placement import Placement
from tests.reference import SMALL_SPEC

ROOT = Path(__file__).resolve().parents[2]

VARIANTS = {
    "merged": (SMALL_SPEC, 1),
    "residual-blocks": (dict(SMALL_SPEC, blocks={"merge": False}), 2),  # 6 blocks, 3 rounds
    "budget": (dict(SMALL_SPEC, privacy={"epsilon": 1.0, "delta": 1e-6}), 1),
}


def _write_spec(tmp_path, content, name="spec") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(content))
    return str(path)


def _in_memory(monkeypatch, spec_path, out, **kw):
    with monkeypatch.context() as m:
        m.setattr(plan_module, "CO_OPTIMIZE_WORK", 0.0)  # no joint block dual: the streamed path has none
        return run_plan(load_spec(spec_path), out, placement=Placement(serial=True), stream=False, log=io.StringIO(),
                        **kw)


def assert_same_store(first: str, second: str) -> None:
    a, b = read_plan(first), read_plan(second)
    assert a.block_ids == b.block_ids
    np.testing.assert_allclose(b.queries_targets, a.queries_targets, rtol=1e-12, atol=0)
    np.testing.assert_allclose(b.queries_variances, a.queries_variances, rtol=1e-12, atol=0)
    for x, y in zip(a.iter_blocks(), b.iter_blocks()):
        assert x.attributes == y.attributes
        for name in BLOCK_ARRAYS:
            np.testing.assert_allclose(getattr(y, name), getattr(x, name), rtol=1e-12, atol=1e-300, err_msg=name)
        assert y.alpha == pytest.approx(x.alpha, rel=1e-12)
        assert y.lower_bound == pytest.approx(x.lower_bound, rel=1e-12)
        assert {**y.solver, "seconds": 0} == {**x.solver, "seconds": 0}  # the solves' timings differ
    for key in ("alpha", "rho", "alpha_exact", "schema", "spec", "composition"):
        assert b.attrs[key] == pytest.approx(a.attrs[key], rel=1e-12) if isinstance(a.attrs[key], float) else b.attrs[key] == a.attrs[key]
    assert b.attrs["account"] == a.attrs["account"]
    for key in ("alpha_sum_bound", "variance_scale"):
        assert b.attrs["planner"][key] == pytest.approx(a.attrs["planner"][key], rel=1e-12)
    for key in ("chosen_blocks_lower_bound", "global_lower_bound"):  # each bound with what it bounds
        x, y = a.attrs["planner"][key], b.attrs["planner"][key]
        assert {**y, "value": None} == {**x, "value": None}
        assert y["value"] is None if x["value"] is None else y["value"] == pytest.approx(x["value"], rel=1e-12)
    assert b.attrs["planner"]["rounds"] == a.attrs["planner"]["rounds"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_streamed_store_equals_the_in_memory_store(tmp_path, monkeypatch, variant):
    content, rounds = VARIANTS[variant]
    spec_path = _write_spec(tmp_path, content)
    memory, streamed = str(tmp_path / "memory.zarr"), str(tmp_path / "streamed.zarr")
    plan_a, checksum_a = _in_memory(monkeypatch, spec_path, memory, refine_rounds=rounds)
    plan_b, checksum_b = run_plan(load_spec(spec_path), streamed, placement=Placement(serial=True), stream=True,
                                  refine_rounds=rounds, log=io.StringIO())
    assert not plan_a.streamed and plan_b.streamed
    assert len(plan_b.blocks) == len(plan_a.blocks)
    assert plan_b.alpha == pytest.approx(plan_a.alpha, rel=1e-12)
    assert_same_store(memory, streamed)
    assert (read_plan(memory).checksum, read_plan(streamed).checksum) == (checksum_a, checksum_b)
    # the arrays are even bit for bit the same (the arrays-only digest; the plan checksums also
    # cover the planner's decisions, and the streamed plan's say that it was streamed)
    assert compute_checksum(zarr.open_group(streamed, mode="r")) == compute_checksum(zarr.open_group(memory, mode="r"))
    assert any(line.startswith("streamed:") for line in read_plan(streamed).attrs["planner"]["decisions"])
    assert not (Path(streamed) / "scratch").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.zarr", "spec.yaml", "streamed.zarr"]
    assert audit_plan(streamed).ok


def test_streamed_plan_keeps_an_earlier_round_when_refinement_does_not_help(tmp_path):
    """Round 1 re-solves nothing (a stale executor hands back round 0's solutions): the round is
    no better, its drafts are dropped and round 0's drafts become the plan, as in memory."""
    spec = load_spec(_write_spec(tmp_path, dict(SMALL_SPEC, blocks={"merge": False})))
    cache = {}

    def stale(tasks):
        for task in tasks:
            if task.index not in cache:
                cache[task.index] = solve_block(task)
            yield task.index, cache[task.index]

    blocks, decisions = decompose(spec.domain, spec.group_triples(), 0)
    memory = plan_blocks(spec.domain, blocks, spec.targets, stale, 2, decisions, co_optimize=False)
    write_plan(spec, memory, str(tmp_path / "memory.zarr"))
    with PlanWriter(tmp_path / "streamed.zarr") as writer:
        sink = StoreSink(writer)
        refs = [sink.save_spec(block) for block in blocks]
        streamed = plan_streamed(spec.domain, refs, spec.targets, sink, stale, 2, decisions)
        # round 0 was solved to rounds.SHAPING_GAP: its shares are solved again to the block gap (drafts "round-2")
        assert [b.round for b in streamed.blocks] == [2] * len(refs)
        assert not (Path(writer.staging_path) / "scratch" / "round-1").exists()
        write_streamed_blocks(streamed, sink)
        finish_plan(writer, spec, streamed)
    assert memory.rounds == streamed.rounds == 2
    assert_same_store(str(tmp_path / "memory.zarr"), str(tmp_path / "streamed.zarr"))


def test_streamed_plan_holds_refs_not_arrays(tmp_path):
    """What the driver keeps of a streamed block is O(m_b): no basis, recon or sigma."""
    spec = load_spec(_write_spec(tmp_path, SMALL_SPEC))
    blocks, decisions = decompose(spec.domain, spec.group_triples(), 12)
    with PlanWriter(tmp_path / "plan.zarr") as writer:
        sink = StoreSink(writer)
        refs = [sink.save_spec(block) for block in blocks]
        plan = plan_streamed(spec.domain, refs, spec.targets, sink, serial_executor, 1, decisions)
        for block, spec_block in zip(plan.blocks, blocks):
            arrays = [v for v in vars(block.ref).values() if isinstance(v, np.ndarray)]
            assert all(a.ndim == 1 and a.size == spec_block.query_index.size for a in arrays)
            assert block.targets.shape == spec_block.query_index.shape
        assert isinstance(plan.blocks[0].ref, BlockRef)
        writer.abort()


def test_streamed_run_plan_never_holds_two_block_specs(tmp_path, monkeypatch):
    """run_plan's streamed path builds each spec when it spills it (decompose_lazily): when a
    spec is built, no earlier spec is still alive in the driver."""
    import gc
    import weakref

    from distfit.plan.residual import ResidualWorkload

    alive: weakref.WeakSet = weakref.WeakSet()
    most = []
    build = ResidualWorkload.build

    def tracked(self, layout):
        gc.collect()
        most.append(len(alive))
        spec = build(self, layout)
        alive.add(spec)
        return spec

    monkeypatch.setattr(ResidualWorkload, "build", tracked)
    content = dict(SMALL_SPEC, blocks={"merge": False})
    plan, _ = run_plan(load_spec(_write_spec(tmp_path, content)), str(tmp_path / "plan.zarr"),
                       placement=Placement(serial=True), stream=True, refine_rounds=0, log=io.StringIO())
    assert len(most) == len(plan.blocks) >= 4
    assert max(most) == 0


def test_should_stream_follows_the_held_bytes_limit(tmp_path, monkeypatch):
    spec = load_spec(_write_spec(tmp_path, SMALL_SPEC))
    blocks, _ = decompose(spec.domain, spec.group_triples(), 12)
    assert not plan_module.should_stream(blocks)
    assert plan_module.block_work(blocks) == plan_module.block_work([BlockRef.of(b) for b in blocks])
    held = plan_module.held_bytes(blocks)
    assert held == plan_module.held_bytes([BlockRef.of(b) for b in blocks])
    # the spec's arrays and HELD_ROUNDS solutions of each block, 8 bytes a float, counted by hand
    sizes = [(b.basis.shape[0], b.basis.shape[1], b.recon.shape[0]) for b in blocks]
    assert held == sum(8 * (k * d + m * k + 3 * (k * k + k * d + m * k + 2 * d + 3 * m)) for k, d, m in sizes)
    monkeypatch.setattr(plan_module, "STREAM_BYTES", held)
    assert not plan_module.should_stream(blocks)
    monkeypatch.setattr(plan_module, "STREAM_BYTES", held - 1.0)
    assert plan_module.should_stream(blocks)
    plan, _ = run_plan(load_spec(_write_spec(tmp_path, SMALL_SPEC)), str(tmp_path / "plan.zarr"),
                       placement=Placement(serial=True), log=io.StringIO())
    assert plan.streamed  # stream=None follows should_stream


def test_marginals_yaml_is_held_in_memory_though_over_the_old_work_limit():
    """pipelines/marginals.yaml (257 blocks) is over the joint-dual work that used to stream a plan
    (2e9 flops) but holds ~0.5 GB: it is planned in memory, without drafts in the store each round."""
    layouts = planned_decomposition(load_spec(str(ROOT / "pipelines" / "marginals.yaml"))).layouts
    assert plan_module.block_work(layouts) > 2e9
    assert 0.3 * 2**30 < plan_module.held_bytes(layouts) < 0.6 * 2**30 < plan_module.STREAM_BYTES
    assert not plan_module.should_stream(layouts)


# ---------------------------------------------------------------------------- interrupted streamed writes


def test_failed_streamed_write_leaves_nothing(tmp_path, monkeypatch):
    def failing(tasks):
        for n, task in enumerate(tasks):
            if n == 2:
                raise RuntimeError("worker lost for good")
            yield task.index, solve_block(task)

    monkeypatch.setattr(planning, "serial_executor", failing)
    spec_path = _write_spec(tmp_path, dict(SMALL_SPEC, blocks={"merge": False}))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_plan(load_spec(spec_path), str(tmp_path / "plan.zarr"), placement=Placement(serial=True), stream=True,
                 log=io.StringIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


_KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import distfit.plan.job as planning
    from distfit.plan.planner import solve_block
    from distfit.runtime.placement import Placement
    from distfit.spec.parse import load_spec

    spec, out, phase = sys.argv[1:4]
    def killed_while_solving(tasks):
        for n, task in enumerate(tasks):
            if n == 3:  # three blocks are in the staging store by now
                os.kill(os.getpid(), signal.SIGKILL)
            yield task.index, solve_block(task)
    if phase == "solve":
        planning.serial_executor = killed_while_solving
    else:
        promote = planning.StoreSink.promote
        done = []
        def killed_while_scaling(self, *args, **kwargs):
            if len(done) == 2:  # two blocks scaled into blocks/, the others still drafts
                os.kill(os.getpid(), signal.SIGKILL)
            done.append(promote(self, *args, **kwargs))
        planning.StoreSink.promote = killed_while_scaling
    planning.run_plan(load_spec(spec), out, placement=Placement(serial=True), stream=True, refine_rounds=1)
""")


@pytest.mark.parametrize("phase", ["solve", "promote"])
def test_killed_streamed_write_leaves_no_complete_looking_plan(tmp_path, phase):
    spec_path = _write_spec(tmp_path, dict(SMALL_SPEC, blocks={"merge": False}))
    out = tmp_path / "plan.zarr"
    result = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, spec_path, str(out), phase],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == -9, result.stderr
    assert not out.exists()
    staging = [p for p in tmp_path.iterdir() if p.name.startswith("plan.zarr.incomplete-")]
    assert len(staging) == 1
    promoted = [p for p in (staging[0] / "blocks").iterdir() if p.is_dir()]
    drafts = [p for p in (staging[0] / "scratch").glob("round-*/*") if p.is_dir()]
    # 6 solved blocks: on a plan this small the identity block r-age.sex is solved too (decomposition.SMALL_SOLVED_WORK)
    assert (len(promoted), len(drafts)) == ((2, 4) if phase == "promote" else (0, 3))
    with pytest.raises(StoreError, match="interrupted write"):
        read_plan(out)
    with pytest.raises(StoreError, match="staging directory"):
        read_plan(staging[0])
    with pytest.raises(StoreError):
        audit_plan(str(staging[0]))
    renamed = tmp_path / "renamed.zarr"  # even moved to a plain name it is not complete
    os.rename(staging[0], renamed)
    with pytest.raises(StoreError, match="not marked complete"):
        read_plan(renamed)
    # the leftover does not block a new run
    plan, _ = run_plan(load_spec(spec_path), str(out), placement=Placement(serial=True), stream=True, log=io.StringIO())
    assert read_plan(out).checksum and audit_plan(str(out)).ok
