"""Workload builders: linear queries over a domain of categorical attributes.

A *domain* is an ordered tuple of attributes with sizes ``n_1, ..., n_k``. A data set is a count
vector ``x`` over the ``d = n_1 * ... * n_k`` cells of the domain. Cells are ordered row-major in
the domain's attribute order (the first attribute varies slowest), exactly as
``np.ravel_multi_index(values, domain.shape)``.

A *workload* (docs/design.md section 1) is a query matrix ``W`` (m x d, one row per linear query, one
column per cell) with a per-query variance target ``c`` (m,), each ``c_j > 0``.

Query groups over the full domain (docs/design.md section 2) are Kronecker products: a query matrix
``Q_i`` (rows = queries, columns = the n_i values of attribute i) for every attribute named in the
group and an all-ones row (the total) for every other attribute. ``kron_queries`` builds them.

Everything here is pure numpy; nothing loops over cells.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, Union

import numpy as np

from distfit.checks import check_integer
from distfit.mathematics.domain import Domain

__all__ = [
    "validate_targets",
    "validate_workload",
    "identity_queries",
    "total_queries",
    "prefix_queries",
    "all_range_queries",
    "range_queries",
    "random_range_queries",
    "custom_queries",
    "kron_queries",
    "marginal_queries",
    "Workload",
    "workload_from_groups",
    "prefix_workload",
    "pl94_workload",
    "PL94_RACES",
    "age_pyramid_workload",
    "all_two_way_marginals",
    "random_workload",
    "random_range_workload",
]

TargetLike = Union[float, Sequence[float], np.ndarray]


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _check_matrix(matrix: object, name: str) -> np.ndarray:
    """Return ``matrix`` as a 2-D finite nonempty float array or raise ValueError naming ``name``."""
    try:
        arr = np.array(matrix, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric 2-D array: {exc}") from None
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got {arr.ndim}-D with shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be nonempty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (found NaN or inf)")
    return arr


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


# ---------------------------------------------------------------------------------------------
# 1. Per-attribute query matrices (rows = queries, columns = the attribute's values)
# ---------------------------------------------------------------------------------------------


def identity_queries(n: int) -> np.ndarray:
    """Identity (n x n): query j counts attribute value j (the attribute's marginal)."""
    n = check_integer(n, "n", 1)
    return np.eye(n)


def total_queries(n: int) -> np.ndarray:
    """Total (1 x n): one all-ones row, the count summed over every value of the attribute."""
    n = check_integer(n, "n", 1)
    return np.ones((1, n))


def prefix_queries(n: int) -> np.ndarray:
    """Prefix (n x n, lower-triangular ones): row j counts values 0..j."""
    n = check_integer(n, "n", 1)
    return np.tri(n)


def all_range_queries(n: int) -> np.ndarray:
    """All ranges (n(n+1)/2 x n): one row per interval [a, b], a <= b, ordered by a then b.

    Row for [a, b] has ones in columns a..b inclusive and zeros elsewhere.
    """
    n = check_integer(n, "n", 1)
    lo, hi = np.triu_indices(n)  # row-major over the upper triangle: a, then b >= a
    return _interval_rows(n, lo, hi)


def _interval_rows(n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Indicator rows of the inclusive intervals [lo_r, hi_r] over values 0..n-1 (len(lo) x n)."""
    cols = np.arange(n)
    return ((cols >= lo[:, None]) & (cols <= hi[:, None])).astype(float)


def range_queries(n: int, ranges: Iterable[tuple[int, int]]) -> np.ndarray:
    """Explicit ranges (len(ranges) x n): row r counts values lo_r..hi_r (inclusive).

    ``ranges`` is a nonempty sequence of integer pairs with ``0 <= lo <= hi < n``.
    """
    n = check_integer(n, "n", 1)
    try:
        pairs = np.array(list(ranges))
    except TypeError:
        raise ValueError(f"ranges must be a sequence of (lo, hi) pairs, got {ranges!r}") from None
    if pairs.size == 0:
        raise ValueError("ranges must be nonempty")
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"ranges must be (lo, hi) pairs, got an array of shape {pairs.shape}")
    if not np.issubdtype(pairs.dtype, np.integer):
        if not (np.issubdtype(pairs.dtype, np.number) and np.all(np.isfinite(pairs))
                and np.all(pairs == np.round(pairs))):
            raise ValueError("ranges must hold integer endpoints")
        pairs = pairs.astype(np.int64)
    lo, hi = pairs[:, 0], pairs[:, 1]
    bad = (lo < 0) | (hi >= n) | (lo > hi)
    if np.any(bad):
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"ranges[{r}] = ({int(lo[r])}, {int(hi[r])}) is not a range 0 <= lo <= hi < n={n}")
    return _interval_rows(n, lo, hi)


def random_range_queries(n: int, count: int, seed: int | np.random.Generator | None = None
                         ) -> np.ndarray:
    """``count`` random ranges (count x n): two endpoints drawn uniformly from 0..n-1, sorted.

    As in the paper's range experiments (Section 7.4). ``seed`` seeds ``np.random.default_rng``.
    """
    n = check_integer(n, "n", 1)
    count = check_integer(count, "count")
    if count == 0:
        raise ValueError("count must be >= 1, got 0")
    rng = np.random.default_rng(seed)
    ends = rng.integers(0, n, size=(count, 2))
    return _interval_rows(n, ends.min(axis=1), ends.max(axis=1))


def custom_queries(matrix: object) -> np.ndarray:
    """A user-given query matrix (rows = queries, columns = values), validated and copied.

    Must be 2-D, nonempty and finite; otherwise ValueError naming the problem.
    """
    return _check_matrix(matrix, "matrix")


# ---------------------------------------------------------------------------------------------
# 3. Full-domain query matrices
# ---------------------------------------------------------------------------------------------


def kron_queries(domain: Domain, per_attribute: Mapping[str, np.ndarray]) -> np.ndarray:
    """Full-domain query matrix (m x d): ``kron`` over the attributes in domain order.

    Attribute i contributes ``per_attribute[name_i]`` (rows = queries on attribute i, n_i columns)
    if listed, else the total ``ones((1, n_i))``. Rows are ordered row-major over the factors'
    rows (first attribute's query slowest); columns are the domain's cells in row-major order.
    """
    if not isinstance(domain, Domain):
        raise ValueError(f"domain must be a Domain, got {type(domain).__name__}")
    unknown = [name for name in per_attribute if name not in domain.names]
    if unknown:
        raise ValueError(
            f"unknown attribute {unknown[0]!r} in per_attribute; domain has {list(domain.names)}")
    factors = []
    for name, n in zip(domain.names, domain.sizes):
        if name in per_attribute:
            q = _check_matrix(per_attribute[name], f"query matrix for attribute {name!r}")
            if q.shape[1] != n:
                raise ValueError(
                    f"query matrix for attribute {name!r} has {q.shape[1]} columns "
                    f"but the attribute has size {n}")
        else:
            q = np.ones((1, n))
        factors.append(q)
    return functools.reduce(np.kron, factors)


def marginal_queries(domain: Domain, clique: Iterable[str]) -> np.ndarray:
    """The clique's marginal over the full domain (prod_{i in clique} n_i x d).

    Identity on the clique's attributes, totals elsewhere: row r counts the cells whose clique
    values equal the r-th clique value tuple (row-major in domain order).
    """
    if isinstance(clique, str):
        clique = (clique,)
    clique = tuple(clique)
    if len(set(clique)) != len(clique):
        raise ValueError(f"clique has repeated attributes: {list(clique)}")
    unknown = [name for name in clique if name not in domain.names]
    if unknown:
        raise ValueError(f"unknown attribute {unknown[0]!r} in clique; domain has {list(domain.names)}")
    return kron_queries(domain, {name: np.eye(domain.size_of(name)) for name in clique})


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` itself where its address suits its dtype, else an aligned copy (the same values).
    numpy sums an unaligned array along another loop than an aligned one, with other rounding,
    and the arrays a Dask worker unpickles are views into the message at any byte offset: a
    block's solve on a worker gave other bits than the same solve in the driver, and which
    depended on where its arguments landed (Adult's plan on 2 workers changed its checksum run
    to run on an AVX-512 machine). The solver takes its arrays through this, so its result is a
    function of its inputs' values alone."""
    return array if array.flags.aligned else array.copy(order="K")  # its memory order kept: BLAS paths follow it


def validate_targets(targets: object, num_queries: int) -> np.ndarray:
    """The variance targets of ``num_queries`` queries as a float array: a scalar is broadcast,
    every target must be finite and > 0 (docs/design.md section 1: ``c_j > 0``). The one check of
    targets outside the spec parser (which words its own errors per field)."""
    try:
        target_array = np.array(targets, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"targets: not numeric ({error})") from None
    if target_array.ndim == 0:
        target_array = np.full(num_queries, float(target_array))
    if target_array.shape != (num_queries,):
        raise ValueError(f"targets: expected {num_queries} values (one per row of W), got shape {target_array.shape}")
    if not np.all(np.isfinite(target_array)):
        raise ValueError("targets: contains non-finite values")
    if np.any(target_array <= 0):
        bad = int(np.flatnonzero(target_array <= 0)[0])
        raise ValueError(f"targets: every target must be > 0; targets[{bad}] = {target_array[bad]}")
    return target_array


def validate_workload(matrix: object, targets: object) -> tuple[np.ndarray, np.ndarray]:
    """Check a workload matrix W (m x d) and its targets; return them as float arrays.

    A scalar target applies to every query. Raises ValueError naming ``W`` or ``targets``:
    non-numeric, not 2-D or empty, non-finite, all zero, a row that reads no cell; targets of
    the wrong length, non-finite or not > 0. ``solve`` and the baselines share it.
    """
    try:
        workload = aligned(np.asarray(matrix, dtype=float))
    except (TypeError, ValueError) as error:
        raise ValueError(f"W: not a numeric matrix ({error})") from None
    if workload.ndim != 2 or workload.shape[0] == 0 or workload.shape[1] == 0:
        raise ValueError(f"W: expected a non-empty 2-D matrix, got shape {workload.shape}")
    if not np.all(np.isfinite(workload)):
        raise ValueError("W: contains non-finite entries (nan or inf)")
    if not np.any(workload):
        raise ValueError("W: every entry is zero; there is nothing to answer")
    target_array = validate_targets(targets, workload.shape[0])
    zero_rows = np.flatnonzero(~np.any(workload != 0.0, axis=1))
    if zero_rows.size:
        raise ValueError(f"W: row {int(zero_rows[0])} is all zeros (a query that reads no cell needs no noise; drop it)")
    return workload, target_array


# ---------------------------------------------------------------------------------------------
# 4. Workload
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Workload:
    """A workload: query matrix ``matrix`` (m x d), variance targets ``targets`` (m,), one label
    per query (``labels``), and optionally the ``domain`` whose cells index the columns.

    Arrays are copied and made read-only. Query j must be answered with noise variance
    ``<= targets[j]``.
    """

    matrix: np.ndarray
    targets: np.ndarray
    labels: tuple[str, ...] = field(default=())
    domain: Domain | None = None

    def __post_init__(self) -> None:
        matrix = _check_matrix(self.matrix, "matrix")
        m, d = matrix.shape
        targets = validate_targets(self.targets, m)
        labels = self.labels
        if labels is None or (not isinstance(labels, str) and len(tuple(labels)) == 0):
            labels = tuple(f"q[{j}]" for j in range(m))
        if isinstance(labels, str):
            raise ValueError("labels must be a sequence of strings, not one string")
        labels = tuple(labels)
        if len(labels) != m:
            raise ValueError(f"labels has {len(labels)} entries but matrix has {m} rows")
        if not all(isinstance(lab, str) for lab in labels):
            raise ValueError("labels must all be strings")
        if self.domain is not None:
            if not isinstance(self.domain, Domain):
                raise ValueError(f"domain must be a Domain or None, got {type(self.domain).__name__}")
            if self.domain.size != d:
                raise ValueError(
                    f"domain has {self.domain.size} cells but matrix has {d} columns")
        object.__setattr__(self, "matrix", _readonly(matrix))
        object.__setattr__(self, "targets", _readonly(targets))
        object.__setattr__(self, "labels", labels)

    @property
    def num_queries(self) -> int:
        """m, the number of queries."""
        return self.matrix.shape[0]

    @property
    def num_cells(self) -> int:
        """d, the number of cells."""
        return self.matrix.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        """(m, d)."""
        return self.matrix.shape

    def __len__(self) -> int:
        return self.num_queries

    @staticmethod
    def stack(parts: Sequence["Workload"]) -> "Workload":
        """Concatenate workloads (rows, targets, labels in order) on the same domain / cells."""
        parts = list(parts)
        if not parts:
            raise ValueError("parts must hold at least one Workload")
        for i, p in enumerate(parts):
            if not isinstance(p, Workload):
                raise ValueError(f"parts[{i}] is a {type(p).__name__}, not a Workload")
        first = parts[0]
        for i, p in enumerate(parts[1:], start=1):
            if p.domain != first.domain:
                raise ValueError(f"parts[{i}] has domain {p.domain}, parts[0] has {first.domain}")
            if p.num_cells != first.num_cells:
                raise ValueError(
                    f"parts[{i}] has {p.num_cells} cells (columns), parts[0] has {first.num_cells}")
        return Workload(
            matrix=np.vstack([p.matrix for p in parts]),
            targets=np.concatenate([p.targets for p in parts]),
            labels=tuple(lab for p in parts for lab in p.labels),
            domain=first.domain,
        )


def workload_from_groups(
    domain: Domain,
    groups: Sequence[tuple[str, Mapping[str, np.ndarray], TargetLike]],
) -> Workload:
    """One Workload from query groups ``(name, per_attribute, target)``.

    Each group's matrix is ``kron_queries(domain, per_attribute)``; ``target`` is a scalar or one
    value per row of that group. Query labels are ``"name[i]"`` with i the row within the group.
    """
    groups = list(groups)
    if not groups:
        raise ValueError("groups must hold at least one (name, per_attribute, target) group")
    parts = []
    for g, group in enumerate(groups):
        try:
            name, per_attribute, target = group
        except (TypeError, ValueError):
            raise ValueError(
                f"groups[{g}] must be a (name, per_attribute, target) triple") from None
        mat = kron_queries(domain, per_attribute)
        m = mat.shape[0]
        tgt = np.asarray(target, dtype=float)
        if tgt.ndim == 0:
            tgt = np.full(m, float(tgt))
        elif tgt.shape != (m,):
            raise ValueError(
                f"targets of group {name!r} have shape {tgt.shape}, group has {m} queries")
        parts.append(Workload(mat, tgt, tuple(f"{name}[{i}]" for i in range(m)), domain))
    return Workload.stack(parts)


# ---------------------------------------------------------------------------------------------
# 5. Named workloads
# ---------------------------------------------------------------------------------------------


def prefix_workload(n: int, target: float = 1.0) -> Workload:
    """Prefix workload on one attribute ``x`` of size n: W = lower-triangular ones (n x n)."""
    n = check_integer(n, "n", 1)
    domain = Domain(("x",), (n,))
    return workload_from_groups(domain, [("prefix", {"x": prefix_queries(n)}, target)])


#: The six OMB race categories; race value r (index r-1, r = 1..63) is the non-empty subset of
#: these with bitmask r (bit k set = race PL94_RACES[k] reported).
PL94_RACES: tuple[str, ...] = (
    "white", "black", "aian", "asian", "nhpi", "other")


def pl94_workload(
    targets: tuple[float, float, float] | str = (1.0, 2.0, 4.0),
    uniform_target: float | None = None,
) -> Workload:
    """PL94-171 style workload (the paper's Section 7.2): 319 queries on 252 cells.

    Domain voting_age(2) x hispanic(2) x race(63); race index r-1 is the non-empty subset of the
    six OMB races with bitmask r. Query groups, in order:

    ========================  =======  =====================================
    group                     queries  target
    ========================  =======  =====================================
    ``voting_age`` marginal   2        targets[0]
    ``hispanic`` marginal     2        targets[0]
    ``race_single``           6        targets[0] (popcount 1, index order)
    ``race_multi``            57       targets[1] (popcount >= 2, index order)
    ``detailed`` (identity)   252      targets[2]
    ========================  =======  =====================================

    ``targets="uniform"`` or ``uniform_target=c`` sets every target to one value (c, default 1).
    """
    if isinstance(targets, str):
        if targets != "uniform":
            raise ValueError(f"targets must be a triple of numbers or 'uniform', got {targets!r}")
        uniform_target = 1.0 if uniform_target is None else uniform_target
    if uniform_target is not None:
        t_single = t_multi = t_cells = float(uniform_target)
    else:
        try:
            t_single, t_multi, t_cells = (float(t) for t in targets)
        except (TypeError, ValueError):
            raise ValueError(
                f"targets must be a triple of numbers or 'uniform', got {targets!r}") from None
    domain = Domain(("voting_age", "hispanic", "race"), (2, 2, 63))
    bitmask = np.arange(1, 64)
    popcount = ((bitmask[:, None] >> np.arange(6)) & 1).sum(axis=1)  # races in value r-1
    race_eye = np.eye(63)
    groups = [
        ("voting_age", {"voting_age": identity_queries(2)}, t_single),
        ("hispanic", {"hispanic": identity_queries(2)}, t_single),
        ("race_single", {"race": race_eye[popcount == 1]}, t_single),
        ("race_multi", {"race": race_eye[popcount >= 2]}, t_multi),
        ("detailed", {name: np.eye(n) for name, n in zip(domain.names, domain.sizes)}, t_cells),
    ]
    return workload_from_groups(domain, groups)


def age_pyramid_workload(low_target: float = 1.0, high_target: float = 10.0) -> Workload:
    """Age-pyramid workload (the paper's Section 7.5): 351 queries on 232 cells.

    Domain sex(2: male, female) x age(116: 0..115). Three groups -- ``male``, ``female``,
    ``both`` -- each with the 116 prefix ranges age in [0, x], x = 0..115, then [18, 115]
    (117 queries per group). Queries covering exactly [0, 17] or [18, 115] get ``low_target``
    (default 1), all others ``high_target`` (default 10).
    """
    n_age = 116
    domain = Domain(("sex", "age"), (2, n_age))
    lo = np.concatenate([np.zeros(n_age, dtype=int), [18]])
    hi = np.concatenate([np.arange(n_age), [n_age - 1]])
    ages = _interval_rows(n_age, lo, hi)
    tgt = np.full(n_age + 1, float(high_target))
    tgt[((lo == 0) & (hi == 17)) | ((lo == 18) & (hi == n_age - 1))] = float(low_target)
    groups = [
        ("male", {"sex": np.array([[1.0, 0.0]]), "age": ages}, tgt),
        ("female", {"sex": np.array([[0.0, 1.0]]), "age": ages}, tgt),
        ("both", {"age": ages}, tgt),
    ]
    return workload_from_groups(domain, groups)


def all_two_way_marginals(sizes: Sequence[int], target: float = 1.0) -> Workload:
    """All 2-way marginals of attributes ``a0, a1, ...`` with these sizes (pairs i < j in order).

    Each pair's group is labelled ``"ai,aj"`` and has n_i * n_j identity-query rows.
    """
    sizes = tuple(sizes)
    if len(sizes) < 2:
        raise ValueError(f"sizes must name at least 2 attributes, got {len(sizes)}")
    domain = Domain(tuple(f"a{i}" for i in range(len(sizes))), sizes)
    groups = []
    for i in range(len(sizes)):
        for j in range(i + 1, len(sizes)):
            a, b = domain.names[i], domain.names[j]
            groups.append((f"{a},{b}", {a: np.eye(sizes[i]), b: np.eye(sizes[j])}, target))
    return workload_from_groups(domain, groups)


def random_workload(d: int, m: int, seed: int | np.random.Generator | None = None,
                    target: float = 1.0) -> Workload:
    """Random workload (the paper's Section 7.4): m x d entries, +1 w.p. 0.2 else -1."""
    d = check_integer(d, "d", 1)
    m = check_integer(m, "m", 1)
    rng = np.random.default_rng(seed)
    matrix = np.where(rng.random((m, d)) < 0.2, 1.0, -1.0)
    domain = Domain(("x",), (d,))
    return Workload(matrix, np.full(m, float(target)),
                    tuple(f"random[{i}]" for i in range(m)), domain)


def random_range_workload(d: int, m: int, seed: int | np.random.Generator | None = None,
                          targets: str = "uniform") -> Workload:
    """m random range queries on one attribute of size d (see ``random_range_queries``).

    ``targets="uniform"``: all 1; ``targets="random"``: i.i.d. uniform(1, 10) from the same
    generator (drawn after the ranges).
    """
    d = check_integer(d, "d", 1)
    m = check_integer(m, "m", 1)
    if targets not in ("uniform", "random"):
        raise ValueError(f"targets must be 'uniform' or 'random', got {targets!r}")
    rng = np.random.default_rng(seed)
    matrix = random_range_queries(d, m, rng)
    tgt = np.ones(m) if targets == "uniform" else rng.uniform(1.0, 10.0, size=m)
    domain = Domain(("x",), (d,))
    return Workload(matrix, tgt, tuple(f"range[{i}]" for i in range(m)), domain)
