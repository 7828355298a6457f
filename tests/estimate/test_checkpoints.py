"""Resumability within a chunk (issue 26): the local polytope's ADMM state checkpointed, verified
when read back, and a fit killed mid-unit continued to the bits of an uninterrupted one."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
import subprocess
import sys

import numpy as np
import pytest
import zarr

from distfit.cli.main import main
from distfit.estimate import graphical, local_polytope
from distfit.estimate.checkpoints import ChunkCheckpoints
from distfit.estimate.job import run_estimate
from distfit.runtime.placement import Placement
from distfit.stores.checkpoint import CheckpointError, checkpoints_dir, read_checkpoint, write_checkpoint
from distfit.stores.checksum import fingerprint
from distfit.stores.estimate import estimate_state, read_sealed_estimate
from tests.estimate.test_local_polytope import chunk_of, four  # noqa: F401 - the fixture
from tests.estimate.test_graphical import one_unit
from tests.storetools import planned

STATE = {"u", "z", "lam", "previous", "active"}


class Kept:
    """Checkpoints in memory: every state offered, copied; ``start`` loaded; the fingerprints of
    the inputs it was loaded with."""

    def __init__(self, start=None):
        self.start, self.saved, self.keys = start, [], set()

    def load(self, inputs):
        self.keys.add(fingerprint(inputs.claims, inputs.arrays))
        return self.start

    def save(self, state):
        self.saved.append(dataclasses.replace(state, **{f: np.copy(getattr(state, f)) for f in STATE}))


def test_admm_resumed_from_any_saved_state_ends_bit_for_bit_where_it_would_have(four):  # noqa: F811
    """Two units, one frozen before the other (a tight stopping rule: 100 iterations): the state
    after every check, handed back as the start, gives the same u, iterations and convergence,
    bit for bit, as the run that never stopped; every state is saved under one key, which other
    measurements or another stopping rule change."""
    units = [one_unit(four, total, seed)[1] for total, seed in ((10, 3), (500, 4))]
    problem = graphical.graphical_problem(four, method="local")
    _, white = graphical._whitened(problem, chunk_of(four, units))  # noqa: SLF001 - the solver's own input
    white = np.stack([np.concatenate([w[b.block_id] for b in four.blocks]) for w in white], axis=1)
    rule = {"tolerance": 1e-10, "negativity": 1e-3}
    kept = Kept()
    u, done, converged = local_polytope.solve(problem.local, white, checkpoints=kept, **rule)
    assert converged.all()
    assert [s.done for s in kept.saved] == list(range(local_polytope.CHECK_EVERY, done + 1, local_polytope.CHECK_EVERY))
    assert len(kept.saved) >= 4 and kept.saved[0].active.all() and kept.saved[-2].active.sum() == 1
    assert not kept.saved[-1].active.any()  # the last state: resumed, the fit is over at once
    for state in kept.saved:
        again = local_polytope.solve(problem.local, white, checkpoints=Kept(state), **rule)
        assert again[0].tobytes() == u.tobytes() and again[1] == done and (again[2] == converged).all()
    assert len(kept.keys) == 1
    for changed in (local_polytope.state_inputs(problem.local, white + 1e-9, local_polytope.ITERATIONS, **rule),
                    local_polytope.state_inputs(problem.local, white, local_polytope.ITERATIONS, 1e-8, 1e-4)):
        assert fingerprint(changed.claims, changed.arrays) not in kept.keys


def _state(rng):
    return {"u": rng.normal(size=(7, 2)), "z": rng.random((9, 2)), "lam": rng.normal(size=(9, 2)),
            "previous": np.array([np.inf, 3.5]), "active": np.array([True, False])}


def test_a_checkpoint_is_verified_when_read_and_refused_in_one_line_when_tampered(tmp_path):
    """Written and read back whole (inf, bool kept); a newer step replaces the older one; a
    temporary directory of an interrupted write is ignored; a changed byte of an array or of an
    attr is refused (CheckpointError, one line naming the checkpoint)."""
    store = tmp_path / "est.zarr"
    state = _state(np.random.default_rng(1))
    write_checkpoint(store, 3, 25, state, {"key": "k"}, fsync=False)
    path = write_checkpoint(store, 3, 50, state, {"key": "k"}, fsync=False)
    (checkpoints_dir(store) / ".chunk-000003-0123456789ab.tmp").mkdir()  # a write killed half way
    assert sorted(p.name for p in checkpoints_dir(store).glob("chunk-*")) == [path.name]
    arrays, attrs = read_checkpoint(store, 3)
    assert attrs["step"] == 50 and attrs["key"] == "k" and set(arrays) == set(state)
    assert all(arrays[k].tobytes() == state[k].tobytes() and arrays[k].dtype == state[k].dtype for k in state)
    assert read_checkpoint(store, 4) is None
    chunk = next(p for p in (path / "lam").rglob("*") if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(store, 3)
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)
    path = write_checkpoint(store, 3, 75, state, {"key": "k"}, fsync=False)
    zarr.open_group(store=str(path), mode="r+").attrs["key"] = "forged"
    with pytest.raises(CheckpointError, match="fails verification"):
        read_checkpoint(store, 3)


def test_chunk_checkpoints_refuse_a_bad_checkpoint_aloud_and_keep_their_cadence(tmp_path):
    """A checkpoint of other inputs (another fingerprint) or one that fails verification is not used:
    one line on the log, the checkpoint deleted, the fit starts afresh (None). A good one is
    loaded with a line saying so. Saves are skipped until ``seconds`` have passed."""
    store = tmp_path / "est.zarr"
    rng = np.random.default_rng(2)
    state = local_polytope.AdmmState(done=25, **_state(rng))
    inputs = local_polytope.StateInputs(claims={"rho": 1.5}, arrays={"white": np.arange(3.0)})
    other = local_polytope.StateInputs(claims={"rho": 1.5}, arrays={"white": np.arange(3.0) + 1})
    log = io.StringIO()
    never = ChunkCheckpoints(store, 0, "estimate units 0-0", log=log, seconds=3600.0, fsync=False)
    assert never.load(inputs) is None
    never.save(state)
    assert never.written == 0 and read_checkpoint(store, 0) is None
    every = ChunkCheckpoints(store, 0, "estimate units 0-0", log=log, seconds=0.0, fsync=False)
    assert every.load(inputs) is None
    every.save(state)
    assert every.written == 1 and log.getvalue() == ""
    loaded = ChunkCheckpoints(store, 0, "estimate units 0-0", log=log, fsync=False).load(inputs)
    assert loaded.done == 25 and loaded.lam.tobytes() == state.lam.tobytes()
    assert log.getvalue() == "distfit: estimate units 0-0: resuming the fit from its checkpoint at 25 iterations\n"
    for spoil in ("inputs", "array"):
        every.save(state)
        log = io.StringIO()
        if spoil == "array":  # a value changed, through zarr: it reads, and must not be used
            path = next(checkpoints_dir(store).glob("chunk-*"))
            zarr.open_group(store=str(path), mode="r+")["lam"][0, 0] = 7.0
        assert ChunkCheckpoints(store, 0, "estimate units 0-0", log=log, fsync=False).load(
            inputs if spoil == "array" else other) is None
        lines = log.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distfit: estimate units 0-0: ") and \
            lines[0].endswith("not used; the fit starts from the beginning"), lines
        assert ("other inputs" if spoil == "inputs" else "fails verification") in lines[0]
        assert read_checkpoint(store, 0) is None  # deleted, not left to be refused again


#: ``distfit ARGV`` that writes a checkpoint after every batch of ADMM iterations and SIGKILLs its
#: own process as soon as the first one is in place: the kill falls mid-fit by construction.
KILLED_AFTER_A_CHECKPOINT = (
    "import os, signal, sys\n"
    "import distfit.estimate.checkpoints as checkpoints\n"
    "checkpoints.CHECKPOINT_SECONDS = 0.0\n"
    "write = checkpoints.write_checkpoint\n"
    "def write_then_die(*args, **kwargs):\n"
    "    write(*args, **kwargs)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "checkpoints.write_checkpoint = write_then_die\n"
    "from distfit.cli.main import main\n"
    "raise SystemExit(main(sys.argv[1:]))")


def test_an_estimate_killed_mid_fit_resumes_from_its_checkpoint_to_the_same_bits(tmp_path, capsys):
    """A wide schema (8 attributes of 8 values, 16.8M cells, all 2-way marginals: the local
    polytope, one unit): ``distfit estimate`` in a child process killed (SIGKILL) right after
    its first checkpoint; the fault is real (the process died of the signal, the checkpoint is
    there and verifies, at 25 iterations, holding only the ADMM state; the store is
    incomplete); ``--resume`` continues the fit from that checkpoint (it says so) and seals the
    same store, bit for bit, as an uninterrupted run (by the default placement: one chunk, no
    cluster started); no checkpoint is left behind."""
    attributes = [f"a{i}" for i in range(8)]
    spec = {"name": "wide8", "attributes": [{"name": a, "size": 8} for a in attributes],
            "queries": [{"name": "pairs", "marginals": {"order": 2}, "target": 25.0}]}
    plan = planned(tmp_path, spec).plan
    rng = np.random.default_rng(7)
    common = rng.integers(0, 8, size=(200, 1))
    people = np.where(rng.random((200, 8)) < 0.6, common, rng.integers(0, 8, size=(200, 8)))
    np.savetxt(tmp_path / "people.csv", people, fmt="%d", delimiter=",", header=",".join(attributes), comments="")
    release = tmp_path / "release.zarr"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["release", plan, "--data", str(tmp_path / "people.csv"), "--out", str(release), "--seed", "5",
                     "--serial"]) == 0
    log = io.StringIO()  # the default placement: one chunk of units is estimated without a cluster
    whole = run_estimate(plan, release, tmp_path / "whole.zarr", placement=Placement(), fsync=False, log=log)
    assert whole.method == "graphical-local" and whole.cells == 8 ** 8 and whole.fit["iterations_max"] > 25
    assert "distfit: one chunk of units: estimated in this process, without a cluster\n" in log.getvalue()
    assert "cluster with" not in log.getvalue()

    out = tmp_path / "est.zarr"
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_A_CHECKPOINT, "estimate", plan, str(release),
                             "--out", str(out), "--serial"], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert estimate_state(out) == "incomplete"
    arrays, attrs = read_checkpoint(out, 0)
    assert attrs["step"] == local_polytope.CHECK_EVERY and set(arrays) == STATE

    capsys.readouterr()
    resumed = run_estimate(plan, release, out, resume=True, placement=Placement(serial=True), fsync=False,
                           log=io.StringIO())
    assert resumed.resumed and resumed.chunks_done_now == 1
    # the task's own line (its stderr: a worker's, or this process's when serial)
    assert f"distfit: estimate units 0-0: resuming the fit from its checkpoint at {local_polytope.CHECK_EVERY} " \
           "iterations\n" in capsys.readouterr().err
    assert resumed.checksum == whole.checksum and resumed.fit == whole.fit
    for name in ("marginals/estimates", "queries/estimates", "solve/objective", "solve/iterations"):
        # each read checked against its chunk digests (stores.sealing.CheckedArray)
        assert np.asarray(read_sealed_estimate(out).array(name)[...]).tobytes() == \
            np.asarray(read_sealed_estimate(tmp_path / "whole.zarr").array(name)[...]).tobytes(), name
    assert not checkpoints_dir(out).exists() and not checkpoints_dir(tmp_path / "whole.zarr").exists()
