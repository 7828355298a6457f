"""Published tables: a release or estimate as CSV and Parquet, with standard errors and margins of error (docs/export.md)."""
