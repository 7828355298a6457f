"""files.create_nodes: the nodes it creates in one call are the ones zarr creates one call at a time."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from distfit.stores.files import create_nodes, filled_array, node_attrs, node_documents, open_arrays, write_array


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_create_nodes_writes_what_one_call_at_a_time_writes(tmp_path):
    labels = np.array(["a:x", "a:y", "b:éz"], dtype=object)
    index = np.array([0, 2], dtype=np.int64)
    config = {"write_empty_chunks": True}
    answers = dict(shape=(5, 2), dtype=np.float64, chunks=(5, 2), compressors=None,
                   dimension_names=("unit", "block_query"), config=config)
    done = dict(shape=(3,), dtype=np.uint8, chunks=(1,), fill_value=0, compressors=None,
                dimension_names=("chunk",), config=config, attributes={"n": 3})

    one = zarr.open_group(tmp_path / "one.zarr", mode="w-", zarr_format=3)
    one.create_group("blocks")
    g = one.create_group("blocks/b0")
    g.create_array("answers", **answers)
    write_array(g, "block_query", labels[index], dims=("block_query",))
    g.attrs.update({"block_index": 1, "attributes": ["a", "b"]})
    h = one.create_group("blocks/b1")
    write_array(h, "query_index", np.zeros(2, dtype=np.int64), dims=("block_query",))  # all fill: still on disk
    q = one.create_group("queries")
    q.attrs["labels"] = None
    write_array(q, "query", labels, dims=("query",))
    one.create_array("chunks/done", **done)

    many = zarr.open_group(tmp_path / "many.zarr", mode="w-", zarr_format=3)
    calls = []
    create_nodes(many, progress=lambda done, total: calls.append((done, total)), groups={"blocks": {}, "blocks/b0": {"block_index": np.int64(1), "attributes": ("a", "b")},
                        "blocks/b1": {}, "queries": {"labels": None}}, arrays={
        "blocks/b0/answers": answers,
        "blocks/b0/block_query": filled_array(labels[index], dims=("block_query",), where="b0"),
        "blocks/b1/query_index": filled_array(np.zeros(2, dtype=np.int64), dims=("block_query",), where="b1"),
        "queries/query": filled_array(labels, dims=("query",), where="queries/query"),
        "chunks/done": done})

    assert _tree(tmp_path / "many.zarr") == _tree(tmp_path / "one.zarr")
    assert [done for done, _ in calls] == sorted(done for done, _ in calls) and calls[-1] == (9, 9)
    assert (tmp_path / "many.zarr/blocks/b1/query_index/c/0").is_file()
    assert list(zarr.open_group(tmp_path / "many.zarr", mode="r")["blocks/b0/block_query"][...]) == ["a:x", "b:éz"]


def test_create_nodes_refuses_a_node_already_there(tmp_path):
    root = zarr.open_group(tmp_path / "s.zarr", mode="w-", zarr_format=3)
    write_array(root, "x", np.arange(3), dims=("i",))
    with pytest.raises(Exception, match="x"):
        create_nodes(root, {}, {"x": filled_array(np.arange(3), dims=("i",), where="x")})
    assert np.array_equal(root["x"][...], np.arange(3))


@pytest.mark.parametrize("where", ["local", "memory"])
def test_node_attrs_are_the_members_attrs(tmp_path, where):
    store = tmp_path / "n.zarr" if where == "local" else zarr.storage.MemoryStore()
    root = zarr.open_group(store, mode="w-", zarr_format=3, attributes={"root": 1})
    g = root.create_group("a/b", attributes={"x": [1, 2.5, None], "s": "é"})
    g.create_array("c", shape=(3,), dtype=np.int64, attributes={"y": {"z": True}})
    root.create_group("a/b/c2")
    write_array(root, "d", np.arange(2), dims=("i",))
    expected = {name: dict(node.attrs) for name, node in root.members(max_depth=None)}
    assert node_attrs(root) == expected
    assert node_attrs(root["a"]) == {name: dict(node.attrs) for name, node in root["a"].members(max_depth=None)}
    assert expected["a/b/c"] == {"y": {"z": True}} and expected["a/b/c2"] == {}


def test_open_arrays_opens_what_getitem_opens(tmp_path):
    root = zarr.open_group(tmp_path / "o.zarr", mode="w-", zarr_format=3)
    write_array(root, "a/x", np.arange(4), dims=("i",))
    write_array(root, "y", np.array(["p", "q"], dtype=object), dims=("j",))
    opened = open_arrays(root, ["a/x", "y"])
    assert [opened[n].metadata for n in ("a/x", "y")] == [root["a/x"].metadata, root["y"].metadata]
    opened["a/x"][1:3] = [7, 8]  # writable, as the group is
    assert root["a/x"][...].tolist() == [0, 7, 8, 3]
    with pytest.raises(FileNotFoundError):
        open_arrays(root, ["missing"])


def test_node_documents_are_zarrs_members_and_the_walk_stays_out_of_the_arrays_chunks(tmp_path, monkeypatch):
    """Every node under a group, as zarr lists them, read from its zarr.json; the walk never
    enters an array's folder (its chunks' directories: one per chunk)."""
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    inner = root.create_group("inner")
    for group in (root, inner):
        array = group.create_array("rows", shape=(40, 3), chunks=(4, 3), dtype="f8")
        array[...] = np.arange(120.0).reshape(40, 3)
    walked = []
    real_walk = os.walk

    def walk(top, *args, **kwargs):
        for entry in real_walk(top, *args, **kwargs):
            walked.append(Path(entry[0]))
            yield entry

    monkeypatch.setattr(os, "walk", walk)
    docs = node_documents(root)
    assert sorted(docs) == sorted(path for path, _ in root.members(max_depth=None))
    assert docs["inner/rows"]["node_type"] == "array" and docs["inner"]["node_type"] == "group"
    assert not [p for p in walked if p.name == "c" or "c" in p.relative_to(tmp_path / "s.zarr").parts]
