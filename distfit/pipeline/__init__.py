"""``distfit run``: the stages chained into a run directory with its manifest (docs/architecture.md)."""
