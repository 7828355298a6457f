"""What a worker runs for ``distfit mask``: the block tasks (the driver is :mod:`distfit.mask.job`).

A task takes a run of blocks (consecutive zarr chunks of the store); for each it reads the
block's rows of the staged input (:func:`distfit.stores.mask.open_input`), scales them
(:func:`distfit.mask.scaling.scale_rows`), draws and applies the block's noise and mask from
its own stream (:func:`distfit.mask.haar.mask_block`, :func:`distfit.mask.haar.block_stream`)
and writes the rows and, last, the block's done marker
(:meth:`distfit.stores.release_chunks.ChunkWriter.write_arrays`). Deterministic in its
arguments, so a retried task rewrites identical bytes. Memory: one block's arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distfit.mask.haar import block_stream, mask_block
from distfit.mask.scaling import scale_rows
from distfit.runtime.threads import blas_limit
from distfit.stores.mask import open_input
from distfit.stores.release_chunks import ChunkWriter

__all__ = ["MaskJob", "mask_block_task", "mask_blocks_task"]


@dataclass(frozen=True, eq=False)
class MaskJob:
    """Everything a block task needs (small; one per session). ``entropy`` is kept out of
    ``repr`` so it never reaches a log or an error message."""

    out_path: str
    input_path: str
    sizes: tuple[int, ...]   # the rows of each block
    chunk_units: int         # the rows of every block but the last
    centre: np.ndarray       # (p,) of the data columns
    scale: np.ndarray        # (p,)
    sigma: float
    entropy: int = field(repr=False)

    def span(self, block: int) -> tuple[int, int]:
        """The rows ``start, stop`` of block ``block``."""
        start = block * self.chunk_units
        return start, start + int(self.sizes[block])


def mask_block_task(job: MaskJob, block: int, values, writer: ChunkWriter) -> int:
    """Release block ``block`` (module docstring) from the input array ``values`` through
    ``writer`` (queued: written once the writer is flushed). Returns its rows."""
    start, stop = job.span(block)
    scaled = scale_rows(np.asarray(values[start:stop]), job.centre, job.scale)
    with blas_limit():
        rows = mask_block(scaled, job.sigma, block_stream(job.entropy, block))
    writer.write_arrays(block, start, {"masked": rows})
    return stop - start


def mask_blocks_task(job: MaskJob, blocks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """One Dask task: :func:`mask_block_task` for each of ``blocks`` in turn, the input and the
    store opened once. Returns ``(block, rows)`` per block; each block is marked done as it is
    written, so an interrupted task leaves its finished blocks done."""
    values = open_input(job.input_path)
    with ChunkWriter(job.out_path) as writer:  # leaving it waits for the last block's writes
        return tuple((block, mask_block_task(job, block, values, writer)) for block in blocks)
