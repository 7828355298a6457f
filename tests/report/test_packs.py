"""distfit.report.packs: the report's block table and true answers of a packed (and a mixed)
plan, in bulk, against the blocks materialised one at a time."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.release.noise import query_answers, true_block_answers
from distfit.report.packs import block_rows, true_query_answers
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data, write_synthetic
from distfit.stores.plan import read_plan
from tests.packed_plans import marginals_spec, write_packed_plan


@pytest.mark.parametrize("explicit", [0, 5])
def test_block_rows_and_true_answers_equal_the_blocks_one_at_a_time(tmp_path, explicit):
    spec = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], name="report-packs")
    write_packed_plan(tmp_path / "plan.zarr", spec, explicit=explicit)
    plan = read_plan(tmp_path / "plan.zarr")
    data = open_data(write_synthetic(parse_spec(spec), 9, tmp_path / "data.zarr", seed=2, chunk_units=4, fsync=False))
    rows = block_rows(plan)
    assert [r["id"] for r in rows] == list(plan.block_ids)
    pieces = []
    for row in rows:
        rec = plan.block(row["id"])
        assert row["attributes"] == rec.attributes and row["shape"] == " x ".join(map(str, rec.shape))
        assert row["alpha"] == pytest.approx(rec.alpha, rel=1e-15) and row["lower_bound"] == rec.lower_bound
        pieces.append((rec.query_index, true_block_answers(rec, data.block_counts(rec.attributes, 0, 7))))
    want = query_answers(pieces, plan.queries_targets.size)
    np.testing.assert_allclose(true_query_answers(plan, data, 7), want, rtol=0, atol=1e-10)
