"""Estimates from a sealed release: nonnegative, consistent, integer (post-processing, docs/design.md section 7)."""
