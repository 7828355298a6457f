"""Where the work runs: the Dask cluster, chunked jobs over units, BLAS thread limits and the
stage failure type (docs/architecture.md). Importing the package imports nothing heavy."""
