"""The HTML report of a plan, its release and estimate (docs/architecture.md)."""
