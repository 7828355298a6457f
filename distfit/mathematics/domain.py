"""The domain: an ordered tuple of categorical attributes with their sizes.

A data set is a count vector ``x`` over the ``d = n_1 * ... * n_k`` cells of the domain. Cells are
ordered row-major in the domain's attribute order (the first attribute varies slowest), exactly as
``np.ravel_multi_index(values, domain.shape)`` (docs/design.md section 1). Every store records its
domain as a ``schema`` attribute; ``Domain.from_schema`` is the one way back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from distfit.checks import check_integer


@dataclass(frozen=True)
class Domain:
    """An ordered tuple of attributes (``names``) with their sizes (``sizes``).

    Cells are the tuples of attribute values, ordered row-major (first attribute slowest), so a
    cell's index is ``np.ravel_multi_index(values, domain.shape)``.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        names = tuple(self.names) if not isinstance(self.names, str) else None
        if names is None:
            raise ValueError(f"names must be a sequence of strings, got {self.names!r}")
        if not names:
            raise ValueError("names must hold at least one attribute")
        for nm in names:
            if not isinstance(nm, str) or not nm:
                raise ValueError(f"names must be nonempty strings, got {nm!r}")
        if len(set(names)) != len(names):
            dup = sorted({nm for nm in names if names.count(nm) > 1})
            raise ValueError(f"names must be unique, duplicated: {dup}")
        try:
            sizes_in = tuple(self.sizes)
        except TypeError:
            raise ValueError(f"sizes must be a sequence of integers, got {self.sizes!r}") from None
        if len(sizes_in) != len(names):
            raise ValueError(
                f"sizes has {len(sizes_in)} entries but names has {len(names)}; lengths must match")
        sizes = tuple(check_integer(s, f"sizes[{nm!r}]", 1) for nm, s in zip(names, sizes_in))
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "sizes", sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes as an array shape (for ``np.ravel_multi_index`` / reshape of ``x``)."""
        return self.sizes

    @property
    def size(self) -> int:
        """Number of cells d = product of the sizes."""
        return math.prod(self.sizes)

    def index(self, name: str) -> int:
        """Position of attribute ``name`` in the domain order (ValueError if unknown)."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown attribute {name!r}; domain has {list(self.names)}") from None

    def size_of(self, name: str) -> int:
        """Size of attribute ``name``."""
        return self.sizes[self.index(name)]

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any]) -> "Domain":
        """The domain a store's ``schema`` attribute describes (``{"attributes": [...], "sizes": [...]}``)."""
        return cls(tuple(schema["attributes"]), tuple(schema["sizes"]))

    def schema(self) -> dict[str, list]:
        """The ``schema`` attribute stores write for this domain (inverse of ``from_schema``)."""
        return {"attributes": list(self.names), "sizes": list(self.sizes)}
