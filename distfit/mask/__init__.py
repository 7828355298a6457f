"""Masked pseudo-data (paper 003, docs/mask.md): ``distfit mask`` and the regression from its store."""
from distfit.mask.analysis import regression

__all__ = ["regression"]
