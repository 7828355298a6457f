"""README.md's five-minute tutorial, run as written: every figure it shows is what the commands
print today.

The tutorial's transcripts (code blocks whose lines start with ``$ ``) are run in order in an
empty directory, with its YAML files written as the text says, and each shown output line must
appear in what the command printed (stdout and stderr together), in order; a ``...`` line stands
for lines not shown. Tolerances, stated: every number is compared exactly as printed (the plans
of these specs are deterministic), except what is noise or timing by nature: the dashboard URL,
``seconds``, and a checksum shown truncated (``sha256:2908a2b1...``: a release drawn with fresh
entropy), which match any value. The worker count of a local cluster is the machine's: the
README was run on 2 cores, and ``distfit run`` without ``--workers`` starts one worker process
a core (``os.cpu_count()``; README, "How to run on a cluster"), so a shown ``local cluster
with 2 worker processes`` is expected with this machine's count. The default plan's checksum is
shown as OpenBLAS's AVX2 kernels give it; on a core with AVX-512 kernels the one README gives
for those is expected instead (the plan's last bits follow the kernels' rounding). The tutorial's Python block
is run too and must not fail.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TUTORIAL = README[README.index("\n## Five-minute tutorial\n"):README.index("\n### Real microdata")]

#: Output that differs run to run by nature, masked on both sides before comparing.
VOLATILE = [
    (re.compile(r"http://127\.0\.0\.1:\d+/status"), "http://127.0.0.1:PORT/status"),
    (re.compile(r"^(\s*seconds\s+)\S+$"), r"\1S"),
    (re.compile(r"sha256:[0-9a-f]{8}\.\.\.$"), "sha256:ANY"),
]

#: A local cluster's line: its worker count is the cores of the machine that ran the command.
WORKERS = re.compile(r"local cluster with (\d+) worker processes")


#: OpenBLAS's cores with AVX-512 dgemm kernels; README gives the default plan's checksum on them.
AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
AVX512_CHECKSUM = re.compile(r"its checksum is `(sha256:[0-9a-f]{64})`")
SHOWN_PLAN_CHECKSUM = re.compile(r"^(\s*plan checksum\s+)sha256:[0-9a-f]{64}$")


def _blas_core() -> str:
    """OpenBLAS's core, as numpy's own copy of it reports it (the tutorial's commands compute with
    numpy's and scipy's, which pick the same core). threadpoolctl lists only libraries already
    loaded, numpy's once numpy is imported; it lists others too (scs, which cvxpy loads in a
    pytest-xdist process that ran the SDP references, bundles an OpenBLAS built for Prescott), so
    numpy's is picked by its directory (``numpy.libs`` in a wheel), else the first OpenBLAS."""
    np.ones(1).dot(np.ones(1))  # numpy and its OpenBLAS loaded
    found = [info for info in threadpoolctl.threadpool_info() if info.get("internal_api") == "openblas"]
    numpy_own = [info for info in found if Path(info.get("filepath", "")).parent.name.startswith("numpy")]
    return str((numpy_own or found or [{}])[0].get("architecture", "")).lower()


def _on_this_machine(line: str) -> str:
    """A shown output line as this machine prints it: one worker process a core, and the plan
    checksum README gives for this machine's BLAS kernels (AVX2, or AVX-512)."""
    line = WORKERS.sub(f"local cluster with {os.cpu_count() or 1} worker processes", line)
    if _blas_core() in AVX512_CORES:
        line = SHOWN_PLAN_CHECKSUM.sub(lambda m: m.group(1) + AVX512_CHECKSUM.search(README).group(1), line)
    return line


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)\n```", text, flags=re.S)]


def _transcript(body: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of a ``$ `` block; a heredoc belongs to its command."""
    steps: list[tuple[str, list[str]]] = []
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = [line[2:]]
            if "<<'EOF'" in line:
                i += 1
                while lines[i] != "EOF":
                    command.append(lines[i])
                    i += 1
                command.append("EOF")
            steps.append(("\n".join(command), []))
        elif steps:
            steps[-1][1].append(line)
        i += 1
    return steps


def _normalise(line: str) -> str:
    line = line.rstrip()
    for pattern, replacement in VOLATILE:
        line = pattern.sub(replacement, line)
    return line


def _printed_lines(output: str) -> list[str]:
    # the progress meters rewrite their line with carriage returns
    return [_normalise(part) for part in re.split(r"[\r\n]", output)]


def _check_output(command: str, expected: list[str], output: str) -> None:
    printed = _printed_lines(output)
    position = 0
    for want in (_normalise(_on_this_machine(line)) for line in expected):
        if want in ("...", ""):
            continue
        pattern = re.compile(re.escape(want).replace("sha256:ANY", "sha256:[0-9a-f]{64}"))
        found = next((i for i in range(position, len(printed)) if pattern.fullmatch(printed[i])), None)
        if found is None:
            pytest.fail(f"README shows {want!r} for `{command.splitlines()[0]}`, but it printed:\n{output}")
        position = found + 1


def test_the_tutorial_prints_what_readme_shows(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    blocks = _code_blocks(TUTORIAL)
    yaml_blocks = [body for lang, body in blocks if lang == "yaml"]
    # Step 7: "Save this as my.yaml"; step 8: copy it to my-budget.yaml, rename, append the budget.
    assert "Save this as `my.yaml`" in TUTORIAL and "Copy `my.yaml` to `my-budget.yaml`" in TUTORIAL
    my_yaml = yaml_blocks[0] + "\n"
    (tmp_path / "my.yaml").write_text(my_yaml)
    budget = my_yaml.replace("name: my-first", "name: my-budget", 1) + yaml_blocks[1] + "\n"
    (tmp_path / "my-budget.yaml").write_text(budget)
    # the worker count is checked, as this machine's, wherever the README shows a local cluster
    assert WORKERS.search(TUTORIAL), "the tutorial shows no local cluster line"
    ran = 0
    for lang, body in blocks:
        if lang or not body.startswith("$ "):
            continue
        for command, expected in _transcript(body):
            result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                                    text=True, timeout=600)
            output = result.stderr + result.stdout  # distfit's progress (stderr) precedes its summary
            assert result.returncode == 0, f"`{command}` failed:\n{output}"
            if command.startswith("ls "):  # ls prints columns on a terminal, one name a line here
                assert set(result.stdout.split()) == set(" ".join(expected).split()), output
            else:
                _check_output(command, expected, output)
            ran += 1
    assert ran >= 8, "the tutorial's transcripts were not found"
    python_blocks = [body for lang, body in blocks if lang == "python"]
    assert python_blocks
    for body in python_blocks:
        result = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
