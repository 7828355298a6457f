"""`distfit estimate` end to end: a plan and its sealed release -> a sealed, resumable estimate store."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.estimate.job as job_module
from distfit.mathematics.domain import Domain
from distfit.estimate.job import run_estimate
from distfit.estimate.projection import project_nonnegative
from distfit.estimate.measurements import (
    NONNEGATIVE_TOLERANCE,
    WorkloadKind,
    measurement_model,
    published_estimates,
    recover_measurements,
    workload_estimates,
    workload_kind,
)
from distfit.release.job import run_release
from distfit.release.noise import block_marginal
from distfit.stores.data import read_histograms
from distfit.stores.estimate import (
    EstimateError,
    create_estimate,
    fit_summary,
    read_estimate,
    stored_tables,
    verify_estimate,
)
from distfit.stores.lock import StoreLockedError, store_lock
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from distfit.runtime.placement import Placement
from tests.clitools import assert_one_line_error, run
from tests.holding import held_job, wait_held
from tests.reference import SMALL_CHUNK as CHUNK, SMALL_SPEC, SMALL_UNITS as UNITS
from tests.storetools import reseal
from tests.storetools import planned

SEED = 24680


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_plan, small_release):
    root = tmp_path_factory.mktemp("estimate-inputs")
    data, release = small_release.data, small_release.path
    # another spec's plan and a release of it (same schema)
    other = dict(SMALL_SPEC, queries=[dict(SMALL_SPEC["queries"][0], target=[2, 2, 2, 3, 3, 3])]
                 + SMALL_SPEC["queries"][1:])
    other_plan = planned(root, other, "other.yaml", "other.zarr").plan
    other_release = root / "other-release.zarr"
    run_release(other_plan, data, other_release, seed=SEED, placement=Placement(serial=True), fsync=False)
    reference = root / "estimate.zarr"
    run_estimate(small_plan.plan, release, reference, placement=Placement(serial=True), fsync=False)
    return {"root": root, "plan": small_plan.plan, "data": data, "release": release,
            "other_plan": str(other_plan), "other_release": str(other_release), "estimate": str(reference)}


def _arrays(path) -> dict[str, np.ndarray]:
    group = zarr.open_group(store=str(path), mode="r")
    return {name: arr[...] for name, arr in group.members(max_depth=None) if isinstance(arr, zarr.Array)}


def _assert_same_store(a, b) -> None:
    left, right = _arrays(a), _arrays(b)
    assert set(left) == set(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].tobytes() == right[name].tobytes() if left[name].dtype != object else \
            left[name].tolist() == right[name].tolist(), name
    # the same facts, but where the inputs were read from (each estimate states its own paths)
    where = ("checksum", "created", "sealed", "plan_path", "release_path")
    facts = [{k: v for k, v in read_estimate(path).attrs.items() if k not in where} for path in (a, b)]
    assert facts[0] == facts[1]
    # the fit attr, gathered from the chunk tasks (and the store, for chunks of an earlier
    # session), is the same exactly, and what the store's solve/* arrays give
    fits = [read_estimate(path).attrs["fit"] for path in (a, b)]
    root = zarr.open_group(str(a), mode="r")
    assert fits[0] == fits[1] == fit_summary(root, int(root.attrs["chunk_units"]))


def _sealed(path) -> bool:
    p = Path(path) / "zarr.json"
    return p.exists() and json.loads(p.read_text())["attributes"].get("complete") is True


def _measurement_matrices(plan):
    """Independent of distfit.estimate: per block, ``M_b`` (d_b x cells, built by marginalising
    the identity), ``B_b``, the whitener ``C_b^-1`` and ``L_b``'s pseudo-inverse."""
    domain = Domain(tuple(plan.attrs["schema"]["attributes"]), tuple(plan.attrs["schema"]["sizes"]))
    eye = np.eye(domain.size)
    out = []
    for block in plan.iter_blocks():
        marginaliser = block_marginal(eye.astype(np.int64), domain, block.attributes).T.astype(float)
        whitener = np.linalg.inv(np.linalg.cholesky(block.sigma))
        out.append((block, marginaliser, whitener, np.linalg.pinv(block.recon)))
    return domain, out


def _workload(plan) -> np.ndarray:
    """W (m x cells) from the plan's blocks: sum by query of the rows L_b B_b M_b."""
    domain, blocks = _measurement_matrices(plan)
    w = np.zeros((len(plan.queries_targets), domain.size))
    for block, marginaliser, _, _ in blocks:
        np.add.at(w, block.query_index, block.recon @ block.basis @ marginaliser)
    return w


def test_estimate_is_nonnegative_consistent_and_optimal(inputs):
    """Every unit's x_hat is >= 0, the query estimates are W x_hat (W built here from the plan),
    and x_hat satisfies the KKT conditions of the projection, written out independently:
    gradient ``H x - g`` (H, g from the plan's arrays and the release) zero on the free cells,
    >= 0 on the cells at 0. The error of B x_hat in the noise's metric is never larger than the
    measurements' (projection onto a convex set holding the truth), unit by unit."""
    plan = read_plan(inputs["plan"])
    release = read_release(inputs["release"])
    est = read_estimate(inputs["estimate"])
    x = np.asarray(est.cells[...])
    assert x.shape == (UNITS, 36) and x.dtype == np.float64 and (x >= 0).all()
    np.testing.assert_allclose(np.asarray(est.estimates[...]), x @ _workload(plan).T, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(est.unit_ids[...]), np.asarray(release.unit_ids[...]))
    domain, blocks = _measurement_matrices(plan)
    counts = np.asarray(read_histograms(inputs["data"]).counts[...], dtype=float)
    hessian = np.zeros((domain.size, domain.size))
    linear = np.zeros((UNITS, domain.size))
    error_hat = np.zeros(UNITS)
    error_raw = np.zeros(UNITS)
    for block, marginaliser, whitener, recovery in blocks:
        answers = np.asarray(release.block_answers(block.block_id)[...])
        y = answers @ recovery.T
        g = whitener @ block.basis @ marginaliser  # whitened B M
        hessian += g.T @ g
        linear += (y @ whitener.T) @ g
        error_hat += (((x - counts) @ g.T) ** 2).sum(axis=1)
        error_raw += (((y @ whitener.T) - counts @ g.T) ** 2).sum(axis=1)
    gradient = x @ hessian - linear
    scale = np.abs(linear).max()
    free = x > 1e-7 * max(1.0, x.max())
    assert np.abs(gradient[free]).max() <= 1e-6 * scale
    assert gradient[~free].min() >= -1e-6 * scale
    assert (error_hat <= error_raw + 1e-8).all()
    assert est.attrs["fit"]["unconverged_units"] == 0
    objective = np.asarray(est.objective[...])
    expected = np.zeros(UNITS)
    for block, marginaliser, whitener, recovery in blocks:
        y = np.asarray(release.block_answers(block.block_id)[...]) @ recovery.T
        expected += (((y - x @ (block.basis @ marginaliser).T) @ whitener.T) ** 2).sum(axis=1)
    np.testing.assert_allclose(objective, expected, rtol=1e-9, atol=1e-9)


def test_store_attrs_and_no_data(inputs):
    est = read_estimate(inputs["estimate"])
    plan, release = read_plan(inputs["plan"]), read_release(inputs["release"])
    a = est.attrs
    assert a["distfit_format"] == "estimate" and a["format_version"] == 5 and a["complete"] is True
    assert a["plan_checksum"] == plan.checksum and a["release_checksum"] == release.checksum
    assert a["method"] == "projection" and a["integer"] is False and "Sigma_b^-1" in a["objective"]
    assert a["units"] == UNITS and a["chunk_units"] == CHUNK and a["n_chunks"] == 7
    assert set(a["fit"]) == {"objective_mean", "objective_max", "iterations_max", "unconverged_units"}
    assert verify_estimate(inputs["estimate"])[0]
    assert est.labels == release.labels and est.groups == {"age": [0, 6], "age_sex": [6, 18], "sex_edu": [18, 24]}
    text = "\n".join(p.read_text() for p in Path(inputs["estimate"]).rglob("zarr.json"))
    assert inputs["data"] not in text and "data.zarr" not in text
    counts = np.asarray(read_histograms(inputs["data"]).counts[...])
    for name, arr in _arrays(inputs["estimate"]).items():
        assert not (arr.shape == counts.shape and np.array_equal(arr, counts)), name


def test_integer_estimates_keep_each_units_total(inputs, tmp_path):
    out = tmp_path / "int.zarr"
    result = run_estimate(inputs["plan"], inputs["release"], out, integer=True, placement=Placement(serial=True),
                          fsync=False)
    assert result.integer and result.chunks_done_now == 7
    est, real = read_estimate(out), read_estimate(inputs["estimate"])
    x, xf = np.asarray(est.cells[...]), np.asarray(real.cells[...])
    assert x.dtype == np.int64 and est.estimates.dtype == np.int64 and est.attrs["integer"] is True
    assert (x >= 0).all() and (np.abs(x - xf) < 1).all()  # each cell the floor or ceiling
    np.testing.assert_array_equal(x.sum(axis=1), np.rint(xf.sum(axis=1)).astype(np.int64))
    np.testing.assert_array_equal(np.asarray(est.estimates[...]),
                                  np.rint(x @ _workload(read_plan(inputs["plan"])).T).astype(np.int64))


def test_estimation_runs_with_the_data_store_deleted(inputs, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(inputs["release"], root / "release.zarr")
    shutil.copytree(inputs["plan"], root / "plan.zarr")
    assert not (root / "data.zarr").exists()  # copied without the data it was released from
    run_estimate(root / "plan.zarr", root / "release.zarr", root / "e.zarr", placement=Placement(serial=True),
                 fsync=False)
    _assert_same_store(root / "e.zarr", inputs["estimate"])


class Interrupt(Exception):
    pass


def _chunk_files(path, chunks) -> dict[str, bytes]:
    """Bytes of every file of the unit-chunked arrays (CHUNK rows per zarr chunk) of ``chunks``."""
    files = {}
    for name in ("queries/estimates", "cells/estimates", "solve/objective", "unit_ids"):
        for c in chunks:
            for f in (Path(path) / name / "c").rglob("*"):
                if f.is_file() and f.relative_to(Path(path) / name / "c").parts[0] == str(c):
                    files[f"{name}/{f.name}/{c}"] = f.read_bytes()
    return files


def test_interrupted_estimate_resumes_without_redoing_chunks(inputs, tmp_path, capsys):
    out = tmp_path / "e.zarr"
    seen = []

    def stop_after_three(chunk):
        seen.append(chunk)
        if len(seen) == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_estimate(inputs["plan"], inputs["release"], out, placement=Placement(serial=True), fsync=False,
                     after_chunk=stop_after_three)
    capsys.readouterr()
    assert not _sealed(out)
    with pytest.raises(EstimateError, match="incomplete"):
        read_estimate(out)
    done = np.flatnonzero(zarr.open_array(str(out / "chunks/done"), mode="r")[...]).tolist()
    assert done == [0, 1, 2]
    before = _chunk_files(out, done)
    assert before
    code, _, err = run(capsys, "estimate", inputs["plan"], inputs["release"], "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, "incomplete estimate", "--resume")
    redone = []
    result = run_estimate(inputs["plan"], inputs["release"], out, resume=True, placement=Placement(serial=True),
                          fsync=False,
                          after_chunk=redone.append)
    assert result.resumed and result.chunks_done_now == 4 and sorted(redone) == [3, 4, 5, 6]
    assert _chunk_files(out, done) == before  # the finished chunks untouched
    _assert_same_store(out, inputs["estimate"])


def test_a_detailed_workload_keeps_the_cells_in_the_queries(inputs, tmp_path, capsys):
    """A workload with every cell as a query (PL94's detailed group): the store writes x_hat
    once, as those query columns (no cells/estimates, the cells group's in_queries), the reader's
    ``cells`` are them and equal the projection of the recovered measurements; an interrupted
    estimate of it resumes to the same store; the checksum verifies."""
    spec = dict(SMALL_SPEC, queries=SMALL_SPEC["queries"] + [
        {"name": "detailed", "attributes": {"age": "identity", "sex": "identity", "edu": "identity"}, "target": 4}],
                blocks={"max_cells": 36})
    plan = planned(tmp_path, spec, "detailed.yaml").plan
    release, out = tmp_path / "release.zarr", tmp_path / "e.zarr"
    run_release(plan, inputs["data"], release, seed=SEED, placement=Placement(serial=True), fsync=False)
    run_estimate(plan, release, out, placement=Placement(serial=True), fsync=False)
    est = read_estimate(out)
    assert not (out / "cells" / "estimates").exists() and verify_estimate(out)[0]
    start, stop = zarr.open_group(str(out / "cells"), mode="r").attrs["in_queries"]
    assert stop - start == 36 and est.groups["detailed"] == [start, stop]
    x = np.asarray(est.cells[...])
    assert x.shape == est.cells.shape == (UNITS, 36) and est.cells.dtype == np.float64
    np.testing.assert_array_equal(x, np.asarray(est.estimates[:, start:stop]))
    np.testing.assert_array_equal(est.cells[7], x[7])
    model = measurement_model(read_plan(str(plan)))
    answers = {b.block_id: np.asarray(read_release(release).block_answers(b.block_id)[...]) for b in model.blocks}
    direct = project_nonnegative(model, recover_measurements(model, answers)).x
    np.testing.assert_allclose(x, direct, rtol=0, atol=1e-9 * max(1.0, direct.max()))
    stopped = tmp_path / "stopped.zarr"

    def stop_after_two(chunk):
        if chunk == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_estimate(plan, release, stopped, placement=Placement(serial=True), fsync=False, after_chunk=stop_after_two)
    result = run_estimate(plan, release, stopped, resume=True, placement=Placement(serial=True), fsync=False)
    assert result.resumed and result.chunks_done_now == 5
    _assert_same_store(stopped, out)


def test_killed_estimate_resumes_and_equals_an_uninterrupted_one(inputs, tmp_path, capsys):
    """SIGKILL the estimating process once some chunks are done (proved from the store), resume
    with the command line, and compare bit for bit with the uninterrupted estimate. The estimate
    holds after its second chunk (tests.holding) and is killed there."""
    out = tmp_path / "killed.zarr"
    script = (
        "from distfit.estimate.job import run_estimate\n"
        "from distfit.runtime.placement import Placement\n"
        f"run_estimate({inputs['plan']!r}, {inputs['release']!r}, {str(out)!r}, placement=Placement(serial=True),\n"
        "             after_chunk=hold_after(2))\n")
    with held_job(script) as process:
        wait_held(process)
        done = zarr.open_group(store=str(out), mode="r")["chunks/done"][...]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert done.sum() == 2 < done.size, "the estimate was not caught half-way"
    assert not _sealed(out)
    finished = np.flatnonzero(zarr.open_array(str(out / "chunks/done"), mode="r")[...]).tolist()
    before = _chunk_files(out, finished)
    code, stdout, err = run(capsys, "estimate", inputs["plan"], inputs["release"], "--out", str(out), "--serial",
                            "--resume")
    assert code == 0, err
    assert f"{len(finished)} of 7 chunks already estimated" in err and "resumed" in stdout
    assert _chunk_files(out, finished) == before
    _assert_same_store(out, inputs["estimate"])


def test_local_cluster_equals_serial(inputs, tmp_path, capsys):
    out = tmp_path / "dask.zarr"
    code, stdout, err = run(capsys, "estimate", inputs["plan"], inputs["release"], "--out", str(out),
                            "--workers", "2")
    assert code == 0, err
    assert "local cluster with 2 worker processes" in err and "sealed" in stdout
    _assert_same_store(out, inputs["estimate"])


def test_bad_inputs_exit_2_and_seal_nothing(inputs, tmp_path, capsys):
    def estimate(plan, release, out, *flags):
        code, _, err = run(capsys, "estimate", str(plan), str(release), "--out", str(out), "--serial", *flags)
        return code, err

    # a release whose plan checksum differs from the plan's: a release of another spec's plan
    out = tmp_path / "a.zarr"
    code, err = estimate(inputs["plan"], inputs["other_release"], out)
    assert code == 2
    assert_one_line_error(err, "released from another plan", read_plan(inputs["plan"]).checksum)
    assert not out.exists()
    # ... and a release whose recorded plan checksum was altered
    forged = tmp_path / "forged.zarr"
    shutil.copytree(inputs["release"], forged)
    meta = json.loads((forged / "zarr.json").read_text())
    meta["attributes"]["plan_checksum"] = "sha256:" + "0" * 64
    (forged / "zarr.json").write_text(json.dumps(meta))
    code, err = estimate(inputs["plan"], forged, out)
    assert code == 2
    assert_one_line_error(err, str(forged), "changed after it was sealed")
    assert not out.exists()
    reseal(forged)  # a forger who knows the sealing rule: the plan link itself must catch it
    code, err = estimate(inputs["plan"], forged, out)
    assert code == 2
    assert_one_line_error(err, "released from another plan", "sha256:" + "0" * 64)
    assert not out.exists()
    # an unsealed release
    unsealed = tmp_path / "unsealed.zarr"
    shutil.copytree(inputs["release"], unsealed)
    meta = json.loads((unsealed / "zarr.json").read_text())
    meta["attributes"]["complete"] = False
    (unsealed / "zarr.json").write_text(json.dumps(meta))
    code, err = estimate(inputs["plan"], unsealed, out)
    assert code == 2
    assert_one_line_error(err, "incomplete")
    assert not out.exists()
    # a plan altered since (its arrays no longer match its checksum)
    plan = tmp_path / "plan.zarr"
    shutil.copytree(inputs["plan"], plan)
    block = read_plan(plan).block_ids[0]
    zarr.open_array(str(plan / f"blocks/{block}/sigma"), mode="r+")[0, 0] *= 2
    code, err = estimate(plan, inputs["release"], out)
    assert code == 2
    assert_one_line_error(err, "do not match its checksum")
    assert not out.exists()
    # an estimate already sealed at --out: refused, kept; --overwrite replaces it
    sealed = tmp_path / "sealed.zarr"
    shutil.copytree(inputs["estimate"], sealed)
    checksum = read_estimate(sealed).checksum
    code, err = estimate(inputs["plan"], inputs["release"], sealed)
    assert code == 2
    assert_one_line_error(err, "sealed estimate", "--overwrite")
    assert read_estimate(sealed).checksum == checksum
    code, err = estimate(inputs["plan"], inputs["other_release"], sealed, "--overwrite")
    assert code == 2 and read_estimate(sealed).checksum == checksum
    assert sorted(p.name for p in tmp_path.glob("sealed.zarr*")) == ["sealed.zarr"]
    code, err = estimate(inputs["plan"], inputs["release"], sealed, "--overwrite", "--integer")
    assert code == 0, err
    assert read_estimate(sealed).integer and sorted(p.name for p in tmp_path.glob("sealed.zarr*")) == ["sealed.zarr"]
    # not an estimate store at --out; --resume with --overwrite
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "file").write_text("mine")
    code, err = estimate(inputs["plan"], inputs["release"], junk, "--overwrite")
    assert code == 2
    assert_one_line_error(err, "not a distfit estimate store")
    code, err = estimate(inputs["plan"], inputs["release"], out, "--resume", "--overwrite")
    assert code == 2
    assert_one_line_error(err, "exclude")
    # one writer at a time
    with store_lock(out, "test"):
        with pytest.raises(StoreLockedError):
            run_estimate(inputs["plan"], inputs["release"], out, placement=Placement(serial=True))
    assert not out.exists()


def test_an_incomplete_estimate_of_other_options_is_not_resumed(inputs, tmp_path, capsys):
    out = tmp_path / "e.zarr"

    def stop(chunk):
        raise Interrupt

    with pytest.raises(Interrupt):
        run_estimate(inputs["plan"], inputs["release"], out, placement=Placement(serial=True), fsync=False,
                     after_chunk=stop)
    capsys.readouterr()
    code, _, err = run(capsys, "estimate", inputs["plan"], inputs["release"], "--out", str(out), "--serial",
                       "--resume", "--integer")
    assert code == 2
    assert_one_line_error(err, "integer", "--overwrite")
    assert not _sealed(out)


def test_workload_kind(small_plan):
    """The small plan's blocks have non-integer rows L_b B_b whose sums by query are 0/1 (W is
    integral and nonnegative: checked through W^T); halving one block's rows makes W fractional,
    negating it makes W negative somewhere."""
    model = measurement_model(read_plan(small_plan.plan))
    assert not all(np.array_equal(b.query_rows, np.rint(b.query_rows)) for b in model.blocks)
    assert workload_kind(model) == WorkloadKind(integral=True, nonnegative=True)
    assert workload_kind(dataclasses.replace(model, workload=None)) == WorkloadKind(True, True)  # slab by slab
    first = dataclasses.replace(model.blocks[0], query_rows=model.blocks[0].query_rows / 2)
    halved = dataclasses.replace(model, blocks=(first,) + model.blocks[1:], workload=None)
    assert not workload_kind(halved).integral
    assert workload_kind(dataclasses.replace(model, workload=model.workload / 2)) == WorkloadKind(False, True)
    assert not workload_kind(dataclasses.replace(model, workload=-model.workload)).nonnegative


def test_published_estimates_clamp_rounding_below_zero_only(small_plan):
    """A nonnegative workload's estimates a rounding error below 0 (the blockwise sum of
    residual rows) are published as 0; a real negative (a workload with negative
    coefficients) is kept."""
    model = dataclasses.replace(measurement_model(read_plan(small_plan.plan)), workload=None)
    x = np.random.default_rng(3).random((50, model.cells)) * (np.random.default_rng(4).random((50, model.cells)) < 0.3)
    raw = workload_estimates(model, x)
    published = published_estimates(model, x, workload_kind(model))
    assert published.min() >= 0
    np.testing.assert_array_equal(published[raw >= 0], raw[raw >= 0])
    assert np.abs(raw[raw < 0]).max(initial=0.0) <= NONNEGATIVE_TOLERANCE * (1 + x.sum(axis=1)).max()
    negative = WorkloadKind(integral=False, nonnegative=False)
    np.testing.assert_array_equal(published_estimates(model, -x, negative), workload_estimates(model, -x))


def test_a_workers_tasks_of_one_job_open_the_release_once(inputs, tmp_path, monkeypatch):
    """Chunk tasks of one job on a worker share one release reader (opened and checked by the
    first), whichever of the equal models they were given (a worker holds its own and a copy of
    the other worker's); a task of another job opens its own. What they write is the serial
    estimate's."""
    plan, release = read_plan(inputs["plan"]), read_release(inputs["release"])
    model = measurement_model(plan)
    opened = []
    real = job_module._open_release
    monkeypatch.setattr(job_module, "_open_release", lambda job: opened.append(job) or real(job))
    monkeypatch.setattr(job_module, "_ROWS", [])
    jobs = []
    for name in ("a.zarr", "b.zarr"):
        root = create_estimate(tmp_path / name, plan=plan, plan_path=inputs["plan"], release=release,
                               method=job_module.METHOD, objective=job_module.OBJECTIVE, integer=False,
                               cells=model.cells, query_dtype=np.float64, cell_labels=None, cliques=None,
                               cell_columns=None)
        jobs.append(job_module.EstimateJob(
            estimate_path=str(tmp_path / name), release_path=inputs["release"], release_checksum=release.checksum,
            units=UNITS, chunk_units=CHUNK, integer=False, workload=workload_kind(model),
            tables=stored_tables(root)))
    first, second = jobs
    job_module.estimate_chunks_task(first, model, (0, 1))
    job_module.estimate_chunks_task(first, pickle.loads(pickle.dumps(model)), (2,))  # the other worker's model
    assert opened == [first]
    job_module.estimate_chunks_task(second, model, (0,))
    assert opened == [first, second]
    written = zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["queries/estimates"][:3 * CHUNK]
    reference = zarr.open_group(inputs["estimate"], mode="r")["queries/estimates"][:3 * CHUNK]
    assert np.array_equal(written, reference)


def test_one_chunk_on_a_runs_own_cluster_is_estimated_in_the_driver(small_plan, tmp_path):
    """A release of one chunk of units, on the local cluster a ``distfit run`` started itself (a
    loopback placement of its own): one task, which a cluster cannot share, so the driver fits
    it and never asks the cluster. The address here reaches nothing: reaching for it would fail."""
    from distfit.runtime.security import Transport
    from distfit.stores.data import write_synthetic

    data, release = tmp_path / "data.zarr", tmp_path / "release.zarr"
    write_synthetic(small_plan.spec, 5, data, seed=2, fsync=False)
    run_release(small_plan.plan, data, release, seed=4, placement=Placement(serial=True), fsync=False,
                log=io.StringIO())
    own = Placement(cluster="tcp://127.0.0.1:9", transport=Transport(insecure=True, own=True))
    log = io.StringIO()
    result = run_estimate(small_plan.plan, release, tmp_path / "e.zarr", placement=own, fsync=False, log=log)
    assert "distfit: one chunk of units: estimated in this process, without a cluster\n" in log.getvalue()
    serial = run_estimate(small_plan.plan, release, tmp_path / "s.zarr", placement=Placement(serial=True),
                          fsync=False, log=io.StringIO())
    assert result.checksum == serial.checksum
