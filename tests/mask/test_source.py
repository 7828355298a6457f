"""Reading the chosen columns of a CSV (distfit.mask.source): values checked, lines named."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mask.source import check_header, read_columns


def write(tmp_path, text: str, name: str = "d.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_columns_are_read_in_order_chunk_by_chunk(tmp_path):
    rows = "\n".join(f"{i},{2 * i},x{i}" for i in range(10))
    path = write(tmp_path, "a,b,c\n" + rows + "\n")
    check_header(path, ["b", "a"])
    blocks = list(read_columns(path, ["b", "a"], 4))
    assert [len(b) for b in blocks] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate(blocks), [[2 * i, i] for i in range(10)])


@pytest.mark.parametrize("body,message", [
    ("1,2\n3,x\n", "line 3, column 'b': value 'x' is not a number"),
    ("1,2\n3,\n", "line 3, column 'b': a missing value"),
    ("1,2\n3,nan\n", "line 3, column 'b': a missing value"),
    ("1,2\n3,inf\n", "line 3, column 'b': value inf is not finite"),
    ("1,True\n3,False\n", "line 2, column 'b': value 'True' is not a number"),
    ("", "no data rows"),
])
def test_a_bad_value_is_refused_naming_its_line_and_column(tmp_path, body, message):
    path = write(tmp_path, "a,b\n" + body)
    with pytest.raises(ValueError, match=message):
        list(read_columns(path, ["a", "b"], 1))


def test_the_header_is_checked(tmp_path):
    with pytest.raises(ValueError, match="no column 'z' \\(columns: a, b\\)"):
        check_header(write(tmp_path, "a,b\n1,2\n"), ["a", "z"])
    with pytest.raises(ValueError, match="no such file"):
        check_header(tmp_path / "missing.csv", ["a"])
    with pytest.raises(ValueError, match=".csv or .csv.gz"):
        check_header(write(tmp_path, "a\n1\n", "d.txt"), ["a"])
    with pytest.raises(ValueError, match="empty file"):
        check_header(write(tmp_path, ""), ["a"])
