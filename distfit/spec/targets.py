"""Per-query variance targets of a query group: a number, a list, a target file or a target rule.

``parse_target`` turns a group's ``target`` into one target per query (the group's row-major
query order); the forms and the rule ``B * w_j**P * (1 + J * u_j)`` are described in the schema
reference, ``pipelines/README.md`` ("Query groups", ``target``). ``check_targets`` is the one
parse-time target check (every target in :data:`distfit.spec.limits.TARGET`, [1e-6, 1e12]:
``docs/spec.md``, "Ranges"); the other is ``distfit.solver.solve``'s (finite and > 0,
``distfit.mathematics.workload.validate_workload``).
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distfit.checks import check_integer
from distfit.mathematics.margins import MOE90_Z, variance_of_cv, variance_of_moe
from distfit.spec.fields import check_section, is_number, is_sequence, show, type_name
from distfit.spec.limits import TARGET
from distfit.spec.model import AttributeQuery, SpecError
from distfit.spec.schema import TARGET_FILE_KEYS, TARGET_MARGIN_KEYS, TARGET_RULE_KEYS

__all__ = ["check_targets", "parse_target", "stated_target"]


def check_targets(targets: np.ndarray, problem: Callable[[int], SpecError]) -> np.ndarray:
    """Return ``targets`` if every one is in :data:`distfit.spec.limits.TARGET` ([1e-6, 1e12]:
    finite, positive and far enough from the ends of float64 that every stage after can compute
    with it, docs/spec.md "Ranges"), else raise ``problem(j)`` for the first bad query j.

    This is the one parse-time target check (house rule: targets are checked when a spec is
    parsed and in ``solve()``, nowhere else). ``problem`` words the error for the way the targets
    were written, because each form names the fault its own way and tests pin the messages:
    ``target: must be in [1e-06, 1e+12], got -1`` (a number), ``target[2]: must be in ..., got 0``
    (a list), ``target.file: value [1] of 'neg.npy' must be in ...`` (a file), ``target: the rule
    gives query [1] the target inf; ...`` (a rule).
    """
    bad = TARGET.outside(targets)
    if np.any(bad):
        raise problem(int(np.flatnonzero(bad)[0]))
    return targets


def _file_value(value: float) -> int | float:
    """A target read from a file, as its message shows it (``-1``, not ``-1.0``)."""
    return int(value) if np.isfinite(value) and value == int(value) else float(value)


def _read_target_file(raw: Any, path: str, base_dir: Path, expected: int) -> np.ndarray:
    """``{file: PATH}``: the ``expected`` targets in a ``.csv`` (numbers only) or ``.npy`` file."""
    if not isinstance(raw, str) or not raw:
        raise SpecError(path, f"expected a file path (a string), got {type_name(raw)} {show(raw)}")
    file_path = Path(raw)
    if not file_path.is_absolute():
        file_path = base_dir / file_path
    suffix = file_path.suffix.lower()
    if suffix not in (".csv", ".npy"):
        raise SpecError(path, f"unsupported target file {raw!r}: use .csv or .npy")
    if suffix == ".npy":
        try:
            array = np.load(file_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise SpecError(path, f"cannot read {raw!r}: {reason}") from None
        if not isinstance(array, np.ndarray) or not (
                np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
            raise SpecError(path, f"{raw!r} must hold a numeric array, got dtype {getattr(array, 'dtype', '?')}")
        if array.ndim == 2 and 1 in array.shape:
            array = array.ravel()
        if array.ndim != 1:
            raise SpecError(path, f"{raw!r} must hold a 1-D array (or one row or column), "
                                  f"got shape {array.shape}")
        values = array.astype(float)
    else:
        try:
            text = file_path.read_text(encoding="utf-8")
        except OSError as error:
            raise SpecError(path, f"cannot read {raw!r}: {error.strerror or error}") from None
        except UnicodeDecodeError:
            raise SpecError(path, f"cannot read {raw!r}: not UTF-8 text") from None
        numbers_read: list[float] = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            for token in re.split(r"[,\s]+", line.split("#", 1)[0].strip()):
                if not token:
                    continue
                try:
                    numbers_read.append(float(token))
                except ValueError:
                    raise SpecError(path, f"{raw!r} line {line_number}: {token!r} is not a number "
                                          "(a target .csv holds numbers only, no header)") from None
        values = np.array(numbers_read, dtype=float)
    if values.size != expected:
        raise SpecError(path, f"expected {expected} values (one per query), got {values.size} "
                              f"in {raw!r}")
    return check_targets(values, lambda j: SpecError(
        path, f"value [{j}] of {raw!r} must be {TARGET.text}, got {_file_value(values[j])}"))


def _rule_number(raw: Mapping, key: str, path: str, default: float, minimum: float | None,
                 strict: bool) -> float:
    """A finite number of a target rule (``minimum``: > it when ``strict``, else >= it)."""
    if key not in raw:
        return default
    value = raw[key]
    where = f"{path}.{key}"
    if not is_number(value):
        raise SpecError(where, f"expected a number, got {type_name(value)} {show(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(where, f"must be finite, got {show(value)}")
    if minimum is not None and (number <= minimum if strict else number < minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise SpecError(where, f"must be finite and {bound}, got {show(value)}")
    return number


def _rule_jitter(seed: int, group: str, count: int) -> np.ndarray:
    """The pseudo-random numbers ``u_j`` in [0, 1) of a target rule (pipelines/README.md): the
    first 8 bytes of SHA-256 of ``"{seed}:{group}:{j}"``, big-endian, divided by 2**64."""
    return np.array([
        int.from_bytes(hashlib.sha256(f"{seed}:{group}:{j}".encode("utf-8")).digest()[:8], "big")
        / 2.0**64 for j in range(count)], dtype=float)


def _query_widths(queries: Sequence[tuple[str, AttributeQuery]]) -> np.ndarray:
    """Cells of the group's marginal that each query reads (row-major query order): the
    product of the per-attribute counts of nonzero entries; ``[1.]`` for the grand total."""
    widths = np.ones(1)
    for _, query in queries:
        widths = np.kron(widths, np.count_nonzero(query.matrix, axis=1).astype(float))
    return widths


def _rule_targets(raw: Mapping, path: str, group: str,
                  queries: Sequence[tuple[str, AttributeQuery]]) -> np.ndarray:
    """A target rule: query j gets ``base * w_j**width_power * (1 + jitter * u_j)``."""
    if "base" not in raw:
        raise SpecError(path, "missing required key 'base' (a target rule is {base: B, "
                              "width_power: P, jitter: J, seed: S}; or give {file: PATH})")
    base = _rule_number(raw, "base", path, 1.0, 0.0, strict=True)
    power = _rule_number(raw, "width_power", path, 0.0, None, strict=False)
    jitter = _rule_number(raw, "jitter", path, 0.0, 0.0, strict=False)
    seed = 0
    if "seed" in raw:
        seed = raw["seed"]
        try:
            seed = check_integer(seed, f"{path}.seed", 0)
        except ValueError:  # the spec's own words (field path first, the YAML type), pinned by tests
            raise SpecError(f"{path}.seed", f"expected an integer >= 0, got {type_name(seed)} "
                                            f"{show(seed)}") from None
    widths = _query_widths(queries)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        targets = base * widths ** power
        if jitter:
            targets = targets * (1.0 + jitter * _rule_jitter(seed, group, widths.size))
    return check_targets(targets, lambda j: SpecError(
        path, f"the rule gives query [{j}] the target {float(targets[j])!r}; targets must be "
              f"{TARGET.text}"))


def _positive(raw: Mapping, key: str, path: str) -> float:
    value = raw.get(key)
    if not is_number(value) or not (math.isfinite(float(value)) and float(value) > 0):
        raise SpecError(f"{path}.{key}", f"expected a finite number > 0, got {show(value)}")
    return float(value)


def _margin_target(raw: Mapping, path: str) -> float:
    """The variance of a target stated as a margin of error or a CV (docs/spec.md, "Targets from
    margins of error"): ``{moe: M}`` is ``(M / 1.645)**2`` (the 90% margin of error, as the ACS
    prints it: :mod:`distfit.mathematics.margins`), ``{cv: C, at: N}`` is ``(C * N)**2`` (a
    coefficient of variation C for a count of N). One form, nothing else beside it."""
    if "moe" in raw:
        others = sorted(set(raw) - {"moe"})
        if others:
            raise SpecError(path, f"{{moe: M}} stands alone, not with {', '.join(others)}")
        variance, shown = variance_of_moe(_positive(raw, "moe", path)), f"moe {raw['moe']} (at 90%, z = {MOE90_Z})"
    else:
        others = sorted(set(raw) - {"cv", "at"})
        if others or "cv" not in raw or "at" not in raw:
            raise SpecError(path, "a coefficient of variation is {cv: C, at: N} (both, nothing else)")
        variance, shown = variance_of_cv(_positive(raw, "cv", path), _positive(raw, "at", path)), \
            f"cv {raw['cv']} at {raw['at']}"
    check_targets(np.array([variance]), lambda _: SpecError(
        path, f"{shown} is the variance {variance:.6g}, which must be {TARGET.text}"))
    return variance


def stated_target(raw: Any) -> dict[str, float] | None:
    """A target written in users' terms, as the spec's canonical form keeps it: ``{"moe": M}``
    or ``{"cv": C, "at": N}`` (floats) for a ``target`` that :func:`parse_target` accepted in
    one of those forms, else None (a number, a list, a file or a rule: the variances are the
    terms). The report states each group's target in these terms (docs/spec.md, "Targets from
    margins of error")."""
    if not isinstance(raw, Mapping) or not any(key in raw for key in TARGET_MARGIN_KEYS):
        return None
    return {key: float(raw[key]) for key in TARGET_MARGIN_KEYS if key in raw}


def parse_target(raw: Any, path: str, base_dir: Path, expected: int, group: str = "",
                 queries: Sequence[tuple[str, AttributeQuery]] = ()) -> np.ndarray:
    """The ``expected`` targets of group ``group`` (its per-attribute ``queries``, schema order)
    from the spec's ``target`` value ``raw`` at field ``path``; target files are read relative to
    ``base_dir``. SpecError naming the field on the first problem."""
    if is_number(raw):
        try:
            value = float(raw)
        except OverflowError:  # an integer beyond the floats
            value = math.inf
        check_targets(np.array([value]), lambda _: SpecError(path, f"must be {TARGET.text}, got {show(raw)}"))
        return np.full(expected, value)
    if isinstance(raw, Mapping):
        check_section(raw, path, "a target", TARGET_FILE_KEYS + TARGET_RULE_KEYS + TARGET_MARGIN_KEYS)
        if any(key in raw for key in TARGET_MARGIN_KEYS):
            return np.full(expected, _margin_target(raw, path))
        if "file" in raw:
            rule_keys = [key for key in TARGET_RULE_KEYS if key in raw]
            if rule_keys:
                raise SpecError(path, f"give {{file: PATH}} or a rule ({', '.join(rule_keys)}), "
                                      "not both")
            return _read_target_file(raw["file"], f"{path}.file", base_dir, expected)
        return _rule_targets(raw, path, group, queries)
    if is_sequence(raw):
        items = list(np.asarray(raw).ravel()) if isinstance(raw, np.ndarray) else list(raw)
        for j, item in enumerate(items):
            if not is_number(item):
                raise SpecError(f"{path}[{j}]", f"expected a number, got {type_name(item)} {show(item)}")
        if len(items) != expected:
            raise SpecError(path, f"expected {expected} values (one per query), got {len(items)}")
        values = np.array([float(item) for item in items], dtype=float)
        return check_targets(values, lambda j: SpecError(
            f"{path}[{j}]", f"must be {TARGET.text}, got {show(items[j])}"))
    raise SpecError(path, f"expected a number, a list of numbers or {{file: PATH}} (or a rule "
                          f"{{base: B, ...}}, or {{moe: M}} or {{cv: C, at: N}}), got {type_name(raw)} {show(raw)}")

