"""The shared mathematics: the domain, workloads, the privacy profile and account, the variance
scale and block packing; pure functions on numpy arrays that every stage uses (docs/architecture.md)."""
