"""`distfit release` end to end: plan + histograms -> sealed, resumable release store."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import xarray as xr
import yaml
import zarr
from scipy.stats import chi2

from tests.clitools import assert_one_line_error, run
from tests.holding import held_job, wait_held
from distfit.release import job as releasing
from distfit.release import tasks as release_tasks
from distfit.stores.data import read_histograms, write_synthetic
from distfit.plan.job import run_plan
from distfit.release.job import run_release
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from distfit.stores.sealing import seal_checksum, stated_attrs
from distfit.stores.release import ReleaseError, read_release, verify_release
from distfit.mathematics.domain import Domain
from distfit.runtime.placement import Placement
from distfit.runtime.security import Transport
from tests.reference import SMALL_SPEC
from tests.storetools import reseal, stated_checksum
from tests.storetools import planned

SPEC = SMALL_SPEC
UNITS, CHUNK = 50, 8          # 7 chunks, the last one short
SEED = 987654321              # a --seed that would stand out in any attr


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_plan):
    root = tmp_path_factory.mktemp("release-inputs")
    data = root / "data.zarr"
    write_synthetic(small_plan.spec, UNITS, data, seed=1, chunk_units=CHUNK)
    other = dict(SPEC, queries=[dict(SPEC["queries"][0], target=[2, 2, 2, 3, 3, 3])] + SPEC["queries"][1:])
    other_plan = planned(root, other, "other.yaml", "other.zarr").plan
    return {"plan": small_plan.plan, "data": str(data), "other_plan": other_plan, "root": root,
            "spec": small_plan.spec}


def _release(capsys, inputs, out, *flags):
    return run(capsys, "release", inputs["plan"], "--data", inputs["data"], "--out", str(out), *flags)


def _arrays(path) -> dict[str, np.ndarray]:
    group = zarr.open_group(store=str(path), mode="r")
    return {name: arr[...] for name, arr in group.members(max_depth=None) if isinstance(arr, zarr.Array)}


def _all_attrs_text(path) -> str:
    return "\n".join(p.read_text() for p in Path(path).rglob("zarr.json"))


def _true_answers(counts):
    """SMALL_SPEC's workload W x per unit (units x 24), by sums of the counts (units x 6*2*3,
    row-major age, sex, edu) as the spec defines its groups: age <= v, age x sex, edu <= v
    within each sex (the answers without noise; nothing of the plan or the release code)."""
    cube = np.asarray(counts, dtype=np.float64).reshape(-1, 6, 2, 3)
    return np.hstack([cube.sum(axis=(2, 3)).cumsum(axis=1), cube.sum(axis=3).reshape(-1, 12),
                      cube.sum(axis=1).cumsum(axis=2).reshape(-1, 6)])


def _marginal(plan, counts, attributes):
    """The counts (units x cells, row-major in schema order) summed to ``attributes`` (units x
    their cells, row-major in schema order), by numpy's own sums."""
    names, sizes = plan.attrs["schema"]["attributes"], plan.attrs["schema"]["sizes"]
    cube = np.asarray(counts, dtype=np.float64).reshape(-1, *sizes)
    other = tuple(1 + i for i, name in enumerate(names) if name not in attributes)
    return cube.sum(axis=other).reshape(cube.shape[0], -1)


def _block_noise(plan, counts, release):
    """{block_id: z_b (units x k_b)}: each block's noise, recovered from its stored answers
    ``y_b = (X_b B_b^T + z_b) L_b^T`` (docs/design.md section 4) as the least-squares ``z_b`` of
    ``y_b - X_b B_b^T L_b^T = z_b L_b^T`` (L_b has full column rank: exact). Checks that nothing
    outside the range of L_b is added (the residual is rounding) and that the blocks' noiseless
    rows sum to the spec's W x."""
    truth = np.zeros((counts.shape[0], len(plan.queries_targets)))
    noise = {}
    for block in plan.iter_blocks():
        rows = _marginal(plan, counts, block.attributes) @ block.basis.T @ block.recon.T
        np.add.at(truth.T, block.query_index, rows.T)
        noisy = np.asarray(release.block_answers(block.block_id)[...]) - rows
        z = np.linalg.lstsq(block.recon, noisy.T, rcond=None)[0].T
        np.testing.assert_allclose(z @ block.recon.T, noisy, rtol=0, atol=1e-9 * max(1.0, np.abs(noisy).max()))
        noise[block.block_id] = z
    np.testing.assert_allclose(truth, _true_answers(counts), rtol=0, atol=1e-9 * max(1.0, truth.max()))
    return noise


def _whitened(plan, noise):
    """The block noises whitened by the plan's Sigma_b = F F^T (F: scipy's Cholesky factor, any
    square root will do: the statistics below do not change under a rotation), side by side:
    units x sum_b k_b, iid N(0, I) rows if every block's noise is N(0, Sigma_b), independent."""
    columns = []
    for block_id, z in noise.items():
        factor = scipy.linalg.cholesky(plan.block(block_id).sigma, lower=True)
        columns.append(scipy.linalg.solve_triangular(factor, z.T, lower=True).T)
    return np.hstack(columns)


#: The tail probability at which a statistic of correct noise fails (the seed is fixed, so a
#: test passes or fails every time; this is its false-alarm rate over seeds).
FALSE_ALARM = 1e-6


def _white_noise_failures(w, chunk_units):
    """What of the rows of ``w`` (N x K) is not iid N(0, I_K), by statistics that are chi-square
    under that hypothesis, each refused beyond its 1 - FALSE_ALARM quantile:

    * the mean: ``N |mean|^2 ~ chi2(K)``;
    * the second moments ``S = w^T w / N``: Nagao's ``N/2 tr((S - I)^2) ~ chi2(K(K+1)/2)``
      (asymptotically in N; exact mean K(K+1)/2), which sees any variance, correlation or
      cross-block dependence;
    * independence across chunks (their own noise streams): for every pair of chunks, the
      cross moments ``C = w_c^T w_c' / n`` of their rows side by side, ``n |C|_F^2 ~ chi2(K^2)``,
      summed over the pairs (a stream reused by two chunks gives ``C ~ I``: ``n K`` a pair).
    """
    n_units, k = w.shape
    failures = []

    def check(name, statistic, df):
        limit = chi2.isf(FALSE_ALARM, df)
        if not statistic <= limit:
            failures.append(f"{name}: {statistic:.1f} > {limit:.1f} (chi2, {df} df)")

    check("mean", n_units * np.sum(w.mean(axis=0) ** 2), k)
    s = w.T @ w / n_units
    check("second moments", n_units / 2 * np.sum((s - np.eye(k)) ** 2), k * (k + 1) // 2)
    chunks = [w[i:i + chunk_units] for i in range(0, n_units - chunk_units + 1, chunk_units)]
    pairs = [(a, b) for i, a in enumerate(chunks) for b in chunks[i + 1:]]
    cross = sum(chunk_units * np.sum((a.T @ b / chunk_units) ** 2) for a, b in pairs)
    check("across chunks", cross, len(pairs) * k * k)
    return failures


def test_end_to_end_serial_layout_and_contents(inputs, tmp_path, capsys, monkeypatch):
    entropy = 0x5EC12E7_0DDBA11_C0FFEE_1234567
    monkeypatch.setattr(releasing, "fresh_entropy", lambda: entropy)
    out = tmp_path / "release.zarr"
    code, stdout, err = _release(capsys, inputs, out, "--serial")
    assert code == 0, err
    assert "units/s" in stdout and "sealed" in stdout and "units/s" in err
    rel = read_release(out)
    plan = read_plan(inputs["plan"])
    a = rel.attrs
    assert a["distfit_format"] == "release" and a["format_version"] == 3
    assert a["complete"] is True and a["private"] is True
    assert a["plan_checksum"] == plan.checksum
    assert a["units"] == UNITS and a["chunk_units"] == CHUNK and a["n_chunks"] == 7
    assert a["schema"] == plan.attrs["schema"]
    assert verify_release(out)[0]
    arrays = _arrays(out)
    expected = {f"blocks/{b}/{name}" for b in plan.block_ids for name in ("answers", "block_query")} | {
        "queries/answers", "queries/variances", "queries/query", "unit_ids", "unit", "chunks/done", "chunks/digests"}
    assert set(arrays) == expected  # no counts, marginals or true answers anywhere
    # the xarray coordinates: the unit ids again, the query labels, each block row's query label
    np.testing.assert_array_equal(arrays["unit"], arrays["unit_ids"])
    assert arrays["queries/query"].tolist() == rel.labels
    for block in plan.iter_blocks():
        assert arrays[f"blocks/{block.block_id}/block_query"].tolist() == [rel.labels[j] for j in block.query_index]
    m = len(plan.queries_targets)
    assert arrays["queries/answers"].shape == (UNITS, m)
    assert zarr.open_array(str(out / "queries/answers"), mode="r").chunks == (CHUNK, m)
    np.testing.assert_array_equal(arrays["queries/variances"], plan.queries_variances)
    np.testing.assert_array_equal(arrays["chunks/done"], np.ones(7, np.uint8))
    data = read_histograms(inputs["data"])
    np.testing.assert_array_equal(arrays["unit_ids"], data.unit_ids[...])
    assert rel.labels is not None and len(rel.labels) == m and rel.labels[0].startswith("age:")
    # each query's answer is the sum of its block rows
    total = np.zeros((UNITS, m))
    for block in plan.iter_blocks():
        np.add.at(total.T, block.query_index, arrays[f"blocks/{block.block_id}/answers"].T)
    np.testing.assert_allclose(arrays["queries/answers"], total, rtol=0, atol=1e-9)
    # noise present and not the true answers; entropy and counts never stored
    truth = _true_answers(np.asarray(data.counts[...]))
    assert not np.allclose(arrays["queries/answers"], truth)
    text = _all_attrs_text(out)
    for secret in (str(entropy), hex(entropy), hex(entropy)[2:]):
        assert secret not in text
    for name in ("counts", "total_people", "entropy", "seed"):
        assert name not in text


MANY_UNITS, MANY_CHUNK = 4000, 500


@pytest.fixture(scope="module")
def many(tmp_path_factory, inputs):
    """SMALL_SPEC's plan released (seed 3) for 4000 units in 8 chunks: the Monte Carlo sample."""
    root = tmp_path_factory.mktemp("many")
    write_synthetic(inputs["spec"], MANY_UNITS, root / "data.zarr", seed=4, chunk_units=MANY_CHUNK, fsync=False)
    run_release(inputs["plan"], str(root / "data.zarr"), root / "r.zarr", seed=3, placement=Placement(serial=True),
                fsync=False)
    counts = np.asarray(read_histograms(str(root / "data.zarr")).counts[...])
    return {"counts": counts, "release": read_release(root / "r.zarr"), "plan": read_plan(inputs["plan"])}


def test_released_noise_is_the_plans_gaussian(many):
    """Every block's noise, recovered from the stored answers and whitened by the plan's
    Sigma_b, is white: mean 0, covariance I within and across blocks, independent across
    chunks, by chi-square statistics at a false-alarm rate of 1e-6 (:func:`_white_noise_failures`).
    Nothing of the release's draw is re-derived: only the plan's matrices and the stored answers.
    Power at 4000 units and K = 16: a noise scaled by 1.05 gives Nagao's statistic ~ N K (0.1)^2/2
    = 320 (limit ~ 230); the Cholesky factor used transposed or a stream shared by the chunks
    fail by far; a stream shared by blocks of different widths is not seen by moments (its
    values pair up differently), only by their coinciding first draws, checked last."""
    plan, release = many["plan"], many["release"]
    w = _whitened(plan, _block_noise(plan, many["counts"], release))
    assert w.shape == (MANY_UNITS, sum(plan.block(b).sigma.shape[0] for b in plan.block_ids))
    assert release.attrs["chunk_units"] == MANY_CHUNK
    assert _white_noise_failures(w, MANY_CHUNK) == []
    # a stream of its own for every (block, chunk): two that shared one would share their
    # first draws (whitened by the unique lower Cholesky factor, the first row of a block's
    # noise in a chunk is its draws to rounding), while independent draws never coincide
    # (128 values: probability ~1e-5 of two within 1e-9)
    widths = np.cumsum([0] + [plan.block(b).sigma.shape[0] for b in plan.block_ids])
    first_draws = np.sort(np.concatenate([w[row, widths[i]:widths[i + 1]]
                                          for row in range(0, MANY_UNITS, MANY_CHUNK) for i in range(len(widths) - 1)]))
    assert first_draws.size == MANY_UNITS // MANY_CHUNK * widths[-1] and np.diff(first_draws).min() > 1e-9


def test_seeded_noise_has_the_plan_variances(many):
    """The released noise, divided by the square root of each query's planned variance, has mean
    0 and mean square 1, each to within 5 standard errors derived under that hypothesis.

    A unit's query noise is N(0, C), C = sum over blocks of L_b Sigma_b L_b^T (scattered to the
    queries; its diagonal is the plan's variances), so its m z-scores are correlated (R = C
    scaled to unit diagonal) and only the units are independent. For n independent N(0, 1)
    draws Var(s^2) ~= 2/n; for m correlated z-scores of n units the pooled mean square has
    variance 2 tr(R^2) / (m^2 n) (2 / (m n) if R = I) and the pooled mean sum(R) / (m^2 n)
    (SMALL_SPEC: m^2 / tr(R^2) = 9.8, not m = 24, effective draws per unit). Why 5: a correct
    release fails with probability ~6e-7 (the normal tail of an average of 96,000 terms), so no
    seed is lucky or unlucky; 4000 units make 5 standard errors 0.036 for the mean square, so a
    variance off by 4% fails.
    """
    units, plan = MANY_UNITS, many["plan"]
    noise = many["release"].answers[...] - _true_answers(many["counts"])
    m = len(plan.queries_targets)
    covariance = np.zeros((m, m))
    for block in plan.iter_blocks():
        rows = np.zeros((m, block.recon.shape[0]))
        rows[block.query_index, np.arange(block.recon.shape[0])] = 1.0  # block row -> its query
        to_queries = rows @ block.recon
        covariance += to_queries @ block.sigma @ to_queries.T
    np.testing.assert_allclose(np.diag(covariance), plan.queries_variances, rtol=1e-9)
    correlation = covariance / np.sqrt(np.outer(np.diag(covariance), np.diag(covariance)))
    z = noise / np.sqrt(plan.queries_variances)
    assert z.shape == (units, m)
    se_mean_square = np.sqrt(2 * np.sum(correlation ** 2) / (m * m * units))  # tr(R^2) = sum R_jk^2
    se_mean = np.sqrt(correlation.sum() / (m * m * units))
    assert abs(np.mean(z ** 2) - 1) < 5 * se_mean_square, (np.mean(z ** 2), se_mean_square)
    assert abs(np.mean(z)) < 5 * se_mean, (np.mean(z), se_mean)


def test_same_seed_identical_different_seed_differs(inputs, tmp_path, capsys):
    outs = [tmp_path / f"r{i}.zarr" for i in range(3)]
    for out, seed in zip(outs, (SEED, SEED, SEED + 1)):
        code, stdout, err = _release(capsys, inputs, out, "--serial", "--seed", str(seed))
        assert code == 0, err
        assert "NOT PRIVATE" in stdout
    a, b, c = (_arrays(o) for o in outs)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert (a["queries/answers"] != c["queries/answers"]).all()  # fresh noise in every answer
    rels = [read_release(o) for o in outs]
    assert rels[0].checksum == rels[1].checksum != rels[2].checksum
    assert all(r.private is False for r in rels)
    assert str(SEED) not in _all_attrs_text(outs[0])


def test_the_noise_does_not_depend_on_the_data(inputs, tmp_path):
    """One seed, two data sets of the same units and chunks: the releases differ by exactly the
    difference of the true answers (to rounding), so the noise drawn is the same, whatever the
    counts (it depends on the seed, the block and the chunk only)."""
    other = tmp_path / "other-data.zarr"
    write_synthetic(inputs["spec"], UNITS, other, seed=99, chunk_units=CHUNK, fsync=False)
    noises = []
    for i, data in enumerate((inputs["data"], str(other))):
        out = tmp_path / f"release-{i}.zarr"
        run_release(inputs["plan"], data, out, seed=SEED, placement=Placement(serial=True), fsync=False)
        counts = np.asarray(read_histograms(data).counts[...])
        noises.append((read_release(out).answers[...] - _true_answers(counts), counts))
    (first, counts_a), (second, counts_b) = noises
    assert not np.array_equal(counts_a, counts_b)
    np.testing.assert_allclose(first, second, rtol=0, atol=1e-9 * np.abs(_true_answers(counts_a)).max())


class Interrupt(Exception):
    pass


def _interrupt_after(k):
    seen = []

    def hook(chunk):
        seen.append(chunk)
        if len(seen) == k:
            raise Interrupt(f"stopped after {k} chunks")
    return hook


def _chunk_files(path, done_chunks):
    """Bytes of every zarr chunk file of the given release chunks (CHUNK rows per chunk)."""
    files = {}
    for arr_dir in [p.parent for p in Path(path).rglob("zarr.json") if (p.parent / "c").is_dir()]:
        rel = arr_dir.relative_to(path).as_posix()
        if rel == "chunks/done" or rel.startswith("queries/variances"):
            continue
        for c in done_chunks:
            for f in (arr_dir / "c" / str(c)).rglob("*") if (arr_dir / "c" / str(c)).is_dir() else [arr_dir / "c" / str(c)]:
                if f.is_file():
                    files[f.relative_to(path).as_posix()] = f.read_bytes()
    return files


def test_resume_seeded_equals_uninterrupted(inputs, tmp_path, capsys):
    out, full = tmp_path / "r.zarr", tmp_path / "full.zarr"
    with pytest.raises(Interrupt):
        run_release(inputs["plan"], inputs["data"], out, seed=SEED, placement=Placement(serial=True),
                    after_chunk=_interrupt_after(3))
    capsys.readouterr()
    assert json.loads((out / "zarr.json").read_text())["attributes"]["complete"] is False
    with pytest.raises(ReleaseError, match="incomplete"):
        read_release(out)
    code, _, err = _release(capsys, inputs, out, "--serial", "--seed", str(SEED))
    assert code == 2
    assert_one_line_error(err, "incomplete release", "--resume")
    done = np.flatnonzero(zarr.open_array(str(out / "chunks/done"), mode="r")[...]).tolist()
    assert done == [0, 1, 2]
    before = _chunk_files(out, done)
    assert len(before) >= 3 * 4
    # a chunk half written when the run died: garbage in one block, not marked done
    block0 = sorted(read_plan(inputs["plan"]).block_ids)[0]
    zarr.open_array(str(out / f"blocks/{block0}/answers"), mode="r+")[5 * CHUNK:6 * CHUNK] = 1e9
    code, stdout, err = _release(capsys, inputs, out, "--serial", "--seed", str(SEED), "--resume")
    assert code == 0, err
    assert "resumed" in stdout and "4 drawn now" in stdout
    assert _chunk_files(out, done) == before  # written chunks untouched, bit for bit
    run_release(inputs["plan"], inputs["data"], full, seed=SEED, placement=Placement(serial=True))
    a, b = _arrays(out), _arrays(full)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert read_release(out).checksum == read_release(full).checksum
    assert verify_release(out)[0]


def test_resume_private_keeps_written_chunks(inputs, tmp_path, capsys):
    out = tmp_path / "r.zarr"
    with pytest.raises(Interrupt):
        run_release(inputs["plan"], inputs["data"], out, placement=Placement(serial=True),
                    after_chunk=_interrupt_after(2))
    capsys.readouterr()
    copy = tmp_path / "copy.zarr"
    shutil.copytree(out, copy)
    # a private release cannot be resumed with --seed (nor a seeded one without)
    code, _, err = _release(capsys, inputs, out, "--serial", "--seed", "1", "--resume")
    assert code == 2
    assert_one_line_error(err, "without --seed")
    code, _, err = _release(capsys, inputs, out, "--serial", "--resume")
    assert code == 0, err
    a, b = _arrays(copy), _arrays(out)
    rows = slice(0, 2 * CHUNK)
    for name in a:
        if a[name].ndim and a[name].shape[0] == UNITS:
            assert a[name][rows].tobytes() == b[name][rows].tobytes(), name
    assert _chunk_files(copy, [0, 1]) == _chunk_files(out, [0, 1])
    assert read_release(out).private is True


def test_local_cluster_equals_serial(inputs, tmp_path, capsys):
    serial, dask = tmp_path / "serial.zarr", tmp_path / "dask.zarr"
    assert _release(capsys, inputs, serial, "--serial", "--seed", str(SEED))[0] == 0
    code, stdout, err = _release(capsys, inputs, dask, "--workers", "2", "--seed", str(SEED))
    assert code == 0, err
    assert "local cluster with 2 worker processes" in err
    a, b = _arrays(serial), _arrays(dask)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert read_release(serial).checksum == read_release(dask).checksum


def _not_sealed(path) -> bool:
    p = Path(path)
    if not p.exists():
        return True
    return json.loads((p / "zarr.json").read_text())["attributes"].get("complete") is not True


def test_bad_inputs_exit_2_and_seal_nothing(inputs, tmp_path, capsys):
    root = tmp_path
    # data with another schema
    other = root / "other-data.zarr"
    write_synthetic(Domain(("age", "sex", "edu"), (6, 2, 4)), 10, other, seed=2, chunk_units=5)
    out = root / "a.zarr"
    code, _, err = run(capsys, "release", inputs["plan"], "--data", str(other), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, "schema")
    assert not out.exists()
    # negative counts: refused by the chunk's task; the release stays incomplete, unsealed
    bad = root / "bad-data.zarr"
    shutil.copytree(inputs["data"], bad)
    zarr.open_array(str(bad / "counts"), mode="r+")[3, 2] = -1  # chunk 0: fails before any progress
    reseal(bad)  # sealed with its bad counts (another tool's store): the checksum cannot catch them
    code, _, err = run(capsys, "release", inputs["plan"], "--data", str(bad), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, "negative", "chunk 0", "row 3")
    assert out.exists() and _not_sealed(out)
    with pytest.raises(ReleaseError):
        read_release(out)
    # ... an incomplete release without --resume
    code, _, err = _release(capsys, inputs, out, "--serial")
    assert code == 2
    assert_one_line_error(err, "--resume", "--overwrite")
    # ... --resume with a different plan
    code, _, err = run(capsys, "release", inputs["other_plan"], "--data", str(bad), "--out", str(out),
                       "--serial", "--resume")
    assert code == 2
    assert_one_line_error(err, "checksum")
    assert _not_sealed(out)
    # --resume and --overwrite together
    code, _, err = _release(capsys, inputs, out, "--serial", "--resume", "--overwrite")
    assert code == 2
    assert_one_line_error(err, "exclude")
    # a plan that fails audit (less noise than it claims)
    plan = root / "tampered.zarr"
    shutil.copytree(inputs["plan"], plan)
    block_id = read_plan(str(plan)).block_ids[0]
    sigma = zarr.open_array(str(plan / f"blocks/{block_id}/sigma"), mode="r+")
    sigma[0, 0] = sigma[0, 0] * 0.5
    fresh = root / "b.zarr"
    code, _, err = run(capsys, "release", str(plan), "--data", inputs["data"], "--out", str(fresh), "--serial")
    assert code == 2
    assert_one_line_error(err, "fails audit", "checksum", "profile")
    assert not fresh.exists()
    # a sealed release is not replaced without --overwrite; with it, it is (new noise)
    sealed = root / "c.zarr"
    assert _release(capsys, inputs, sealed, "--serial")[0] == 0
    checksum = read_release(sealed).checksum
    code, _, err = _release(capsys, inputs, sealed, "--serial")
    assert code == 2
    assert_one_line_error(err, "sealed release", "--overwrite")
    code, _, err = _release(capsys, inputs, sealed, "--serial", "--resume")
    assert code == 2
    assert read_release(sealed).checksum == checksum
    code, _, err = _release(capsys, inputs, sealed, "--serial", "--overwrite")
    assert code == 0, err
    assert read_release(sealed).checksum != checksum
    assert sorted(p.name for p in root.glob("c.zarr*")) == ["c.zarr"]
    # a failed --overwrite leaves the old release as it was and no staging directory
    checksum = read_release(sealed).checksum
    code, _, err = run(capsys, "release", inputs["plan"], "--data", str(bad), "--out", str(sealed),
                       "--serial", "--overwrite")
    assert code == 2
    assert read_release(sealed).checksum == checksum
    assert sorted(p.name for p in root.glob("c.zarr*")) == ["c.zarr"]
    # --overwrite finishes the incomplete one too
    code, _, err = _release(capsys, inputs, out, "--serial", "--overwrite")
    assert code == 0, err
    assert read_release(out).attrs["complete"] is True
    # not a release store at --out
    junk = root / "junk"
    junk.mkdir()
    code, _, err = _release(capsys, inputs, junk, "--serial", "--overwrite")
    assert code == 2
    assert_one_line_error(err, "not a distfit release store")


def test_driver_killed_mid_release_then_resumed(inputs, tmp_path, capsys):
    """SIGKILL the `distfit release` process once some chunks are done; --resume seals a release in
    which every chunk was written once (with a test seed it equals an uninterrupted release).
    The release holds after its second chunk (tests.holding) and is killed there."""
    import os
    import signal

    seed = "11"
    out = tmp_path / "killed.zarr"
    script = (
        "from distfit.release import job as releasing\n"
        "from distfit.runtime.placement import Placement\n"
        f"releasing.run_release({inputs['plan']!r}, {inputs['data']!r}, {str(out)!r}, seed={seed},\n"
        "                      placement=Placement(serial=True), after_chunk=hold_after(2))\n"
    )
    with held_job(script) as process:
        wait_held(process)
        done = zarr.open_group(store=str(out), mode="r")["chunks/done"][...]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert done.sum() == 2 < done.size, "the release was not caught half-way"
    with pytest.raises(ReleaseError):
        read_release(str(out))
    before = _arrays(out)
    finished = np.flatnonzero(zarr.open_group(store=str(out), mode="r")["chunks/done"][...])
    code, _, err = _release(capsys, inputs, out, "--resume", "--seed", seed, "--serial")
    assert code == 0, err
    assert verify_release(str(out))[0]
    after = _arrays(out)
    rows = np.concatenate([np.arange(c * CHUNK, min((c + 1) * CHUNK, UNITS)) for c in finished])
    np.testing.assert_array_equal(after["queries/answers"][rows], before["queries/answers"][rows])
    reference = tmp_path / "reference.zarr"
    code, _, err = _release(capsys, inputs, reference, "--seed", seed, "--serial")
    assert code == 0, err
    np.testing.assert_array_equal(_arrays(reference)["queries/answers"], after["queries/answers"])


def test_worker_killed_mid_release_redraws_identical_chunks(inputs, tmp_path, capsys):
    """A worker SIGKILLed after the first chunk lands: its chunks are retried elsewhere with the
    same (block, chunk) streams, so the sealed release equals a serial one with the same seed."""
    import os
    import signal

    from distfit.runtime.cluster import dask_client

    data = tmp_path / "many.zarr"
    write_synthetic(inputs["spec"], 1200, data, seed=3, chunk_units=20)
    killed = []
    with dask_client(None, workers=2) as client:
        pids = list(client.run(os.getpid).values())

        def kill_once(chunk):
            if not killed:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(chunk)

        result = run_release(inputs["plan"], str(data), str(tmp_path / "dask.zarr"), seed=5,
                             placement=Placement(cluster=client.scheduler.address, transport=Transport(insecure=True)),
                             after_chunk=kill_once)
    assert killed and result.chunks == 60
    serial = run_release(inputs["plan"], str(data), str(tmp_path / "serial.zarr"), seed=5,
                         placement=Placement(serial=True))
    assert serial.checksum == result.checksum


def test_background_client_reports_an_unreachable_scheduler():
    from distfit.runtime.cluster import BackgroundClient
    from distfit.runtime.failures import ClusterError

    with BackgroundClient("tcp://127.0.0.1:1", timeout=1, transport=Transport(insecure=True)) as background:
        with pytest.raises(ClusterError, match="cannot reach the scheduler"):
            background.get()
        with pytest.raises(ClusterError):  # asked again: the same answer
            background.get()


def test_unreachable_cluster_writes_nothing(inputs, tmp_path, monkeypatch):
    import functools

    import distfit.runtime.cluster as cluster_module
    from distfit.runtime.cluster import BackgroundClient
    from distfit.runtime.failures import ClusterError

    # the release's client (PlacedClient) starts a BackgroundClient of runtime.cluster
    monkeypatch.setattr(cluster_module, "BackgroundClient", functools.partial(BackgroundClient, timeout=1))
    out = tmp_path / "nowhere.zarr"
    with pytest.raises(ClusterError):
        run_release(inputs["plan"], inputs["data"], out,
                    placement=Placement(cluster="tcp://127.0.0.1:1", transport=Transport(insecure=True)))
    assert not out.exists() and not list(tmp_path.glob("nowhere.zarr*"))


def test_local_cluster_is_gone_when_run_release_returns_or_raises(inputs, tmp_path):
    """The cluster starts while the driver audits and shuts down while it seals; either way no
    worker process outlives run_release, also when the audit refuses the plan."""
    import multiprocessing

    result = run_release(inputs["plan"], inputs["data"], tmp_path / "a.zarr", seed=SEED, placement=Placement(workers=1))
    assert verify_release(result.path)[0]
    assert multiprocessing.active_children() == []
    plan = tmp_path / "tampered.zarr"
    shutil.copytree(inputs["plan"], plan)
    block_id = read_plan(str(plan)).block_ids[0]
    sigma = zarr.open_array(str(plan / f"blocks/{block_id}/sigma"), mode="r+")
    sigma[0, 0] = sigma[0, 0] * 0.5
    with pytest.raises(ValueError, match="fails audit"):
        run_release(str(plan), inputs["data"], tmp_path / "b.zarr", placement=Placement(workers=1))
    assert not (tmp_path / "b.zarr").exists()
    assert multiprocessing.active_children() == []


def test_background_client_worker_env(monkeypatch):
    """worker_env sets (a string) or leaves out (None) variables in a local cluster's worker
    processes before they start; the release uses it to leave out Dask's malloc trim setting."""
    import os

    from distfit.runtime.cluster import WORKER_ENV, BackgroundClient  # WORKER_ENV: PlacedClient's default

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # an earlier cluster may have set it here
    env = dict(WORKER_ENV, DISTFIT_TEST_WORKER_ENV="on")
    with BackgroundClient(None, workers=1, worker_env=env) as background:
        seen = list(background.get().run(
            lambda: (os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("DISTFIT_TEST_WORKER_ENV"))).values())
    assert seen == [(None, "on")]


def _count_checksums(monkeypatch) -> list[str]:
    """Replace compute_checksum, wherever a distfit module bound it, by a counter that records
    the name of each store it hashes (a plan's staging directory, the plan, the release)."""
    import sys

    import distfit.stores.checksum as checksums

    real = checksums.compute_checksum
    hashed: list[str] = []

    def counting(group, **kwargs):
        hashed.append(Path(str(group.store.root)).name)
        return real(group, **kwargs)

    modules = [m for name, m in sys.modules.items()
               if name.startswith("distfit") and getattr(m, "compute_checksum", None) is real]
    # every seal and verification goes through the one sealing path (stores.sealing); the
    # release's hasher digests its chunks as they land (stores.release_chunks)
    assert {"distfit.stores.sealing", "distfit.stores.release_chunks"} == {m.__name__ for m in modules} - {
        "distfit.stores.checksum"}
    for module in modules:
        monkeypatch.setattr(module, "compute_checksum", counting)
    return hashed


def test_a_run_audits_and_hashes_the_plan_once(tmp_path, monkeypatch):
    """distfit run: the plan is hashed by its writer, once by the audit (the release is given the
    audit's report: no second audit) and once more by the seal (it re-verifies the plan against
    the audited checksum: documented, it catches a plan altered during the release); the
    release store once, by the seal, and its root (attrs, small arrays, chunk digests: not the
    answers, which the digests stand for) once more by the run's report, which checks each
    chunk it reads against those digests."""
    import distfit.pipeline.run
    from distfit.audit.plan import audit_plan

    audits = []

    def counting_audit(path, **options):
        audits.append(path)
        return audit_plan(path, **options)

    monkeypatch.setattr(distfit.pipeline.run, "audit_plan", counting_audit)
    monkeypatch.setattr(releasing, "audit_plan", counting_audit)
    hashed = _count_checksums(monkeypatch)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    result = distfit.pipeline.run.run_pipeline(str(spec_path), tmp_path / "run", units=20,
                                               placement=Placement(serial=True), fsync=False,
                                           estimate=False)  # the estimate stage checks the plan itself
    assert len(audits) == 1
    # the writers' seals, staged: the plan's first, and the synthetic data's (which the release,
    # told its checksum by the run, does not hash again; nor does the run's report)
    staged = [name.split(".incomplete-")[0] for name in hashed if ".incomplete-" in name]
    assert hashed[0].startswith("plan.zarr.incomplete-") and staged == ["plan.zarr", "data.zarr"]
    # audit, seal (plan), and the release once: hashed while its chunks are written
    # (stores.release_chunks.ReleaseHasher), so its place among the plan's hashes depends on timing;
    # then its root by the report (stores.sealing.SealedKind.read_sealed)
    assert sorted(name for name in hashed if ".incomplete-" not in name) == [
        "plan.zarr", "plan.zarr", "release.zarr", "release.zarr"]
    assert hashed[-1] == "release.zarr"
    assert result.stages["audit"] == "passed" and result.stages["release"] == "done"


def test_release_audits_once_or_takes_the_callers_audit(inputs, tmp_path, monkeypatch):
    """Standalone, run_release verifies the data once, audits the plan once (one hash) and the seal re-verifies it (one
    more); given a passing audit report it does not audit, only checks the plan still holds the
    audited checksum (the stored attr, no hash)."""
    import dataclasses

    from distfit.audit.plan import audit_plan

    report = audit_plan(inputs["plan"])
    hashed = _count_checksums(monkeypatch)
    monkeypatch.setattr(release_tasks, "_DATA", [])  # no data root checked by an earlier test's tasks
    run_release(inputs["plan"], inputs["data"], tmp_path / "a.zarr", seed=SEED, placement=Placement(serial=True),
                fsync=False)
    # audit, seal (plan), the release, and the data's root: by the driver before anything is laid
    # out, and once by the tasks of this (serial: the only) worker process (release.tasks.open_job_data)
    assert sorted(hashed) == ["a.zarr", "data.zarr", "data.zarr", "plan.zarr", "plan.zarr"]
    hashed.clear()
    given = run_release(inputs["plan"], inputs["data"], tmp_path / "b.zarr", seed=SEED,
                        placement=Placement(serial=True), fsync=False, audit=report)
    assert sorted(hashed) == ["b.zarr", "data.zarr", "plan.zarr"]  # the seal, the data (its tasks' check kept)
    assert given.checksum == read_release(tmp_path / "a.zarr").checksum
    stale = dataclasses.replace(report, checksum="sha256:" + "0" * 64)
    with pytest.raises(ValueError, match="the plan changed since its audit"):
        run_release(inputs["plan"], inputs["data"], tmp_path / "c.zarr", seed=SEED, placement=Placement(serial=True),
                    audit=stale)
    failed = dataclasses.replace(report, failures=("alpha: made up",))
    with pytest.raises(ValueError, match=r"fails audit \(1 failures\): alpha: made up"):
        run_release(inputs["plan"], inputs["data"], tmp_path / "c.zarr", seed=SEED, placement=Placement(serial=True),
                    audit=failed)
    with pytest.raises(ValueError, match="a report of .*, not of the plan"):
        run_release(inputs["other_plan"], inputs["data"], tmp_path / "c.zarr", seed=SEED,
                    placement=Placement(serial=True), audit=report)
    assert not (tmp_path / "c.zarr").exists()


# --------------------------------------------------------------------------------------------
# issue 16: the same bits, each answer stored once, tasks of several chunks


@pytest.fixture(scope="module")
def one_block(tmp_path_factory):
    """SMALL_SPEC merged into a single block (like PL94): every query is one row of it."""
    root = tmp_path_factory.mktemp("one-block")
    spec_path = root / "one.yaml"
    spec_path.write_text(yaml.safe_dump(dict(SPEC, blocks={"max_cells": 36})))
    plan = root / "plan.zarr"
    run_plan(load_spec(spec_path), str(plan), placement=Placement(serial=True))
    assert len(read_plan(str(plan)).block_ids) == 1
    data = root / "data.zarr"
    write_synthetic(load_spec(spec_path), UNITS, data, seed=2, chunk_units=CHUNK)
    return {"plan": str(plan), "data": str(data)}


def test_a_single_block_release_stores_each_answer_once(inputs, one_block, tmp_path):
    """A single-block plan (like PL94): its block's answers are the query answers, stored once
    (no blocks/<id>/answers; the query index and the attr say where they are), read back as a
    view indexed like the array; they are L (B x + z) (nothing outside the range of L added, the
    noiseless part the spec's W x); a multi-block plan keeps every block's answers, and the
    queries are their sums."""
    for name, where in (("multi", inputs), ("single", one_block)):
        out = tmp_path / f"{name}.zarr"
        run_release(where["plan"], where["data"], out, seed=SEED, placement=Placement(serial=True), fsync=False)
        plan = read_plan(where["plan"])
        counts = np.asarray(read_histograms(where["data"]).counts[...])
        rel = read_release(out)
        assert verify_release(out)[0]
        _block_noise(plan, counts, rel)  # every block: L (B x + z), summing to W x
        answers = np.asarray(rel.answers[...])
        summed = np.zeros_like(answers)
        for block_id in plan.block_ids:
            np.add.at(summed.T, plan.block(block_id).query_index, np.asarray(rel.block_answers(block_id)[...]).T)
        np.testing.assert_allclose(summed, answers, rtol=0, atol=1e-9 * np.abs(answers).max())
        arrays = _arrays(out)
        if name == "multi":  # no block is derived: the layout (and checksum) as always
            assert not any(k.endswith("/query_index") for k in arrays)
            assert all(f"blocks/{b}/answers" in arrays for b in plan.block_ids)
            continue
        (block_id,) = plan.block_ids
        block = plan.block(block_id)
        # stored once: no blocks/<id>/answers; the query index and the attr say where they are
        assert f"blocks/{block_id}/answers" not in arrays
        np.testing.assert_array_equal(arrays[f"blocks/{block_id}/query_index"], block.query_index)
        group = zarr.open_group(str(out / "blocks" / block_id), mode="r")
        assert group.attrs["answers_in"] == "queries/answers"
        view = rel.block_answers(block_id)
        assert view.shape == (UNITS, block.recon.shape[0]) and view.dtype == np.float64 and len(view) == UNITS
        full = np.asarray(view[...])
        assert full.shape == (UNITS, block.recon.shape[0]) and block.recon.shape[0] == len(set(block.query_index))
        np.testing.assert_array_equal(full, answers[:, block.query_index])  # every query is one row
        np.testing.assert_array_equal(view[3:20], full[3:20])
        np.testing.assert_array_equal(view[7], full[7])
        np.testing.assert_array_equal(view[-1], full[-1])
        np.testing.assert_array_equal(view[2:9, 5], full[2:9, 5])
        np.testing.assert_array_equal(view[4, 1:3], full[4, 1:3])
        # xarray: the block's answers are the query answers at its query_index
        tree = xr.open_datatree(out, engine="zarr", consolidated=False)
        node = tree[f"blocks/{block_id}"].dataset
        assert node["query_index"].dims == ("block_query",) and "answers" not in node
        np.testing.assert_array_equal(tree["queries"]["answers"].isel(query=node["query_index"].values).values, full)


def test_single_block_release_on_a_cluster_resumes_and_writes_half_the_bytes(one_block, tmp_path, capsys):
    """Dask (tasks of several chunks) equals serial bit for bit; an interrupted single-block
    release resumes to the same store; its files hold each answer once."""
    serial, dask, resumed = tmp_path / "serial.zarr", tmp_path / "dask.zarr", tmp_path / "resumed.zarr"
    run_release(one_block["plan"], one_block["data"], serial, seed=SEED, placement=Placement(serial=True))
    run_release(one_block["plan"], one_block["data"], dask, seed=SEED, placement=Placement(workers=2))
    with pytest.raises(Interrupt):
        run_release(one_block["plan"], one_block["data"], resumed, seed=SEED, placement=Placement(serial=True),
                    after_chunk=_interrupt_after(3))
    run_release(one_block["plan"], one_block["data"], resumed, seed=SEED, placement=Placement(serial=True), resume=True)
    a = _arrays(serial)
    for other in (dask, resumed):
        b = _arrays(other)
        assert set(a) == set(b)
        for name in a:
            assert a[name].tobytes() == b[name].tobytes(), (other.name, name)
        assert read_release(other).checksum == read_release(serial).checksum
    m = len(read_plan(one_block["plan"]).queries_targets)

    def chunk_bytes(path):
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != "zarr.json")

    # what the chunks write: 7 whole chunks (the last one padded) of each answer once (float64),
    # of both id arrays (uncompressed int64) and one byte per done marker; no block answers
    assert chunk_bytes(serial / "queries" / "answers") == 7 * CHUNK * m * 8
    assert [chunk_bytes(serial / name) for name in ("unit_ids", "unit", "chunks/done")] == [7 * CHUNK * 8] * 2 + [7]
    assert not list(serial.glob("blocks/*/answers"))


def test_a_release_laid_out_before_resumes_in_its_layout(one_block, tmp_path):
    """A single-block release laid out before derived blocks (block answers stored as well,
    zstd ids and done markers) is finished in that layout: the chunks write what the store
    holds, and it seals to the checksum of the same release made whole in that layout."""
    new = tmp_path / "new.zarr"
    run_release(one_block["plan"], one_block["data"], new, seed=SEED, placement=Placement(serial=True), fsync=False)
    old = tmp_path / "old.zarr"
    shutil.copytree(new, old)
    group = zarr.open_group(str(old), mode="r+")
    (block_id,) = read_plan(one_block["plan"]).block_ids
    queries = group["queries/answers"][...]
    qi = group[f"blocks/{block_id}/query_index"][...]
    block = group[f"blocks/{block_id}"]
    del block["query_index"]
    block.attrs.update({"answers_in": None})
    answers = block.create_array("answers", shape=(UNITS, qi.size), dtype=np.float64, chunks=(CHUNK, qi.size),
                                 compressors=None, dimension_names=("unit", "block_query"))
    answers[...] = queries[:, qi]
    for name in ("unit_ids", "unit", "chunks/done"):
        values = group[name][...]
        parent, leaf = (group, name) if "/" not in name else (group[name.split("/")[0]], name.split("/")[1])
        del parent[leaf]
        arr = parent.create_array(leaf, shape=values.shape, dtype=values.dtype,
                                  chunks=(CHUNK,) if name != "chunks/done" else (1,),
                                  dimension_names=("unit",) if name != "chunks/done" else ("chunk",))
        arr[...] = values
        assert arr.compressors  # zstd, as before
    group.attrs["checksum"] = seal_checksum(group, dict(group.attrs), stated_attrs)
    whole = _arrays(old)
    assert verify_release(old)[0]
    # interrupt it: two chunks not done, garbage in them
    group.attrs["complete"] = False
    group["chunks/done"][2] = 0
    group["chunks/done"][5] = 0
    answers[2 * CHUNK:3 * CHUNK] = 1e9
    group["queries/answers"][5 * CHUNK:6 * CHUNK] = -1.0
    run_release(one_block["plan"], one_block["data"], old, seed=SEED, placement=Placement(serial=True), resume=True,
                fsync=False)
    after = _arrays(old)
    assert set(after) == set(whole)
    for name in whole:
        assert after[name].tobytes() == whole[name].tobytes(), name
    assert verify_release(old)[0] and read_release(old).checksum == stated_checksum(old)
    np.testing.assert_array_equal(read_release(old).block_answers(block_id)[...], read_release(new).block_answers(block_id)[...])
