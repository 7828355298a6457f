"""What the spec generators here share (``generate_adult.py``, ``generate_marginals.py``): each
renders its YAML spec as text and hands it to :func:`write_or_check`, which writes it next to
the script or, with ``--check``, only says whether the file on disk is current (the tests run
``--check``: a generator edited without rerunning it fails them)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def write_or_check(output: Path, text: str, argv: Sequence[str], script: str, summary: str) -> int:
    """Write ``text`` to ``output`` and print ``wrote OUTPUT (summary)``; returns 0. With
    ``--check`` in ``argv`` write nothing: 0 if ``output`` holds ``text``, otherwise 1 and one
    line on stderr saying to rerun ``script``."""
    if "--check" in argv:
        current = output.read_text() if output.exists() else ""
        if current != text:
            print(f"{output} is out of date; run python {script}", file=sys.stderr)
            return 1
        return 0
    output.write_text(text)
    print(f"wrote {output} ({summary})")
    return 0
