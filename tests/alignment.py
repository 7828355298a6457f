"""Arrays placed as a Dask worker may unpickle them: at a byte offset their dtype does not divide
(:func:`unaligned`), for the tests of ``mathematics.workload.aligned`` and ``runtime.alignment``."""
from __future__ import annotations

import numpy as np


def unaligned(array: np.ndarray, offset: int = 3) -> np.ndarray:
    """``array``'s values in a view ``offset`` bytes into a buffer (not aligned for a float64),
    in ``array``'s memory order."""
    if array.flags.f_contiguous and not array.flags.c_contiguous:
        return unaligned(array.T, offset).T
    raw = np.empty(array.nbytes + 16, np.uint8)
    view = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    assert not view.flags.aligned
    return view
