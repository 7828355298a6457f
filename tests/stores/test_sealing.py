"""Tamper, then read (distfit.stores.sealing: the one sealing path): every command that reads a store refuses one changed after it was sealed
(issue 28), in one line naming the store, exit 2, before it writes anything.

One sealed chain per module (a small real plan, a 40-unit data store in 4 chunks, a seeded
release, an estimate); each test copies the store it tampers with, so the chain stays sealed.
The tampers are the ones an adversary tried: a deleted chunk, a flipped byte in a chunk, an
attr edited in ``zarr.json`` (``units``, ``private``, ``integer``, ``method``, ``fit``), a store
of an older format. Read by each command that reads them: ``release`` (the data), ``estimate``
(the release), ``export`` (a release or an estimate), ``report`` (all of them); the levels of a
multi-level run: tests/estimate/test_levels.py."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import numpy as np
import zarr

from distfit.cli import main as cli
from distfit.estimate.job import run_estimate
from distfit.export.job import run_export
from distfit.release.job import run_release
from distfit.runtime.placement import Placement
from distfit.stores import sealing
from distfit.stores.data import write_synthetic
from distfit.stores.estimate import read_estimate, read_sealed_estimate
from distfit.stores.release import read_sealed_release
from distfit.stores.sealing import ChangedChunk, CheckedArray
from tests.clitools import assert_one_line_error, run
from tests.storetools import reseal


@pytest.fixture(scope="module")
def chain(small_plan, tmp_path_factory):
    """Sealed plan, data (40 units, 4 chunks), release (--seed) and estimate."""
    root = tmp_path_factory.mktemp("chain")
    data = root / "data.zarr"
    write_synthetic(small_plan.spec, 40, data, seed=3, chunk_units=10)
    release, estimate = root / "release.zarr", root / "estimate.zarr"
    assert cli.main(["release", small_plan.plan, "--data", str(data), "--out", str(release), "--seed", "5",
                     "--serial"]) == 0
    assert cli.main(["estimate", small_plan.plan, str(release), "--out", str(estimate), "--serial"]) == 0
    return {"plan": small_plan.plan, "data": data, "release": release, "estimate": estimate}


def copy(chain, kind: str, tmp_path: Path) -> Path:
    target = tmp_path / Path(chain[kind]).name
    shutil.copytree(chain[kind], target)
    return target


def edit_root_attr(store: Path, key: str, value) -> None:
    """Change one root attr in ``zarr.json`` by hand (no re-seal: what an editor does)."""
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    assert key in doc["attributes"], key
    assert doc["attributes"][key] != value
    doc["attributes"][key] = value
    meta.write_text(json.dumps(doc))


def chunk_files(store: Path, array: str) -> list[Path]:
    files = sorted(p for p in (store / array / "c").rglob("*") if p.is_file())
    assert len(files) >= 2, files
    return files


def flip_a_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def refused(capsys, argv: list[str], out: Path, *fragments: str) -> None:
    """Exit 2, one error line naming the store, nothing at ``out``. A chunk is checked by the task
    that reads it, so a refusal may come once the work has started: the command's notes
    (``distfit: estimate by ...``) and the progress lines (the audit's, the chunks drawn before it) may come
    first (never a traceback); the one error line comes last."""
    code, stdout, err = run(capsys, *argv)
    assert code == 2, (code, stdout, err)
    lines = [line for line in err.splitlines() if line.strip()]
    before = [line for line in lines[:-1] if not re.search(r"/s, ETA ", line)]  # progress lines (units, blocks)
    assert all(line.startswith("distfit: ") and not line.startswith("distfit: error") for line in before), err
    assert_one_line_error(lines[-1], *fragments)
    assert "Traceback" not in err
    assert not out.exists(), f"{out} was written from unverified input"


# ---------------------------------------------------------------------------- release reads data


def release_argv(chain, data: Path, out: Path) -> list[str]:
    return ["release", chain["plan"], "--data", str(data), "--out", str(out), "--seed", "5", "--serial"]


@pytest.mark.parametrize("tamper", ["delete", "flip"])
def test_release_refuses_data_with_a_changed_counts_chunk(chain, tmp_path, capsys, tamper):
    data = copy(chain, "data", tmp_path)
    chunk = chunk_files(data, "counts")[1]
    chunk.unlink() if tamper == "delete" else flip_a_byte(chunk)
    out = tmp_path / "r.zarr"
    refused(capsys, release_argv(chain, data, out), out, str(data), "changed after it was sealed")


def test_release_refuses_data_with_an_edited_attr(chain, tmp_path, capsys):
    data = copy(chain, "data", tmp_path)
    edit_root_attr(data, "total_people", 1)
    out = tmp_path / "r.zarr"
    refused(capsys, release_argv(chain, data, out), out, str(data), "changed after it was sealed")


@pytest.mark.parametrize("version", [1, 2])
def test_release_refuses_a_data_store_of_an_old_format(chain, tmp_path, capsys, version):
    """1: no checksum; 2: no per-chunk digests (its chunks cannot be checked as they are read)."""
    data = copy(chain, "data", tmp_path)
    edit_root_attr(data, "format_version", version)
    out = tmp_path / "r.zarr"
    refused(capsys, release_argv(chain, data, out), out, str(data), f"format_version {version}", "distfit synth")


def test_release_refuses_data_whose_chunk_digests_were_edited(chain, tmp_path, capsys):
    """A forger who rewrites a chunk and its digest changes the digest table, which the root
    checksum covers: refused by the driver, before anything is laid out."""
    data = copy(chain, "data", tmp_path)
    flip_a_byte(chunk_files(data, "chunks/digests")[1])
    out = tmp_path / "r.zarr"
    refused(capsys, release_argv(chain, data, out), out, str(data), "changed after it was sealed", "contents hash to")


def test_a_data_chunk_changed_after_the_driver_checked_is_caught_by_its_task(chain, tmp_path):
    """The window the whole-store pass left open: the driver checks the root, then (while the
    release runs) a later chunk is altered; the task that reads it refuses it before it is used,
    nothing is sealed and the new release is deleted with what was drawn into it."""
    data = copy(chain, "data", tmp_path)
    out = tmp_path / "r.zarr"
    target = chunk_files(data, "counts")[3]

    def tamper(chunk: int) -> None:
        if chunk == 0:
            flip_a_byte(target)

    with pytest.raises(ChangedChunk, match=r"data\.zarr: the histograms store was changed after it was sealed: "
                                           r"counts"):  # units 30..39 no longer hash, or no longer decode
        run_release(chain["plan"], data, out, seed=5, placement=Placement(serial=True), after_chunk=tamper)
    assert not out.exists()


def test_a_release_chunk_changed_after_the_driver_checked_is_caught_by_its_task(chain, tmp_path):
    release = copy(chain, "release", tmp_path)
    out = tmp_path / "e.zarr"
    answers = sorted(str(p.relative_to(release)) for p in release.rglob("answers") if p.is_dir())
    read = next(name for name in answers if name.startswith("blocks/"))  # what this plan's estimate reads
    target = chunk_files(release, read)[2]

    def tamper(chunk: int) -> None:
        if chunk == 0:
            target.unlink()  # read as the fill value: not what was sealed

    with pytest.raises(ChangedChunk, match=r"release\.zarr: the release was changed after it was sealed: "
                                           rf"{read} units 20\.\.29 \(chunk 2\)"):
        run_estimate(chain["plan"], release, out, placement=Placement(serial=True), after_chunk=tamper)
    assert not out.exists()


# ------------------------------------------------------------------------- estimate reads release


def test_estimate_refuses_a_release_with_a_deleted_answers_chunk(chain, tmp_path, capsys):
    release = copy(chain, "release", tmp_path)
    answers = [p for p in release.rglob("answers") if p.is_dir()]
    assert answers
    chunk_files(release, str(answers[0].relative_to(release)))[1].unlink()
    out = tmp_path / "e.zarr"
    refused(capsys, ["estimate", chain["plan"], str(release), "--out", str(out), "--serial"],
            out, str(release), "changed after it was sealed")


@pytest.mark.parametrize("array, tamper", [("chunks/digests", "flip"), ("chunks/digests", "truncate"),
                                           ("chunks/done", "delete")])
def test_estimate_refuses_a_release_whose_root_chunk_files_were_changed(chain, tmp_path, capsys, array, tamper):
    """The root check reads the digest table and the done markers as raw chunk files
    (stores.release_chunks.raw_reader): a flipped byte, a short file (read through zarr, which
    cannot decode it) and a missing file (read as the fill value) are all refused."""
    release = copy(chain, "release", tmp_path)
    target = chunk_files(release, array)[1]
    if tamper == "flip":
        flip_a_byte(target)
    elif tamper == "truncate":
        target.write_bytes(target.read_bytes()[:-1])
    else:
        target.unlink()
    out = tmp_path / "e.zarr"
    refused(capsys, ["estimate", chain["plan"], str(release), "--out", str(out), "--serial"],
            out, str(release), "changed after it was sealed")


@pytest.mark.parametrize("key, value", [("units", 20), ("private", True)])
def test_estimate_refuses_a_release_with_an_edited_attr(chain, tmp_path, capsys, key, value):
    release = copy(chain, "release", tmp_path)
    edit_root_attr(release, key, value)
    out = tmp_path / "e.zarr"
    refused(capsys, ["estimate", chain["plan"], str(release), "--out", str(out), "--serial"],
            out, str(release), "changed after it was sealed")


@pytest.mark.parametrize("version", [1, 2])
def test_estimate_refuses_a_release_of_an_old_format(chain, tmp_path, capsys, version):
    release = copy(chain, "release", tmp_path)
    edit_root_attr(release, "format_version", version)
    out = tmp_path / "e.zarr"
    refused(capsys, ["estimate", chain["plan"], str(release), "--out", str(out), "--serial"],
            out, str(release), f"format_version {version}", "distfit release")


# ------------------------------------------------------------------ report reads all of them


def test_report_refuses_a_release_whose_private_flag_was_flipped(chain, tmp_path, capsys):
    release = copy(chain, "release", tmp_path)
    edit_root_attr(release, "private", True)  # a seeded release would lose its NOT PRIVATE banner
    out = tmp_path / "report"
    refused(capsys, ["report", chain["plan"], str(release), "--out", str(out)], out, str(release),
            "changed after it was sealed")


@pytest.mark.parametrize("key, value", [("integer", True), ("method", "graphical"), ("fit", {"objective_mean": 0.0})])
def test_report_refuses_an_estimate_with_an_edited_attr(chain, tmp_path, capsys, key, value):
    estimate = copy(chain, "estimate", tmp_path)
    edit_root_attr(estimate, key, value)
    out = tmp_path / "report"
    refused(capsys, ["report", chain["plan"], str(chain["release"]), "--estimate", str(estimate), "--out", str(out)],
            out, str(estimate), "changed after it was sealed")


def test_report_refuses_changed_calibration_data(chain, tmp_path, capsys):
    data = copy(chain, "data", tmp_path)
    chunk_files(data, "counts")[0].unlink()
    out = tmp_path / "report"
    refused(capsys, ["report", chain["plan"], str(chain["release"]), "--data", str(data), "--out", str(out)],
            out, str(data), "changed after it was sealed")


def test_report_refuses_a_plan_changed_after_it_was_sealed(chain, tmp_path, capsys):
    plan = copy(chain, "plan", tmp_path)
    edit_root_attr(plan, "rho", 1e-9)  # a smaller privacy claim than the plan's
    out = tmp_path / "report"
    refused(capsys, ["report", str(plan), "--out", str(out)], out, str(plan), "changed after it was sealed")


def test_the_untampered_chain_reads(chain, tmp_path, capsys):
    """The control: the same commands on the sealed stores succeed."""
    code, _, err = run(capsys, "report", chain["plan"], str(chain["release"]), "--estimate", str(chain["estimate"]),
                       "--data", str(chain["data"]), "--out", str(tmp_path / "report"))
    assert code == 0, err
    code, _, err = run(capsys, "estimate", chain["plan"], str(chain["release"]), "--out", str(tmp_path / "e.zarr"),
                       "--serial")
    assert code == 0, err


# ----------------------------------------------- export and report read a store as they write


def answers_array(kind: str) -> str:
    """The array of figures ``export`` streams from a store of ``kind``."""
    return "queries/answers" if kind == "release" else "queries/estimates"


def tamper_chunk(store: Path, array: str, tamper: str, index: int = 2) -> None:
    """Delete, or flip a byte of, the chunk file ``index`` of ``array`` (chunk 2: units 20..29)."""
    target = chunk_files(store, array)[index]
    target.unlink() if tamper == "delete" else flip_a_byte(target)


def no_staging(out: Path) -> None:
    """Nothing left beside ``out`` by the command (its staging directory deleted)."""
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(out.name)] == []


@pytest.mark.parametrize("kind", ["release", "estimate"])
@pytest.mark.parametrize("tamper", ["delete", "flip"])
def test_export_refuses_a_chunk_changed_after_it_was_sealed(chain, tmp_path, capsys, kind, tamper):
    """The export streams the store to its tables and checks each chunk as it reads it: chunk 2
    is found after chunks 0-1 were written to the staging directory, which is deleted."""
    store = copy(chain, kind, tmp_path)
    array = answers_array(kind)
    tamper_chunk(store, array, tamper)
    out = tmp_path / "tables"
    refused(capsys, ["export", str(store), "--out", str(out)], out, str(store), "changed after it was sealed",
            f"{array} units 20..29 (chunk 2)")
    no_staging(out)


@pytest.mark.parametrize("kind, key, value", [("release", "units", 20), ("release", "private", True),
                                              ("estimate", "method", "graphical"), ("estimate", "integer", True)])
def test_export_refuses_a_store_with_an_edited_attr(chain, tmp_path, capsys, kind, key, value):
    store = copy(chain, kind, tmp_path)
    edit_root_attr(store, key, value)
    out = tmp_path / "tables"
    refused(capsys, ["export", str(store), "--out", str(out)], out, str(store), "changed after it was sealed",
            "contents hash to")
    no_staging(out)


@pytest.mark.parametrize("kind", ["release", "estimate"])
@pytest.mark.parametrize("tamper", ["delete", "flip"])
def test_report_refuses_a_chunk_changed_after_it_was_sealed(chain, tmp_path, capsys, kind, tamper):
    """The report reads the first units of the release and the estimate (all 40 here), each
    chunk checked as it is read."""
    store = copy(chain, kind, tmp_path)
    array = answers_array(kind)
    tamper_chunk(store, array, tamper, index=0)
    release = store if kind == "release" else chain["release"]
    estimate = store if kind == "estimate" else chain["estimate"]
    out = tmp_path / "report"
    refused(capsys, ["report", chain["plan"], str(release), "--estimate", str(estimate), "--out", str(out)],
            out, str(store), "changed after it was sealed", f"{array} units 0..9 (chunk 0)")
    no_staging(out)


def test_each_chunk_is_hashed_once_as_it_is_read(chain, tmp_path, monkeypatch):
    """No separate pass: the export of a release hashes each chunk of the answers and of the unit
    ids it reads exactly once (the hash of the bytes it then uses), and nothing else."""
    hashed: list[tuple[str, int]] = []
    original = sealing.chunk_digest

    def counting(name, start, values):
        hashed.append((name, start))
        return original(name, start, values)

    monkeypatch.setattr(sealing, "chunk_digest", counting)
    run_export(chain["release"], tmp_path / "tables", fsync=False)
    starts = [0, 10, 20, 30]
    assert sorted(hashed) == sorted([("queries/answers", s) for s in starts] + [("unit_ids", s) for s in starts]
                                    + [("unit_ids", 0)])  # the first id once more: the table schema's type


def test_checked_arrays_index_as_the_zarr_arrays(chain):
    """A store opened with its digests gives CheckedArrays that read exactly what zarr does, for
    every kind of index its readers use."""
    store = read_sealed_release(chain["release"])
    for name in ("queries/answers", "unit_ids"):
        checked, plain = store.array(name), zarr.open_group(str(chain["release"]), mode="r")[name]
        assert isinstance(checked, CheckedArray) and checked.shape == plain.shape and checked.dtype == plain.dtype
        keys = [Ellipsis, slice(None), slice(3, 27), slice(-5, None), slice(8, 8), slice(30, 10), 0, 17, -1,
                slice(1, 39, 7), np.array([3, 31, 12]), (slice(5, 25), 0) if plain.ndim == 2 else slice(0, 40)]
        if plain.ndim == 2:
            keys += [(slice(None), slice(1, 3)), (12, slice(None)), (Ellipsis, 2)]
        for key in keys:
            np.testing.assert_array_equal(checked[key], plain[key], err_msg=repr(key))
        np.testing.assert_array_equal(np.asarray(checked), plain[...])
    assert store.parent_ids is None or not isinstance(store.parent_ids, CheckedArray)  # covered by the root


# ------------------------------------------------------------- estimates of the previous format


def previous_format(chain, tmp_path: Path) -> Path:
    """The chain's estimate as format 3 wrote it: no per-chunk digests, its checksum over every
    array and stated attr (checksum version 2)."""
    store = copy(chain, "estimate", tmp_path)
    group = zarr.open_group(str(store), mode="r+")
    del group["chunks/digests"]
    group.attrs["format_version"] = 3
    reseal(store)
    return store


def test_an_estimate_of_the_previous_format_is_read_and_verified_whole(chain, tmp_path, capsys):
    store = previous_format(chain, tmp_path)
    estimate = read_sealed_estimate(store)
    assert estimate.digests is None and not isinstance(estimate.estimates, CheckedArray)
    np.testing.assert_array_equal(estimate.estimates[...], read_estimate(chain["estimate"]).estimates[...])
    code, _, err = run(capsys, "export", str(store), "--out", str(tmp_path / "tables"))
    assert code == 0, err
    tamper_chunk(store, "queries/estimates", "flip")  # found by the whole check, before anything is written
    out = tmp_path / "again"
    refused(capsys, ["export", str(store), "--out", str(out)], out, str(store), "changed after it was sealed",
            "contents hash to")
