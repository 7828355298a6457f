"""The data stage: :mod:`distfit.data.synthetic` (synthetic unit histograms and people, pure numpy),
:mod:`distfit.data.microdata` (CSV/Parquet microdata tabulated into a marginals store) and
:mod:`distfit.data.people` (synthetic people written as Parquet microdata). The Zarr data stores
themselves are :mod:`distfit.stores.data`."""
