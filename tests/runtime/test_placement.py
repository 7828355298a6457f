"""Placement: where a job's tasks run, checked once when it is made (distfit/runtime/placement.py)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from distfit.cli.main import main
from distfit.runtime.placement import Placement
from distfit.runtime.security import Transport


def test_the_default_is_a_local_cluster_of_the_machine_s_cores():
    placement = Placement()
    assert (placement.cluster, placement.workers, placement.serial) == (None, None, False)
    assert placement.local and placement.local_workers == (os.cpu_count() or 1)
    assert Placement(workers=3).local_workers == 3
    assert placement.describe() == {"kind": "local", "workers": os.cpu_count() or 1}


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0}, "--workers must be >= 1, got 0"),
    ({"workers": -2}, "--workers must be >= 1, got -2"),
    ({"workers": True}, "--workers must be >= 1, got True"),
    ({"serial": True, "workers": 2}, "--serial excludes --cluster and --workers"),
    ({"serial": True, "cluster": "tcp://127.0.0.1:8786"}, "--serial excludes --cluster and --workers"),
])
def test_bad_options_are_one_line_naming_the_option(kwargs, message):
    with pytest.raises(ValueError) as raised:
        Placement(**kwargs)
    assert str(raised.value) == message and "\n" not in str(raised.value)


def test_a_placement_is_frozen_and_its_replacements_are_checked_too():
    placement = Placement(serial=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.workers = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="--serial excludes"):
        dataclasses.replace(placement, workers=2)
    assert Placement(serial=True) == placement and hash(Placement(serial=True)) == hash(placement)


def test_a_scheduler_file_path_is_kept_as_text(tmp_path):
    placement = Placement(cluster=tmp_path / "scheduler.json")
    assert placement.cluster == str(tmp_path / "scheduler.json") and isinstance(placement.cluster, str)
    assert not placement.local
    assert placement.describe() == {"kind": "external", "address": str(tmp_path / "scheduler.json")}


def test_at_moves_a_placement_onto_a_started_scheduler():
    """A job that starts the local cluster hands its stages the placement at its address."""
    assert Placement(workers=2).at("tcp://127.0.0.1:9") == Placement(cluster="tcp://127.0.0.1:9", workers=2,
                                                                     transport=Transport(insecure=True, own=True))
    assert Placement(serial=True).at(None) == Placement(serial=True)
    assert Placement(cluster="tls://h:1").at("tls://h:1") == Placement(cluster="tls://h:1")
    assert Placement(serial=True).describe() == {"kind": "serial"}


@pytest.mark.parametrize("command", ["plan", "release", "estimate", "tabulate", "run"])
@pytest.mark.parametrize("flags, fragment", [
    (["--workers", "0"], "--workers must be >= 1, got 0"),
    (["--serial", "--cluster", "tcp://127.0.0.1:1"], "--serial excludes --cluster and --workers"),
])
def test_every_placed_command_refuses_bad_options_the_same_way(command, flags, fragment, tmp_path, capsys):
    """The command line builds its one Placement before any work: exit 2, one error line,
    nothing written (the inputs need not even exist)."""
    out = tmp_path / "out"
    positional = {"plan": ["spec.yaml"], "release": ["plan.zarr", "--data", "data.zarr"],
                  "estimate": ["plan.zarr", "release.zarr"], "tabulate": ["spec.yaml", "--data", "people.csv"],
                  "run": ["spec.yaml"]}[command]
    code = main([command, *[str(tmp_path / p) if p.endswith((".yaml", ".zarr", ".csv")) else p for p in positional],
                 "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"distfit: error: {fragment}\n"
    assert not Path(out).exists()
