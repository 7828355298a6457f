"""Pieces (distfit.stores.pieces): a task's rows kept until a store's chunks are written from them,
each array checked as it is read against the shape, dtype and BLAKE3 digest written beside it."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from distfit.stores.checksum import chunk_digest
from distfit.stores.pieces import (
    FORMAT,
    PieceMismatch,
    open_pieces,
    piece_done,
    read_piece,
    remove_piece,
    write_piece,
)


@pytest.fixture
def written(tmp_path):
    directory = open_pieces(tmp_path / "pieces", "inputs a\n")
    rng = np.random.default_rng(7)
    arrays = {"cells": rng.normal(size=(5, 4)), "queries": rng.normal(size=(5, 3)), "ids": np.arange(5)}
    write_piece(directory, "county", 12, arrays, fsync=False)
    return directory, directory / "county" / "000000000012", arrays


def test_a_piece_reads_back_as_written_with_the_digest_a_stores_chunk_of_those_rows_has(written):
    directory, piece, arrays = written
    assert piece_done(directory, "county", 12) and not piece_done(directory, "county", 0)
    back = read_piece(directory, "county", 12)
    assert sorted(back) == sorted(arrays)
    for name, rows in arrays.items():
        np.testing.assert_array_equal(back[name], rows)
        assert back[name].dtype == rows.dtype
    manifest = json.loads((piece / "manifest.json").read_text())
    assert manifest["format"] == FORMAT and manifest["first"] == 12
    assert manifest["arrays"]["cells"]["blake3"] == chunk_digest("cells", 12, arrays["cells"]).hex()
    assert manifest["arrays"]["ids"] == {"shape": [5], "dtype": np.dtype(np.int64).str,
                                         "blake3": chunk_digest("ids", 12, arrays["ids"]).hex()}


def test_a_changed_byte_is_refused_as_read_naming_the_piece_and_the_array(written):
    directory, piece, _ = written
    path = piece / "queries.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10
    path.write_bytes(bytes(raw))
    assert piece_done(directory, "county", 12)  # the sizes hold: only the digest tells
    with pytest.raises(PieceMismatch, match=r"000000000012: array queries does not hash to the digest") as caught:
        read_piece(directory, "county", 12)
    assert caught.value.piece == piece
    again = pickle.loads(pickle.dumps(caught.value))  # raised in a task, re-raised in the driver
    assert isinstance(again, PieceMismatch) and again.piece == piece and str(again) == str(caught.value)
    remove_piece(directory, again)
    assert not piece.exists() and not piece_done(directory, "county", 12)


def test_a_reshaped_array_of_the_same_bytes_is_refused(written):
    directory, piece, arrays = written
    np.save(piece / "cells.npy", arrays["cells"].reshape(4, 5))
    with pytest.raises(PieceMismatch, match=r"array cells is <f8 \[4, 5\], written <f8 \[5, 4\]"):
        read_piece(directory, "county", 12)


@pytest.mark.parametrize("damage", ["manifest removed", "array removed", "array added", "array truncated"])
def test_a_piece_not_whole_is_not_done_and_is_refused(written, damage):
    directory, piece, arrays = written
    if damage == "manifest removed":
        (piece / "manifest.json").unlink()
    elif damage == "array removed":
        (piece / "ids.npy").unlink()
    elif damage == "array added":
        np.save(piece / "extra.npy", np.zeros(5))
    else:
        path = piece / "cells.npy"
        path.write_bytes(path.read_bytes()[:-8])
    assert not piece_done(directory, "county", 12)
    with pytest.raises(PieceMismatch):
        read_piece(directory, "county", 12)
    # a retry of its task replaces it whole
    write_piece(directory, "county", 12, arrays, fsync=False)
    assert piece_done(directory, "county", 12)
    np.testing.assert_array_equal(read_piece(directory, "county", 12)["cells"], arrays["cells"])


def test_a_whole_piece_is_kept_by_a_retry(written):
    directory, piece, arrays = written
    before = (piece / "manifest.json").stat().st_mtime_ns
    write_piece(directory, "county", 12, arrays, fsync=False)
    assert (piece / "manifest.json").stat().st_mtime_ns == before
    assert [p.name for p in (directory / "county").iterdir()] == [piece.name]  # nothing aside left


def test_pieces_of_other_inputs_or_an_earlier_format_are_emptied(written, tmp_path):
    directory, piece, _ = written
    open_pieces(directory, "inputs a\n")
    assert piece.exists()
    open_pieces(directory, "inputs b\n")
    assert not piece.exists() and (directory / "key").read_text() == f"{FORMAT}\ninputs b\n"
    (directory / "key").write_text("inputs b\n")  # as the format before manifests wrote it
    write_piece(directory, "county", 0, {"cells": np.zeros((1, 2))}, fsync=False)
    open_pieces(directory, "inputs b\n")
    assert not (directory / "county").exists()


def test_remove_piece_deletes_only_a_piece_of_its_directory(written, tmp_path):
    directory, piece, _ = written
    elsewhere = tmp_path / "other" / "county" / "000000000012"
    elsewhere.mkdir(parents=True)
    remove_piece(directory, PieceMismatch(elsewhere, "test"))
    assert elsewhere.exists() and piece.exists()


def test_rows_of_a_unit_are_digested_per_slab_and_a_reader_checks_only_the_slabs_it_reads(tmp_path):
    """Arrays of a row per unit written with a slab (the store's chunk of units) carry one digest
    per slab at the multiples of the slab, each a store's chunk digest of those rows; a reader of
    some rows gets only those and hashes only their slabs (a changed byte elsewhere is not read),
    and a changed byte in a slab it reads is refused; the other arrays are digested whole."""
    directory = open_pieces(tmp_path / "pieces", "inputs b\n")
    rng = np.random.default_rng(8)
    arrays = {"cells": rng.normal(size=(11, 3)), "per_class": rng.normal(size=(2, 3)), "index": np.arange(11) % 2}
    write_piece(directory, "block", 5, arrays, fsync=False, slab=4, sliced=("cells", "index"))
    piece = directory / "block" / "000000000005"
    manifest = json.loads((piece / "manifest.json").read_text())["arrays"]
    assert manifest["cells"]["slab"] == 4 and manifest["cells"]["blake3"] == [
        chunk_digest("cells", a, arrays["cells"][a - 5:b - 5]).hex() for a, b in ((5, 8), (8, 12), (12, 16))]
    assert manifest["per_class"]["blake3"] == chunk_digest("per_class", 5, arrays["per_class"]).hex()
    back = read_piece(directory, "block", 5, rows=(8, 12))
    np.testing.assert_array_equal(back["cells"], arrays["cells"][3:7])
    np.testing.assert_array_equal(back["index"], arrays["index"][3:7])
    np.testing.assert_array_equal(back["per_class"], arrays["per_class"])
    np.testing.assert_array_equal(read_piece(directory, "block", 5)["cells"], arrays["cells"])
    np.testing.assert_array_equal(read_piece(directory, "block", 5, rows=(0, 8))["cells"], arrays["cells"][:3])
    path = piece / "cells.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10  # the last row: the slab 12:16
    path.write_bytes(bytes(raw))
    np.testing.assert_array_equal(read_piece(directory, "block", 5, rows=(8, 12))["cells"], arrays["cells"][3:7])
    with pytest.raises(PieceMismatch, match="array cells does not hash to the digest it was written with"):
        read_piece(directory, "block", 5, rows=(12, 16))
    with pytest.raises(PieceMismatch, match="array cells does not hash"):
        read_piece(directory, "block", 5)
