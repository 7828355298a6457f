"""Fixtures shared across the test packages."""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from distfit.plan.job import run_plan
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import load_spec
from distfit.runtime.placement import Placement
from tests.reference import SMALL_SPEC


def pytest_configure(config) -> None:
    """The tests run with a home directory of their own (this process and every subprocess it
    starts): the ledger of private releases (distfit.stores.ledger, under ~/.local/share) then
    holds only the tests' releases, and never the runner's."""
    home = tempfile.mkdtemp(prefix="distfit-tests-home-")
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    os.environ["HOME"] = home


@dataclass(frozen=True)
class SmallPlan:
    """``tests.reference.SMALL_SPEC`` written to ``spec_path`` and planned (serially) into ``plan``."""

    root: Path
    spec_path: Path
    spec: PipelineSpec
    plan: str


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> SmallPlan:
    """One real multi-block plan for the session (treat its files as read-only)."""
    root = tmp_path_factory.mktemp("small-plan")
    spec_path = root / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SMALL_SPEC))
    spec = load_spec(spec_path)
    plan = root / "plan.zarr"
    run_plan(spec, str(plan), placement=Placement(serial=True), log=io.StringIO())
    return SmallPlan(root, spec_path, spec, str(plan))
