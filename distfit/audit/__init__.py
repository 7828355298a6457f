"""The audit: every claim a store states, recomputed by code of its own (docs/architecture.md)."""
