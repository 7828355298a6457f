"""distfit/export/tables.py: query labels in words, standard errors against closed forms, rows."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mathematics.margins import MOE90_Z
from distfit.export import tables
from distfit.spec.parse import parse_spec
from tests.reference import SMALL_SPEC

#: Every query kind of pipelines/README.md ("Query groups"), and the grand total.
KINDS_SPEC = {
    "name": "kinds",
    "attributes": [
        {"name": "age", "values": ["0-17", "18-64", "65+"], "ordinal": True},
        {"name": "sex", "values": ["female", "male"]},
        {"name": "race", "values": ["white", "black", "asian"]},
    ],
    "queries": [
        {"name": "everyone", "total": True, "target": 1},
        {"name": "adults", "attributes": {"age": {"ranges": [["18-64", "65+"], [1, 1]]}, "sex": "identity"},
         "target": 1},
        {"name": "ages", "attributes": {"age": "all_ranges"}, "target": 1},
        {"name": "by_sex", "attributes": {"age": "total", "sex": {"select": ["male"]}}, "target": 1},
        {"name": "mixes", "attributes": {"race": {"matrix": [[1, 1, 0], [0.5, 0, 2]]}}, "target": 1},
        {"name": "cumulative", "attributes": {"age": "prefix"}, "target": 1},
    ],
}


def test_query_words_of_every_kind():
    spec = parse_spec(KINDS_SPEC)
    words = {layout.name: layout.words for layout in tables.table_layouts(spec, spec.num_queries)}
    assert words == {
        "everyone": ("total",),
        "adults": ("age 18-64 to 65+, sex female", "age 18-64 to 65+, sex male",
                   "age 18-64, sex female", "age 18-64, sex male"),
        "ages": ("age 0-17", "age 0-17 to 18-64", "age 0-17 to 65+", "age 18-64", "age 18-64 to 65+", "age 65+"),
        "by_sex": ("age all, sex male",),
        "mixes": ("race white or black", "race 0.5*white + 2*asian"),
        "cumulative": ("age 0-17", "age 0-17 to 18-64", "age 0-17 to 65+"),
    }


def test_layouts_are_the_spec_groups_columns_and_match_the_store_labels():
    spec = parse_spec(SMALL_SPEC)
    layouts = tables.table_layouts(spec, 24, spec.query_labels)
    assert [(t.name, t.start, t.stop) for t in layouts] == [("age", 0, 6), ("age_sex", 6, 18), ("sex_edu", 18, 24)]
    assert layouts[1].words[:3] == ("age 0, sex f", "age 0, sex m", "age 1, sex f")
    assert layouts[2].words[:2] == ("sex f, edu 0", "sex f, edu 0 to 1")
    with pytest.raises(ValueError, match="24 queries, but the store has 25"):
        tables.table_layouts(spec, 25)
    shuffled = list(spec.query_labels)
    shuffled[7], shuffled[8] = shuffled[8], shuffled[7]
    with pytest.raises(ValueError, match="query 7: the store's label"):
        tables.table_layouts(spec, 24, shuffled)


def test_gls_standard_errors_against_closed_forms():
    # cells x1, x2 and their total each measured once with unit variance: H = [[2, 1], [1, 2]];
    # the GLS cell estimate has variance (H^-1)_11 = 2/3, the total 1 / (1/2 + 1) = 2/3 too
    # (inverse-variance weighting of the direct measurement, variance 1, and the cells' sum, 2).
    hessian = np.array([[2.0, 1.0], [1.0, 2.0]])
    workload = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]])
    expected = np.sqrt([2 / 3, 2 / 3, 2 / 3, 2.0])  # x1 - x2: (1, -1) H^-1 (1, -1)^T = 2
    np.testing.assert_allclose(tables.gls_standard_errors(workload, hessian), expected, rtol=1e-14)
    # only the total measured, variance s: H = (1/s) [[1, 1], [1, 1]] is singular; the total's
    # estimate is the measurement itself, variance s (W in the row space of H)
    s = 2.5
    np.testing.assert_allclose(tables.gls_standard_errors(np.array([[1.0, 1.0]]), np.full((2, 2), 1 / s)), [np.sqrt(s)],
                               rtol=1e-14)


def test_gls_standard_errors_against_the_estimator_written_out():
    """A random full-rank measurement: ``x_hat = (A^T S^-1 A)^-1 A^T S^-1 y`` as an explicit
    matrix ``K``; ``Var(W x_hat) = W K S K^T W^T``."""
    rng = np.random.default_rng(7)
    a = rng.normal(size=(9, 5))
    root = rng.normal(size=(9, 9))
    sigma = root @ root.T + np.eye(9)
    inverse = np.linalg.inv(sigma)
    hessian = a.T @ inverse @ a
    k = np.linalg.solve(hessian, a.T @ inverse)
    workload = rng.normal(size=(4, 5))
    expected = np.sqrt(np.diag(workload @ k @ sigma @ k.T @ workload.T))
    np.testing.assert_allclose(tables.gls_standard_errors(workload, hessian), expected, rtol=1e-10)


def test_raw_standard_errors():
    np.testing.assert_array_equal(tables.raw_standard_errors(np.array([4.0, 2.25, 0.0])), [2.0, 1.5, 0.0])
    for bad in (np.array([1.0, -1.0]), np.array([np.nan])):
        with pytest.raises(ValueError, match="variances"):
            tables.raw_standard_errors(bad)


def test_linear_units_and_their_notes():
    cells = np.array([[1.0, 2.0], [0.0, 3.0], [1.0, 1e-300], [2.0, 2.0]])
    converged = np.array([1, 1, 1, 0], dtype=np.uint8)
    linear, notes = tables.linear_units(cells, converged)
    assert linear.tolist() == [True, False, True, False]
    assert [tables.NOTES[i] for i in notes] == ["linear-gls", "nonnegativity-active", "linear-gls", "not-converged"]


def test_table_rows_are_unit_major_with_se_only_where_linear():
    values = np.arange(6, dtype=np.float64).reshape(2, 3) + 0.5
    se = np.array([1.0, 2.0, 3.0])
    rows = tables.table_rows(values, se, np.array([False, True]), np.array([2, 1], dtype=np.int32))
    assert rows["unit_index"].tolist() == [0, 0, 0, 1, 1, 1]
    assert rows["query_index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert rows["estimate"].tolist() == values.ravel().tolist()
    np.testing.assert_array_equal(rows["se"], [np.nan, np.nan, np.nan, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(rows["moe90"], MOE90_Z * rows["se"])
    assert rows["published"] is None
    assert rows["note_index"].tolist() == [2, 2, 2, 1, 1, 1]
    integers = tables.table_rows(np.array([[3, 4]], dtype=np.int64), None, None, np.array([4], dtype=np.int32))
    assert integers["published"].tolist() == [3, 4] and integers["estimate"].dtype == np.float64
    assert integers["se"] is None and integers["moe90"] is None


def test_privacy_statement_states_the_plan_account():
    attrs = {"rho": 0.5, "alpha": 1.0, "composition": "parallel across units",
             "account": {"epsilon_delta": [{"delta": 1e-6, "epsilon": 4.25}]}}
    lines = tables.privacy_statement(attrs, private=True)
    assert lines == ["rho-zCDP with rho = 0.5 (alpha = 2 rho = 1), per unit: parallel across units",
                     "(epsilon, delta)-DP with epsilon = 4.25 at delta = 1e-06 (exact, from the plan's privacy profile)"]
    assert tables.privacy_statement(attrs, private=False)[-1].startswith("NOT PRIVATE")
