"""``distfit solve``'s WORKLOAD argument: a built-in workload name or a ``.npz`` file.

Built-in names (``distfit.cli.main.WORKLOAD_HELP``): ``pl94``, ``pl94-uniform``, ``age-pyramid``, ``prefix:N``,
``ranges:D:M:SEED[:random]`` and ``marginals:AxBxC``, built by ``distfit.mathematics.workload``; a
``.npz`` archive holds arrays ``W`` (m x d) and ``targets`` (m,). A built-in block whose dense
matrices would not fit in memory (``distfit.solver.solve.estimated_memory`` against
``default_memory_limit``) is refused before its matrix is built. Bad input raises
``UsageError`` (exit code 2), a too-large block ``MemoryError`` (also exit code 2).
"""
from __future__ import annotations

import math
import os
import re
import zipfile
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from distfit.cli.errors import UsageError
from distfit.solver.solve import default_memory_limit, estimated_memory
from distfit.mathematics.workload import (
    age_pyramid_workload,
    all_two_way_marginals,
    pl94_workload,
    prefix_workload,
    random_range_workload,
)

@dataclass(frozen=True)
class LoadedWorkload:
    """A resolved WORKLOAD: its name as given, where it came from, W (m x d) and targets (m,)."""

    name: str
    source: str  # "builtin" or "npz"
    matrix: np.ndarray
    targets: np.ndarray


def _int_field(text: str, what: str, spec: str) -> int:
    """One integer field of a built-in name (``prefix:N``...); ``UsageError`` naming it otherwise."""
    if not re.fullmatch(r"[+-]?\d+", text.strip()):
        raise UsageError(f"workload {spec!r}: {what} must be an integer, got {text!r}")
    return int(text)


def _check_block_memory(spec: str, num_queries: int, num_cells: int) -> None:
    """Refuse a built-in workload too large to solve before building its matrix."""
    if num_queries < 1 or num_cells < 1:
        return  # the builder raises the precise ValueError
    needed = estimated_memory(num_queries, num_cells)
    limit = default_memory_limit()
    if needed > limit:
        raise MemoryError(
            f"workload {spec!r}: a {num_queries} x {num_cells} block needs about "
            f"{needed / 2**30:.1f} GiB of dense matrices, over the limit of {limit / 2**30:.1f} GiB; "
            "cut the workload into blocks (distfit plan, docs/design.md section 2)"
        )


def _builtin(spec: str) -> Callable[[], Any] | None:
    """A zero-argument builder of the named built-in workload, or None if ``spec`` names none."""
    if spec == "pl94":
        return pl94_workload
    if spec == "pl94-uniform":
        return lambda: pl94_workload(uniform_target=1.0)
    if spec == "age-pyramid":
        return age_pyramid_workload
    kind, sep, rest = spec.partition(":")
    if not sep:
        return None
    if kind == "prefix":
        n = _int_field(rest, "N", spec)
        _check_block_memory(spec, n, n)
        return lambda: prefix_workload(n)
    if kind == "ranges":
        fields = rest.split(":")
        if len(fields) not in (3, 4):
            raise UsageError(f"workload {spec!r}: expected ranges:D:M:SEED or ranges:D:M:SEED:random")
        d = _int_field(fields[0], "D", spec)
        m = _int_field(fields[1], "M", spec)
        seed = _int_field(fields[2], "SEED", spec)
        if seed < 0:
            raise UsageError(f"workload {spec!r}: SEED must be >= 0, got {seed}")
        targets = fields[3] if len(fields) == 4 else "uniform"
        if targets not in ("uniform", "random"):
            raise UsageError(f"workload {spec!r}: the targets field must be 'uniform' or 'random', got {targets!r}")
        _check_block_memory(spec, m, d)
        return lambda: random_range_workload(d, m, seed, targets)
    if kind == "marginals":
        sizes = [_int_field(s, "every attribute size", spec) for s in rest.lower().split("x")]
        if any(s < 1 for s in sizes):
            raise UsageError(f"workload {spec!r}: attribute sizes must be >= 1, got {sizes}")
        num_cells = math.prod(sizes)
        num_queries = sum(a * b for i, a in enumerate(sizes) for b in sizes[i + 1:])
        _check_block_memory(spec, num_queries, num_cells)
        return lambda: all_two_way_marginals(sizes)
    return None


def _load_npz(path: str) -> LoadedWorkload:
    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
    except FileNotFoundError:
        raise UsageError(f"workload {path!r}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"workload {path!r}: is a directory, not a .npz file") from None
    except OSError as error:
        raise UsageError(f"workload {path!r}: cannot read it ({error.strerror or error})") from None
    if magic.startswith(b"\x93NUMPY"):
        raise UsageError(f"workload {path!r}: holds a single .npy array, not a .npz archive with W and targets")
    if not magic.startswith(b"PK"):
        raise UsageError(f"workload {path!r}: not a .npz archive (a zip of arrays W and targets)")
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"workload {path!r}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"workload {path!r}: is a directory, not a .npz file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(f"workload {path!r}: cannot read it as a .npz file ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UsageError(f"workload {path!r}: holds a single .npy array, not a .npz archive with W and targets")
    with archive:
        missing = [key for key in ("W", "targets") if key not in archive.files]
        if missing:
            found = ", ".join(archive.files) or "none"
            raise UsageError(f"workload {path!r}: missing array {' and '.join(missing)} (found: {found})")
        arrays = {}
        for key in ("W", "targets"):
            try:
                arrays[key] = np.asarray(archive[key])
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                raise UsageError(f"workload {path!r}: cannot read array {key} ({error})") from None
            if not (np.issubdtype(arrays[key].dtype, np.number) or arrays[key].dtype == bool):
                raise UsageError(f"workload {path!r}: array {key} is not numeric (dtype {arrays[key].dtype})")
    matrix, targets = arrays["W"], arrays["targets"]
    if matrix.ndim != 2:
        raise UsageError(f"workload {path!r}: W must be a 2-D (m x d) matrix, got shape {matrix.shape}")
    if targets.ndim != 1 or targets.shape[0] != matrix.shape[0]:
        raise UsageError(
            f"workload {path!r}: targets must have shape ({matrix.shape[0]},) (one per row of W), got {targets.shape}"
        )
    return LoadedWorkload(path, "npz", matrix.astype(float), targets.astype(float))


def load_workload(spec: str) -> LoadedWorkload:
    """Resolve WORKLOAD: a built-in name (see ``distfit.cli.main.WORKLOAD_HELP``) or a path to a ``.npz`` file.

    Built-in names win over files of the same name; anything ending in ``.npz`` or naming an
    existing file is read as a ``.npz`` archive. Raises ``UsageError`` for anything else.
    """
    builder = _builtin(spec)
    if builder is not None:
        try:
            workload = builder()
        except ValueError as error:
            raise UsageError(f"workload {spec!r}: {error}") from None
        return LoadedWorkload(spec, "builtin", np.asarray(workload.matrix), np.asarray(workload.targets))
    if spec.endswith(".npz") or os.path.exists(spec):
        return _load_npz(spec)
    raise UsageError(
        f"unknown workload {spec!r}: use pl94, pl94-uniform, age-pyramid, prefix:N, ranges:D:M:SEED, "
        "marginals:AxBxC, or a path to a .npz file with arrays W and targets"
    )
