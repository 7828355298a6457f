"""The ``distfit`` command line.

Subcommands: ``distfit solve`` plans one block with ``distfit.solve`` and prints its privacy
cost, certificate, privacy account and solver statistics (optionally the baselines at the same
privacy cost), as text, JSON (``--json``) and arrays (``--save``); ``distfit plan`` turns a
pipeline spec into a plan store (``distfit.plan.job``); ``distfit audit`` recomputes a plan
store's account (``distfit.audit.plan``); ``distfit synth`` writes synthetic unit histograms for a
spec's schema (``distfit.stores.data``); ``distfit tabulate`` turns person-level microdata (CSV,
Parquet) into the marginal counts a release needs (``distfit.data.microdata``); ``distfit release``
adds noise to unit histograms, tabulated marginals or microdata through a plan and writes a
sealed, resumable release store (``distfit.release.job``); ``distfit estimate`` post-processes a sealed
release into nonnegative, consistent (optionally integer) estimates of every query, a sealed,
resumable estimate store that never reads the data (``distfit.estimate.job``); ``distfit report`` writes plots and an
HTML page for a plan and optionally a release (``distfit.report.page``); ``distfit run`` does plan, audit, data, release, estimate and report into one run
directory with a manifest (``distfit.pipeline.run``). ``distfit mask`` releases a CSV's numeric columns as
masked pseudo-data, a sealed, resumable mask store (``distfit.mask.job``, handler ``distfit.cli.mask``;
docs/mask.md); ``distfit regress`` fits least squares on a mask store's columns, corrected for
its noise (``distfit.mask.regression``, handler ``distfit.cli.regressing``).

Exit codes: 0 success; 1 the solver could not certify its plan (``ConvergenceError``), an
output could not be written (disk full, no permission: any ``OSError``), an audit found a
mismatch, or a stage of ``distfit run`` failed (``RunFailure``); 130 interrupted (Ctrl-C at any
moment, start-up included: one line says what was kept, if anything, and how to resume;
``distfit.cli.interrupts``); 2 bad input (unknown workload,
unreadable or malformed ``.npz`` or spec, conflicting budget flags, a ``ValueError`` from the
library, a block too large for memory, a plan, release or estimate already at ``--out``, a store being
written by another process (``StoreLockedError``, naming it), an unreachable
scheduler or one refused (plain TCP without ``--insecure``, TLS without certificates), a plan that fails audit, data that does not fit the plan, bad microdata: a missing
column, a value outside its attribute's domain, an empty unit id, an unreadable file; for ``distfit regress``, a path that is not a sealed mask store or
one changed after its seal, an unknown column, the response among the regressors).
Every error is one line ``distfit: error: <message>`` on stderr. Output files are written to a
temporary file in the same directory and moved into place only once everything succeeded, so
no partial output file is ever left behind.

This module parses the arguments, dispatches to the command's handler and maps errors to exit
codes; the handlers are ``distfit.cli.solve`` (``distfit solve``, with ``distfit.cli.workloads``
and ``distfit.cli.outputs``), ``distfit.cli.planning`` (``distfit plan``), ``distfit.cli.auditing`` (``distfit audit``),
``distfit.cli.releasing`` (``distfit release``), ``distfit.cli.estimating`` (``distfit estimate``)
and ``distfit.cli.commands`` (the other pipeline commands). ``HANDLERS`` names each command's
handler by module and function, and only the command that runs has its module imported
(``importlib.import_module``): the commands' dependencies differ a lot (microdata reading pulls
dask.dataframe, pandas and pyarrow; the estimate stage numba; the report matplotlib; ``distfit
run`` all of them), and importing every handler up front would make ``distfit plan`` and ``distfit
audit`` on a small spec spend most of their time importing what they never use. This is a
dispatch table, not a lazy import: every module still imports its own dependencies at its top.
The exceptions mapped to exit codes below come from light modules (``distfit.runtime.failures``,
``distfit.solver.solve``, ``distfit.cli.errors``); Dask is imported only when a cluster is used
(``distfit.runtime.placement``: the boundary to Dask).
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import warnings
from typing import Any, Callable, Sequence

from distfit import __version__
from distfit.cli.errors import NOTHING_KEPT, PROG, Interrupted, OutputError, UsageError, print_error
from distfit.runtime.failures import ClusterError, RunFailure
from distfit.runtime.placement import Placement
from distfit.runtime.security import Transport
from distfit.solver.convergence import ConvergenceError
from distfit.spec.limits import ALPHA, BLOCK_GAP, DELTA, EPSILON, RHO, Range
from distfit.runtime.threads import blas_limit

#: ``distfit solve`` refuses a plan whose certified gap is above this (``distfit.solve``'s
#: ``max_gap``); a looser ``--gap-tolerance`` raises it to match (``distfit.cli.solve``).
DEFAULT_MAX_GAP = 1e-3

#: What ``distfit solve WORKLOAD`` accepts (resolved by ``distfit.cli.workloads.load_workload``).
WORKLOAD_HELP = (
    "a built-in workload: pl94 (PL94-171 style, targets 1/2/4), pl94-uniform (all targets 1), "
    "age-pyramid, prefix:N, ranges:D:M:SEED[:random] (M random ranges on D cells; targets 1, or "
    "uniform(1, 10) with :random), marginals:3x3x3 (all 2-way marginals of attributes of these "
    "sizes, targets 1); or a path to a .npz file with arrays W (m x d) and targets (m,)"
)

#: command -> (module, function) of its handler; the module is imported only when the command runs
#: (module docstring)
HANDLERS = {
    "solve": ("distfit.cli.solve", "cmd_solve"),
    "plan": ("distfit.cli.planning", "cmd_plan"),
    "audit": ("distfit.cli.auditing", "cmd_audit"),
    "synth": ("distfit.cli.commands", "cmd_synth"),
    "release": ("distfit.cli.releasing", "cmd_release"),
    "estimate": ("distfit.cli.estimating", "cmd_estimate"),
    "tabulate": ("distfit.cli.commands", "cmd_tabulate"),
    "report": ("distfit.cli.commands", "cmd_report"),
    "run": ("distfit.cli.commands", "cmd_run"),
    "export": ("distfit.cli.exporting", "cmd_export"),
    "mask": ("distfit.cli.mask", "cmd_mask"),
    "regress": ("distfit.cli.regressing", "cmd_regress"),
}


def command_handler(command: str) -> Callable[[argparse.Namespace], int]:
    """The handler of ``distfit COMMAND`` (``HANDLERS``), its module imported now."""
    module, function = HANDLERS[command]
    return getattr(importlib.import_module(module), function)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become ``UsageError`` (one line, exit 2, no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (``--units``, ``--refine-rounds``, ...),
    checked when the arguments are parsed, so a bad value is one line and exit 2 before any work."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value
    return parse


def column_names(text: str) -> list[str]:
    """An argparse ``type``: ``a,b,c`` -> ``["a", "b", "c"]`` (blanks around names dropped;
    ``--columns`` of ``distfit mask``, ``--x`` of ``distfit regress``), ``""`` -> ``[]`` (``--x ''``:
    no regressor); an empty name among others refused."""
    if not text.strip():
        return []
    names = [name.strip() for name in text.split(",")]
    if "" in names:
        raise argparse.ArgumentTypeError(f"an empty column name in {text!r}")
    return names


def positive_number(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (``--gap-tolerance``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def ranged(allowed: Range) -> Callable[[str], float]:
    """An argparse ``type``: a number in ``allowed``, the range the same value has in a spec
    (``distfit solve --rho``: ``privacy.rho``; docs/spec.md, "Ranges")."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if allowed.excludes(value):
            raise argparse.ArgumentTypeError(f"must be {allowed.text}, got {text}")
        return value
    return parse


def add_cluster_options(parser: argparse.ArgumentParser, serial_help: str) -> None:
    """``--cluster``, ``--workers`` and ``--serial``: where a command's tasks run (docs/design.md
    section 3), and ``--tls-*``/``--insecure``: how a ``--cluster`` is reached; read back as
    one value by :func:`placement_of`."""
    parser.add_argument("--cluster", metavar="ADDRESS|FILE",
                        help="scheduler address or scheduler file (default: a local multi-process cluster)")
    parser.add_argument("--workers", type=int, metavar="N", help="worker processes of the local cluster (default: cores)")
    parser.add_argument("--serial", action="store_true", help=serial_help)
    # How --cluster is reached (distfit.runtime.security, docs/deployment.md): TLS by default.
    parser.add_argument("--tls-ca-file", metavar="PEM", help="the --cluster's CA certificate (TLS; with --tls-cert)")
    parser.add_argument("--tls-cert", metavar="PEM", help="distfit's TLS certificate for --cluster, signed by that CA")
    parser.add_argument("--tls-key", metavar="PEM", help="its private key (unless in the --tls-cert file)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a --cluster over plain TCP: unencrypted, and whoever reaches it can run code")


def add_resumable_options(parser: argparse.ArgumentParser, store: str, kept: str, serial_help: str) -> None:
    """``--resume`` and ``--overwrite`` (which exclude each other:
    :func:`distfit.runtime.chunked_job.check_out`), then :func:`add_cluster_options`: the last
    options of a command that writes a ``store`` chunk by chunk (release, estimate, mask);
    ``kept``: what a resume keeps."""
    article = "an" if store[:1] in "aeiou" else "a"
    parser.add_argument("--resume", action="store_true", help=f"finish an interrupted {store} at --out ({kept})")
    parser.add_argument("--overwrite", action="store_true", help=f"replace {article} {store} already at --out")
    add_cluster_options(parser, serial_help=serial_help)


def add_test_seed(parser: argparse.ArgumentParser, store: str) -> None:
    """``--seed S``: a fixed noise seed (a whole number) in place of fresh entropy, for tests
    only: the ``store`` it writes is marked not private (release, mask)."""
    parser.add_argument("--seed", type=whole_number(0), metavar="S",
                        help=f"fixed noise seed, FOR TESTS ONLY: the {store} is marked not private")


#: The metavar of each input a pipeline command names as a positional argument (:func:`add_inputs`).
INPUT_METAVARS = {"spec": "SPEC.yaml", "plan": "PLAN.zarr", "release": "RELEASE.zarr"}
#: What each input is (its ``--help`` line).
INPUT_HELP = {
    "spec": "the pipeline spec, a YAML file (docs/spec.md)",
    "plan": "a plan store written by distfit plan (verified before it is used)",
    "release": "a sealed release store written by distfit release (verified before it is used)",
}
#: What each command's ``--out`` is, by its metavar (its ``--help`` line).
OUTPUT_HELP = {
    "PLAN.zarr": "the plan store to write (atomically: complete or not at all)",
    "ESTIMATE.zarr": "the estimate store to write (chunk by chunk, resumable, sealed when complete)",
    "DATA.zarr": "the data store to write (atomically, sealed with a checksum)",
    "RELEASE.zarr": "the release store to write (chunk by chunk, resumable, sealed when complete)",
    "DIR": "the directory to write (an empty or missing one, or an earlier one of this command)",
    "RUNDIR": "the run directory: missing, empty or an earlier run of the same spec (resumed)",
    "MASKED.zarr": "the mask store to write (block by block, resumable, sealed when complete)",
}


def add_inputs(parser: argparse.ArgumentParser, *inputs: str, out: str | None = None, **last: Any) -> None:
    """A pipeline command's positional ``inputs``, each shown as :data:`INPUT_METAVARS` says
    (``last``: more keywords of the last one, as ``nargs="?"``), then, given its metavar
    ``out``, the required ``--out`` it writes: the arguments every pipeline command starts with."""
    for name in inputs:
        parser.add_argument(name, metavar=INPUT_METAVARS[name],
                            **{"help": INPUT_HELP[name], **(last if name == inputs[-1] else {})})
    if out is not None:
        parser.add_argument("--out", required=True, metavar=out, help=OUTPUT_HELP[out])


def placement_of(args: argparse.Namespace) -> Placement | None:
    """The one :class:`distfit.runtime.placement.Placement` of a command's ``--cluster``,
    ``--workers`` and ``--serial`` (None for a command without them), checked as it is made
    (ValueError, one line naming the option: exit 2). ``main`` sets it as ``args.placement``
    before the handler runs; no handler reads these options itself."""
    if not hasattr(args, "serial"):
        return None
    transport = Transport(args.tls_ca_file, args.tls_cert, args.tls_key, insecure=args.insecure)
    return Placement(cluster=args.cluster, workers=args.workers, serial=args.serial, transport=transport)


#: Every command, in the order ``--help`` lists them: its one-line ``help`` and its ``description``
#: (``distfit COMMAND --help``); :func:`build_parser` adds one subparser for each.
COMMANDS: dict[str, dict[str, str]] = {
    "solve": {
        "help": "plan one block: optimal noise covariance, certificate and privacy account",
        "description": "Solve one block (distfit.solve) and report its privacy cost alpha, the certified "
                       "lower bound and gap, the exact privacy account and the solver statistics.",
    },
    "plan": {
        "help": "plan a pipeline spec: blocks on a Dask cluster, stitched account, Zarr plan store",
        "description": "Decompose the spec's workload into blocks, solve them on a Dask cluster and write the plan store.",
    },
    "audit": {
        "help": "recompute a plan's profiles, alpha and variances from its stored arrays (or a mask store's "
                "privacy account); exit 1 on mismatch",
    },
    "synth": {
        "help": "write synthetic unit histograms with the spec's schema (not private data)",
        "description": "Synthesise N units (skewed populations and categories, correlated attributes) as a "
                       "Zarr histograms store (units x cells), chunk by chunk, atomically. For a multi-level spec, "
                       "--out is a run directory: a US-shaped geography of N finest units (RUNDIR/geography.csv) "
                       "and every level's data store, each level's histograms the sums of its children's "
                       "(docs/geography.md); distfit run SPEC --out RUNDIR then releases them.",
    },
    "release": {
        "help": "release noisy answers for every unit: plan + data -> sealed Zarr release store",
        "description": "Per block and chunk of units draw z = chol(Sigma) xi and write L (B x + z) and each "
                       "query's answer to a release store (one Dask task per chunk); resumable, sealed with a checksum.",
    },
    "estimate": {
        "help": "nonnegative, consistent estimates from a sealed release (post-processing, no privacy cost)",
        "description": "Per unit, project the release onto nonnegative data vectors in the noise's metric and "
                       "write every workload query's estimate (and the data vector) to an estimate store (one Dask "
                       "task per release chunk); reads the plan and the release only, never the data; resumable, "
                       "sealed with a checksum.",
    },
    "tabulate": {
        "help": "tabulate person-level microdata (CSV, Parquet) into per-unit marginal counts",
        "description": "Read microdata (one row per person: the spec's attribute columns and unit column) in "
                       "partitions and write, per unit, the counts of each maximal query clique as a Zarr "
                       "marginals store (atomically); bad rows are reported by line.",
    },
    "report": {
        "help": "HTML report of a plan (and optionally a release): a publishable page, and with --data "
                "a confidential validation page",
        "description": "Write DIR/index.html, a self-contained page that may be published (plots inline as SVG): "
                       "what was released (tables, units), the privacy guarantee in plain words, each table's "
                       "accuracy in persons with 90% margins of error and its target as the spec states it, "
                       "the first answers and the plan's technical record (account, blocks, solver statistics, "
                       "variance/target with baselines for small workloads). With --data also "
                       "DIR/validation.html, CONFIDENTIAL: the release against the true data. Written "
                       "atomically; DIR may be missing, "
                       "empty or an earlier report (replaced); any other non-empty DIR is refused.",
    },
    "export": {
        "help": "CSV and Parquet tables of a release or estimate, with standard errors and 90%% margins of error",
        "description": "Write DIR/<table>.csv and DIR/<table>.parquet for every query group (one row per unit and "
                       "query: the query in words, the figure, se and moe90 where exactly known, the integer value) "
                       "and the data dictionary DIR/README.txt, dictionary.csv; every store verified first; atomic.",
    },
    "mask": {
        "help": "masked pseudo-data: a CSV's numeric columns scaled, noised and masked (paper 003)",
        "description": "Scale the chosen columns to [-1, 1] with public bounds, add Gaussian noise calibrated to "
                       "(epsilon, delta) and mask each block of rows by a Haar orthogonal matrix (one Dask task per "
                       "run of blocks); resumable, sealed with a checksum (docs/mask.md).",
    },
    "regress": {
        "help": "least squares from a mask store, corrected for its noise: coefficients and standard errors",
        "description": "Verify the mask store, then regress --y on --x (default: every other column) with an "
                       "intercept from its Gram matrix, corrected for the release's noise (errors in variables; "
                       "--naive: uncorrected), and print each coefficient with its standard error (docs/mask.md).",
    },
    "run": {
        "help": "the main job: plan + audit + (synthetic) data + release into RUNDIR, with a manifest",
        "description": "Plan the spec (default: the embedded PL94 pipeline), audit the plan, synthesise data "
                       "unless --data is given, release, and write RUNDIR/manifest.json. A rerun into the same "
                       "RUNDIR reuses the plan and data, resumes a partial release and skips a sealed one.",
    },
}


def build_parser() -> argparse.ArgumentParser:
    """The ``distfit`` argument parser: one subcommand per command (``args.command``; its
    handler is ``HANDLERS[args.command]``)."""
    parser = _Parser(
        prog=PROG,
        description="Differentially private linear-query release with per-query variance targets.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers = {name: commands.add_parser(name, **texts) for name, texts in COMMANDS.items()}
    solve_parser = parsers["solve"]
    solve_parser.add_argument("workload", metavar="WORKLOAD", help=WORKLOAD_HELP)
    solve_parser.add_argument("--basis", choices=("auto", "identity", "prefix"), default="auto",
                              help="basis B of the mechanism L (B x + z) (default: auto)")
    solve_parser.add_argument("--rho", type=ranged(RHO), help="zCDP budget: alpha = 2 rho, variances scaled to fit")
    solve_parser.add_argument("--epsilon", type=ranged(EPSILON), help="(epsilon, delta) budget, with --delta (exact)")
    solve_parser.add_argument("--delta", type=ranged(DELTA), help="(epsilon, delta) budget, with --epsilon")
    solve_parser.add_argument("--alpha", type=ranged(ALPHA), help="privacy-cost budget alpha = Delta^2")
    solve_parser.add_argument("--gap-tolerance", type=positive_number, default=1e-4, metavar="G",
                              help="stop once the certified relative gap is <= G (default 1e-4); "
                                   f"a plan above max(G, {DEFAULT_MAX_GAP:g}) is an error")
    solve_parser.add_argument("--json", metavar="OUT.json", help="write the report as JSON")
    solve_parser.add_argument("--save", metavar="OUT.npz",
                              help="write sigma, basis, recon, targets, profile, variances")
    solve_parser.add_argument("--baselines", action="store_true",
                              help="also run the Gaussian, hierarchical and matrix mechanisms at the same alpha")

    plan_parser = parsers["plan"]
    add_inputs(plan_parser, "spec", out="PLAN.zarr")
    add_cluster_options(plan_parser, serial_help="solve the blocks in this process, without Dask")
    plan_parser.add_argument("--overwrite", action="store_true", help="replace a plan already at --out")
    plan_parser.add_argument("--refine-rounds", type=whole_number(0), default=2, metavar="R", help="target-share refinement rounds (default 2)")
    plan_parser.add_argument("--gap-tolerance", type=ranged(BLOCK_GAP), metavar="G",  # default: plan.rounds.BLOCK_GAP
                             help="certify every block's plan within a factor 1 + G of the best plan of its target "
                                  "shares (default 1e-4); a draft plan at 0.1-0.5 takes a fraction of the time "
                                  "for up to that much more privacy cost")

    audit_parser = parsers["audit"]
    add_inputs(audit_parser, "plan")

    synth_parser = parsers["synth"]
    add_inputs(synth_parser, "spec")
    synth_parser.add_argument("--units", required=True, type=whole_number(1), metavar="N", help="number of units (>= 1)")
    synth_parser.add_argument("--out", required=True, metavar="DATA.zarr", help=OUTPUT_HELP["DATA.zarr"])
    synth_parser.add_argument("--seed", type=whole_number(0), metavar="S",
                              help="seed (default: fresh, stored in the data; a multi-level spec's: from its hash)")
    synth_parser.add_argument("--chunk-units", type=whole_number(1), metavar="C",
                              help="units per chunk (default: up to 4096, at most 16 MiB of counts)")
    synth_parser.add_argument("--overwrite", action="store_true", help="replace data already at --out")

    release_parser = parsers["release"]
    add_inputs(release_parser, "plan")
    release_parser.add_argument("--data", required=True, metavar="DATA",
                                help="a data store (distfit synth or distfit tabulate), or microdata: .csv, .csv.gz, "
                                     ".parquet, .pq or a directory of Parquet files (tabulated into RELEASE.zarr.data.zarr)")
    release_parser.add_argument("--out", required=True, metavar="RELEASE.zarr", help=OUTPUT_HELP["RELEASE.zarr"])
    add_test_seed(release_parser, "release")
    add_resumable_options(release_parser, "release", kept="written chunks are kept, missing ones drawn",
                          serial_help="release the chunks in this process, without Dask")

    estimate_parser = parsers["estimate"]
    add_inputs(estimate_parser, "plan", "release", out="ESTIMATE.zarr")
    estimate_parser.add_argument("--integer", action="store_true",
                                 help="integer estimates: each unit's cells rounded, its total kept")
    estimate_parser.add_argument("--method", default="auto",
                                 choices=("auto", "projection", "graphical", "graphical-exact", "graphical-local",
                                          "graphical-region-graph"),
                                 help="auto (default): the projection up to 2^22 cells, a graphical model "
                                      "(clique marginals; needs the graphical extra) above")
    add_resumable_options(estimate_parser, "estimate", kept="estimated chunks are kept",
                          serial_help="estimate the chunks in this process, without Dask")

    tabulate_parser = parsers["tabulate"]
    add_inputs(tabulate_parser, "spec")
    tabulate_parser.add_argument("--data", required=True, metavar="PEOPLE",
                                 help="microdata: .csv, .csv.gz, .parquet, .pq or a directory of Parquet files")
    tabulate_parser.add_argument("--out", required=True, metavar="DATA.zarr", help=OUTPUT_HELP["DATA.zarr"])
    tabulate_parser.add_argument("--plan", metavar="PLAN.zarr",
                                 help="also hold a marginal for every block of this plan (merged blocks)")
    tabulate_parser.add_argument("--chunk-units", type=whole_number(1), metavar="C",
                                 help="units per chunk (default: up to 4096, at most 16 MiB per chunk)")
    tabulate_parser.add_argument("--overwrite", action="store_true", help="replace marginals already at --out")
    tabulate_parser.add_argument("--level", metavar="NAME",
                                 help="for a multi-level spec: the level to tabulate (its unit column and tables)")
    add_cluster_options(tabulate_parser, serial_help="tabulate in this process, without a cluster")

    report_parser = parsers["report"]
    add_inputs(report_parser, "plan", "release", out="DIR", nargs="?", default=None)
    report_parser.add_argument("--data", metavar="DATA.zarr",
                               help="the release's data store: also writes DIR/validation.html (CONFIDENTIAL: the "
                                    "actual error of each answer against its promised sd; index.html is unchanged)")
    report_parser.add_argument("--estimate", metavar="ESTIMATE.zarr",
                               help="an estimate of the release (distfit estimate): adds raw against estimated "
                                    "answers (with --data, the error of each against the truth)")

    export_parser = parsers["export"]
    export_parser.add_argument("store", metavar="RELEASE_OR_ESTIMATE.zarr",
                               help="a sealed release or estimate store (verified before it is read)")
    export_parser.add_argument("--out", required=True, metavar="DIR", help=OUTPUT_HELP["DIR"])
    export_parser.add_argument("--plan", metavar="PLAN.zarr", help="the plan (default: the one the store names)")
    export_parser.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")

    mask_parser = parsers["mask"]
    mask_parser.add_argument("data", metavar="DATA.csv", help="a CSV (or .csv.gz) file with a header line")
    mask_parser.add_argument("--columns", required=True, type=column_names, metavar="A,B", help="the numeric columns to release")
    mask_parser.add_argument("--bounds", metavar="A=LO:HI,B=LO:HI", help="public bounds of every column")
    mask_parser.add_argument("--bounds-from-data", action="store_true",
                             help="use each column's range in the data: LEAKS it (the store is marked not private)")
    mask_parser.add_argument("--epsilon", required=True, type=float, help="(epsilon, delta) budget, with --delta")
    mask_parser.add_argument("--delta", required=True, type=float, help="(epsilon, delta) budget, with --epsilon")
    mask_parser.add_argument("--out", required=True, metavar="MASKED.zarr", help=OUTPUT_HELP["MASKED.zarr"])
    mask_parser.add_argument("--block-rows", type=int, metavar="N", help="rows per orthogonal block (> columns)")
    add_test_seed(mask_parser, "mask store")
    add_resumable_options(mask_parser, "mask store", kept="written blocks are kept, missing ones drawn",
                          serial_help="mask the blocks in this process, without Dask")

    regress_parser = parsers["regress"]
    regress_parser.add_argument("store", metavar="MASKED.zarr",
                                help="a sealed mask store written by distfit mask (verified before it is read)")
    regress_parser.add_argument("--y", required=True, metavar="COL", help="the response: a column of the store")
    regress_parser.add_argument("--x", type=column_names, metavar="A,B",
                                help="the regressors (default: every other column of the store; '' for none: the mean)")
    regress_parser.add_argument("--naive", action="store_true",
                                help="no correction: the OLS of the masked rows (biased towards zero), for comparison")

    run_parser = parsers["run"]
    add_inputs(run_parser, "spec", out="RUNDIR", nargs="?", default=None,
               help="pipeline spec (default: the embedded default pipeline, PL94)")
    run_parser.add_argument("--data", metavar="DATA",
                            help="a data store, or microdata (.csv, .csv.gz, .parquet, .pq, a directory of Parquet "
                                 "files) tabulated into RUNDIR/data.zarr (default: synthesise RUNDIR/data.zarr)")
    run_parser.add_argument("--units", type=whole_number(1), metavar="N",
                            help="units of synthetic data (default 10000; a rerun reuses the earlier data)")
    run_parser.add_argument("--geography", metavar="FILE",
                            help="with --data, for a multi-level spec: every unit of every level with its parent, "
                                 "empty units included (CSV: level,unit,parent; docs/geography.md)")
    run_parser.add_argument("--integer", action="store_true", help="integer estimates (each unit's total kept)")
    run_parser.add_argument("--nonnegative", action="store_true",
                            help="multi-level spec: publish the best linear unbiased estimates' nonnegative tables "
                                 "(children summing to parents; se and moe90 the unbiased estimates')")
    run_parser.add_argument("--no-estimate", dest="estimate", action="store_false",
                            help="skip the estimate stage (RUNDIR/estimate.zarr)")
    run_parser.add_argument("--no-report", dest="report", action="store_false",
                            help="skip the report (RUNDIR/report; distfit report draws it later from the stores)")
    add_cluster_options(run_parser, serial_help="plan and release in this process, without Dask")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 solver/output failure, 2 bad input,
    130 interrupted: one line, whenever Ctrl-C comes, parsing included)."""
    args = argparse.Namespace()
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except UsageError as error:
            print_error(error)
            return 2
        except SystemExit as exit_:  # --help, --version
            return exit_.code if isinstance(exit_.code, int) else 0
        if args.command is None:
            *others, last = COMMANDS
            print_error(f"a command is required: {', '.join(others)} or {last} (see distfit --help)")
            return 2
        args.placement = placement_of(args)
        handler = command_handler(args.command)
        with blas_limit():
            return handler(args)
    except KeyboardInterrupt as interrupt:
        # whatever was cut short (an unawaited zarr coroutine, a thread's read) may warn as it is
        # collected; after Ctrl-C the user gets one line
        warnings.simplefilter("ignore")
        print_error(f"interrupted; {interrupt.hint if isinstance(interrupt, Interrupted) else interrupted_hint(args)}")
        return 130
    except UsageError as error:
        print_error(error)
        return 2
    except (ConvergenceError, RunFailure) as error:
        print_error(error)
        return 1
    except (FileExistsError, ClusterError) as error:
        print_error(error)
        return 2
    except MemoryError as error:
        print_error(str(error) or "out of memory: the block is too large; cut the workload into blocks")
        return 2
    except ValueError as error:
        print_error(error)
        return 2
    except OutputError as error:
        print_error(error)
        return 1
    except OSError as error:  # disk full, no permission, a vanished file: what failed, on one line
        where = f"{error.filename}: " if error.filename else ""
        print_error(f"{where}{error.strerror or error}")
        return 1


def interrupted_hint(args: argparse.Namespace) -> str:
    """What an interrupted command kept and how to go on (every store is written atomically or
    resumably, so an interrupt never leaves a half-written store in use): a release or estimate
    keeps its chunks in ``--out`` once it exists; ``distfit run`` says what it kept itself
    (``Interrupted``, ``distfit.cli.commands.cmd_run``), so here it had not started."""
    command = getattr(args, "command", None)
    out = getattr(args, "out", None)
    if command == "release" and out is not None and os.path.exists(out):
        return (f"the chunks written so far are kept in {out} (incomplete, never read as a release); "
                "finish it with the same command and --resume")
    if command == "estimate" and out is not None and os.path.exists(out):
        return (f"the chunks estimated so far are kept in {out} (incomplete, never read as an estimate); "
                "finish it with the same command and --resume")
    if command == "mask" and out is not None and os.path.exists(out):
        return (f"the blocks written so far are kept in {out} (incomplete, never read as a mask store); "
                "finish it with the same command and --resume")
    return NOTHING_KEPT

if __name__ == "__main__":
    raise SystemExit(main())
