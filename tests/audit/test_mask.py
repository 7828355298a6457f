"""The audit of a mask store (distfit.audit.mask): its own setting-B delta against the mask's
(another special-function route, another quadrature) and mpmath; sealed stores whose account
lies (sigma a little too small, setting B claimed for two columns) fail, a true one passes, and a
store edited after its seal fails its checksum."""
from __future__ import annotations

import io
import json
import math

import mpmath
import numpy as np
import pytest

import distfit.mask.job as mask_job
from distfit.audit.mask import audit_mask, log_chi_ratio, masked_delta
from distfit.mask import orbit
from distfit.mask.job import run_mask
from distfit.runtime.placement import Placement


@pytest.mark.parametrize("k,lam,z", [(1, 3.0, 2.5), (2, 0.5, 0.01), (3, 40.0, 60.0), (999, 30.0, 1100.0),
                                     (65535, 84.0, 65000.0)])
def test_the_density_ratio_by_the_sphere_matches_mpmath(k, lam, z):
    """chi'^2_k(lam) / chi^2_k at z = e^(-lam/2) 0F1(; k/2; lam z / 4) (mpmath, 40 digits)."""
    with mpmath.workdps(40):
        reference = float(-lam / 2 + mpmath.log(mpmath.hyp0f1(mpmath.mpf(k) / 2, lam * z / 4)))
    assert log_chi_ratio(k, lam, z) == pytest.approx(reference, rel=1e-11, abs=1e-11)


@pytest.mark.parametrize("epsilon,sigma,sizes", [(1.0, 6.14, [2]), (0.5, 1.2, [8, 9]), (1.0, 0.66, [1000]),
                                                 (1.0, 0.218, [65536]), (2.0, 0.5, [300, 301])])
def test_the_audit_and_the_mask_compute_the_same_delta(epsilon, sigma, sizes):
    assert masked_delta(epsilon, sigma, sizes) == pytest.approx(orbit.masked_delta(epsilon, sigma, sizes), rel=1e-8)


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("audit-mask") / "d.csv"
    values = rng.uniform(0, 10, (120, 2))
    path.write_text("a,b\n" + "".join(f"{float(a)!r},{float(b)!r}\n" for a, b in values))
    return path


def _mask(csv, out, columns=("a",)):
    return run_mask(csv, out, columns=list(columns), bounds={c: (0.0, 10.0) for c in columns}, epsilon=1.0,
                    delta=1e-6, block_rows=50, seed=1, placement=Placement(serial=True), log=io.StringIO())


@pytest.mark.parametrize("columns", [("a",), ("a", "b")])
def test_a_true_account_passes(csv, tmp_path, columns):
    result = _mask(csv, tmp_path / "m.zarr", columns)
    report = audit_mask(result.path)
    assert report.ok, report.failures
    assert report.checks >= 10 and report.claim == "sigma" and report.value == result.sigma and report.checksum == result.checksum


def test_a_sigma_a_little_too_small_fails(csv, tmp_path, monkeypatch):
    real = mask_job.mask_account

    def shrunk(*args, **kwargs):
        account = real(*args, **kwargs)
        sigma = account.sigma * (1 - 1e-4)
        return type(account)(**{**account.to_dict(), "sigma": sigma, "sigma_masked": sigma})

    monkeypatch.setattr(mask_job, "mask_account", shrunk)
    report = audit_mask(_mask(csv, tmp_path / "m.zarr").path)
    assert not report.ok
    assert any("over the budget" in f for f in report.failures)
    assert any("account.delta_achieved" in f for f in report.failures)


def test_setting_b_claimed_for_two_columns_fails(csv, tmp_path, monkeypatch):
    real = mask_job.mask_account

    def claimed(*args, **kwargs):
        account = real(*args, **kwargs)
        return type(account)(**{**account.to_dict(), "sigma": account.sigma / 5, "sigma_masked": account.sigma / 5})

    monkeypatch.setattr(mask_job, "mask_account", claimed)
    report = audit_mask(_mask(csv, tmp_path / "m.zarr", ("a", "b")).path)
    assert any("setting B is claimed for one column only" in f for f in report.failures)
    assert any("setting A's is" in f for f in report.failures)


def test_an_account_edited_after_the_seal_fails_its_checksum(csv, tmp_path):
    path = tmp_path / "m.zarr"
    _mask(csv, path)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["account"]["epsilon"] = 2.0
    (path / "zarr.json").write_text(json.dumps(meta))
    report = audit_mask(str(path))
    assert any(f.startswith("checksum:") for f in report.failures)
    assert any("setting B: sigma" in f for f in report.failures)  # at epsilon 2 the least sigma is smaller
    assert math.isfinite(report.value)
