"""Specs at scale: how long reading, validating and hashing a spec takes as it grows.

Usage::

    python benchmarks/bench_spec.py [--attributes 100 300 1000] [--values 10]
                                    [--python-yaml-max-groups 50000] [--keep DIR]

For each N of ``--attributes`` it writes the spec "N attributes of ``--values`` values, every
2-way marginal" (N(N-1)/2 groups, identity queries, target 1) twice: written out (one line per
group) and as the shorthand (one group ``{name: pairs, marginals: {order: 2}, target: 1}``),
and it times, in the same process one after another:

- the floors: ``yaml.safe_load`` (PyYAML's pure-Python loader; skipped above
  ``--python-yaml-max-groups`` groups, where it takes minutes and gigabytes) and
  ``yaml.load(..., Loader=yaml.CSafeLoader)`` (libyaml's parser) of the written-out file; both
  as a user would call them (the garbage collector on);
- ``load_spec`` of the written-out file and of the shorthand file (read, validate, expand);
- ``spec_hash`` (canonical JSON of every group and its SHA-256) and ``group_triples()`` with
  ``targets`` (what planning reads first), on the loaded spec.

Times are CPU seconds of this process (``time.process_time``; the machine is shared and wall
time swings with the load); ``load_spec`` also gets its wall time. The ratios put each figure
next to the floor measured in the same run, and ``us/group`` shows whether the cost per group
stays flat as the spec grows (it must: loading is linear in the spec's size). Nothing is
asserted.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.spec.parse import load_spec  # noqa: E402
from tests.spec.helpers import pairs_text  # noqa: E402


def timed(function, *args):
    """(result, CPU seconds, wall seconds) of ``function(*args)``, after a collection."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    result = function(*args)
    return result, time.process_time() - cpu, time.perf_counter() - wall


def read_python(path: Path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def read_libyaml(path: Path):
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=yaml.CSafeLoader)


def planning_input(spec):
    return spec.group_triples(), spec.targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attributes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--values", type=int, default=10)
    parser.add_argument("--python-yaml-max-groups", type=int, default=50_000,
                        help="skip yaml.safe_load above this many groups (default 50000)")
    parser.add_argument("--keep", type=Path, default=None, help="write the specs here and keep them")
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, PyYAML {yaml.__version__} (libyaml: "
          f"{bool(getattr(yaml, '__with_libyaml__', False))}), cores {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("CPU seconds unless marked wall; ratios against the floors of the same run\n")
    header = (f"{'groups':>8} {'form':<9} {'MB':>6} {'safe_load':>9} {'CSafe':>7} {'load_spec':>9} "
              f"{'(wall)':>7} {'us/group':>8} {'/safe':>6} {'/CSafe':>6} {'hash':>6} {'triples':>7}")
    print(header)
    print("-" * len(header))
    directory = args.keep or Path(tempfile.mkdtemp(prefix="bench_spec_"))
    directory.mkdir(parents=True, exist_ok=True)
    for n in args.attributes:
        groups = n * (n - 1) // 2
        written = directory / f"pairs_{n}.yaml"
        short = directory / f"pairs_{n}_shorthand.yaml"
        written.write_text(pairs_text(n, args.values, False), encoding="utf-8")
        short.write_text(pairs_text(n, args.values, True), encoding="utf-8")
        safe = None
        if groups <= args.python_yaml_max_groups:
            _, safe, _ = timed(read_python, written)
        data, csafe, _ = timed(read_libyaml, written)
        del data
        hashes = {}
        for form, path in (("written", written), ("shorthand", short)):
            spec, cpu, wall = timed(load_spec, path)
            assert len(spec.groups) == groups
            hashes[form], hash_cpu, _ = timed(getattr, spec, "spec_hash")
            _, triples_cpu, _ = timed(planning_input, spec)
            megabytes = path.stat().st_size / 1e6
            print(f"{groups:>8,} {form:<9} {megabytes:>6.2f} "
                  f"{'-' if safe is None else f'{safe:.2f}':>9} {csafe:>7.2f} {cpu:>9.2f} "
                  f"{wall:>7.2f} {cpu / groups * 1e6:>8.1f} "
                  f"{'-' if safe is None else f'{cpu / safe:.2f}':>6} {cpu / csafe:>6.2f} "
                  f"{hash_cpu:>6.2f} {triples_cpu:>7.2f}")
            del spec
        same = "same" if hashes["written"] == hashes["shorthand"] else "DIFFERENT"
        print(f"{'':>8} spec hash, written out and shorthand: {same} ({hashes['written'][:12]})")
        if args.keep is None:
            written.unlink()
            short.unlink()
    if args.keep is None:
        directory.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
