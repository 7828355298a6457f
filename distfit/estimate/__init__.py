"""Estimates from a sealed release: nonnegative, consistent, integer (post-processing, DESIGN.md section 7)."""
