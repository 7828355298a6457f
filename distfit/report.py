"""``distfit report``: a plan store (and optionally a release store) in, an HTML report out.

``distfit report PLAN.zarr [RELEASE.zarr] --out DIR`` (DESIGN.md section 5) writes
``DIR/index.html`` and PNG plots (matplotlib, Agg backend):

* ``privacy_curve.png``   epsilon(delta) of the plan, delta from 1e-12 to 1e-2 (log x axis),
  exact (:func:`distfit.privacy.epsilon_for_delta` at the plan's alpha);
* ``block_alpha.png``     each block's privacy cost alpha (bars, sorted), with its certified
  lower bound where that is finite;
* ``variance_ratio.png``  histogram of variance/target over all queries, with a line at 1
  (SM-II meets every accuracy target at exactly 1 when the spec gives no privacy budget) and,
  when the spec's workload is small (domain of at most :data:`BASELINE_MAX_CELLS` cells), the
  baselines' max ratios at the plan's alpha (:func:`distfit.solver.baselines.compare_baselines`);
* ``answers_<j>.png``     with a release: the noisy answers of the first few queries for the
  first units with 95% confidence intervals ``answer +- 1.96 sqrt(variance)``;
* ``calibration.png``     with a release and its data (``--data``, :func:`distfit.stores.data.open_data`):
  query by query, the actual error of each released answer against its promised standard
  deviation (log-log scatter with the 1.96 sd line) and the histogram of the standardised
  errors ``z = (answer - true) / sd`` against N(0, 1); the page gives the share within 1.96 sd
  (95% expected) and within 1 sd (68.3%). The true answers are computed from the data's block
  marginals (:func:`distfit.release.noise.true_block_answers`) for at most
  :data:`CALIBRATION_ANSWERS` answers (the first units). This section is derived from the
  confidential data: the page says so, and such a report is for the data owner's validation,
  not for publication.

The page also holds the privacy account (alpha, rho, the epsilon/delta table), the planner's
decisions and a table of per-block solver statistics and certificate gaps. It is
self-contained: relative PNG links, no scripts, no external URLs.

Writing is atomic: the report is built in a staging directory next to ``DIR``
(``<DIR>.incomplete-<random>``) and renamed into place (:func:`distfit.stores.files.move_into_place`).
``DIR`` may be missing, an empty directory, or a previous report (it holds the marker file
:data:`MARKER`), which is replaced; anything else at ``DIR`` (a file, a non-empty directory
without the marker) is refused with ``FileExistsError`` (exit 2 on the command line).
Bad inputs (no plan store, not a plan, not a sealed release, a release of another plan) raise
``ValueError`` (exit 2).
"""
from __future__ import annotations

import html
import math
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distfit.privacy import epsilon_for_delta
from distfit.release.noise import calibration, query_answers, true_block_answers
from distfit.solver.baselines import compare_baselines
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data
from distfit.stores.lock import store_lock
from distfit.stores.files import STAGING_MARKER, move_into_place
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release

MARKER = ".distfit-report"
BASELINE_MAX_CELLS = 5000
CURVE_DELTAS = np.logspace(-12, -2, 41)
ANSWER_QUERIES = 4   # error-bar plots for the first few queries
ANSWER_UNITS = 20    # ... over the first units
BLOCK_BARS = 60      # most blocks drawn in the alpha-per-block plot
Z95 = 1.959963984540054
#: Most (unit, query) answers the calibration compares with the truth (the first units).
CALIBRATION_ANSWERS = 2_000_000
#: Most points drawn in the calibration scatter (an even subsample beyond).
CALIBRATION_POINTS = 20_000

__all__ = ["BASELINE_MAX_CELLS", "MARKER", "ReportResult", "write_report"]


@dataclass
class ReportResult:
    path: str
    plots: list[str] = field(default_factory=list)
    baselines: dict[str, float] | None = None
    baseline_note: str = ""
    calibration: dict | None = None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _check_out(path: Path) -> None:
    """Raise unless ``path`` may be replaced by a report (module docstring)."""
    if path.is_symlink() or not path.is_dir():
        raise FileExistsError(f"{path}: exists and is not a directory; refusing to replace it")
    if (path / MARKER).is_file():
        return
    if any(path.iterdir()):
        raise FileExistsError(
            f"{path}: a non-empty directory that is not a distfit report (no {MARKER} file); "
            "refusing to replace it")


def _fmt(x: Any, digits: int = 6) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return f"{x:.{digits}g}" if math.isfinite(x) else str(x)
    return str(x)


def _e(x: Any) -> str:
    return html.escape(_fmt(x))


# --------------------------------------------------------------------------------------------
# plots


def _plot_privacy_curve(plt, alpha: float, out: Path) -> None:
    eps = [epsilon_for_delta(alpha, float(d)) for d in CURVE_DELTAS]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(CURVE_DELTAS, eps, marker=".", color="C0")
    ax.set_xscale("log")
    ax.set_xlabel("delta")
    ax.set_ylabel("epsilon")
    ax.set_title(f"Privacy curve epsilon(delta), alpha = {alpha:.4g}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _plot_block_alpha(plt, blocks: list[dict], out: Path) -> None:
    """The blocks' alphas, largest first: all of them up to :data:`BLOCK_BARS`, else the
    largest BLOCK_BARS (the title says how many are shown; the table lists every block)."""
    order = sorted(blocks, key=lambda b: b["alpha"], reverse=True)[:BLOCK_BARS]
    x = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.35 * len(order) + 2), 4.0))
    ax.bar(x, [b["alpha"] for b in order], color="C0", label="block alpha")
    lb = [(i, b["lower_bound"]) for i, b in enumerate(order) if math.isfinite(b["lower_bound"])]
    if lb:
        ax.scatter([i for i, _ in lb], [v for _, v in lb], color="C3", marker="_", s=300, zorder=3,
                   label="certified lower bound")
    ax.set_xticks(x)
    ax.set_xticklabels([b["id"] for b in order], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("alpha")
    shown = f"the {len(order)} largest of {len(blocks)} blocks" if len(order) < len(blocks) else "every block"
    ax.set_title(f"Privacy cost per block ({shown})")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _plot_variance_ratio(plt, ratios: np.ndarray, baselines: dict[str, float] | None, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    finite = ratios[np.isfinite(ratios)]
    hi = max([1.0, float(finite.max(initial=1.0))] + list((baselines or {}).values())) * 1.05
    lo = min(1.0, float(finite.min(initial=1.0))) * 0.95
    bins = 40 if not baselines else np.linspace(lo, hi, 60)  # bars stay visible next to the baselines
    ax.hist(finite, bins=bins, color="C0", alpha=0.8, label="SM-II queries")
    ax.axvline(1.0, color="k", linestyle="--", label="target (ratio 1)")
    for i, (name, r) in enumerate(sorted((baselines or {}).items())):
        ax.axvline(r, color=f"C{i + 1}", linestyle="-", label=f"{name}: max {r:.3g}")
    if baselines and max(baselines.values()) > 20 * max(1.0, float(finite.max(initial=1.0))):
        ax.set_xscale("log")
    ax.set_xlabel("variance / target")
    ax.set_ylabel("queries")
    ax.set_title("Variance relative to target")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _plot_answers(plt, answers: np.ndarray, sd: float, units: list[str], label: str, out: Path) -> None:
    x = np.arange(answers.shape[0])
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.errorbar(x, answers, yerr=Z95 * sd, fmt="o", capsize=3, color="C0")
    ax.set_xticks(x)
    ax.set_xticklabels(units, rotation=60, ha="right", fontsize=7)
    ax.set_xlabel("unit")
    ax.set_ylabel("noisy answer")
    ax.set_title(f"{label}: answers with 95% intervals (+-{Z95 * sd:.3g})", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _plot_calibration(plt, z: np.ndarray, sd: np.ndarray, out: Path) -> None:
    """Left: |actual error| against the promised sd per answer (log-log) with the 1.96 sd line;
    right: histogram of the standardised errors with the N(0, 1) density."""
    error = np.abs(z) * sd
    step = max(1, error.size // CALIBRATION_POINTS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    shown_sd, shown_error = sd[::step], np.maximum(error[::step], 1e-12)
    left.scatter(shown_sd, shown_error, s=3, alpha=0.3, color="C0", label="released answers")
    grid = np.geomspace(max(float(sd.min()), 1e-12), float(sd.max()) * 1.05, 50)
    left.plot(grid, Z95 * grid, color="C3", label="1.96 x promised sd")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("promised standard deviation")
    left.set_ylabel("|released - true|")
    left.set_title(f"actual error vs promise ({error.size} answers)", fontsize=9)
    left.legend(fontsize=8, loc="lower right")
    left.grid(True, which="both", alpha=0.2)
    bins = np.linspace(-5, 5, 81)
    right.hist(np.clip(z, -5, 5), bins=bins, density=True, color="C0", alpha=0.7, label="z = error / sd")
    x = np.linspace(-5, 5, 400)
    right.plot(x, np.exp(-x * x / 2) / math.sqrt(2 * math.pi), color="C3", label="N(0, 1)")
    for edge in (-Z95, Z95):
        right.axvline(edge, color="grey", linestyle="--", linewidth=1)
    right.set_xlabel("standardised error")
    right.set_title(f"{np.mean(np.abs(z) <= Z95):.1%} within 1.96 sd (95% expected)", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _calibration(plan, release, data_path) -> tuple[dict, np.ndarray, np.ndarray]:
    """Standardised errors of the first units' released answers (module docstring)."""
    data = open_data(data_path)
    if data.units != int(release.attrs.get("units", -1)):
        raise ValueError(f"{data_path}: holds {data.units} units, the release {release.attrs.get('units')}; "
                         "give the data the release was made from")
    m = len(plan.queries_targets)
    units = max(1, min(data.units, CALIBRATION_ANSWERS // max(m, 1)))
    ids = np.asarray(release.unit_ids[:units])
    data_ids = np.asarray(data.unit_ids[:units]) if hasattr(data, "unit_ids") else ids
    if not np.array_equal(ids, data_ids):
        raise ValueError(f"{data_path}: its unit ids differ from the release's; give the data the "
                         "release was made from")
    rows = []
    for bid in plan.block_ids:
        block = plan.block(bid)
        rows.append((block.query_index, true_block_answers(block, data.block_counts(block.attributes, 0, units))))
    true = query_answers(rows, m)
    noisy = np.asarray(release.answers[:units], dtype=float)
    result = calibration(noisy, true, release.variances)
    z = result.pop("z")
    result["units"] = units
    sd = np.broadcast_to(np.sqrt(np.asarray(release.variances, dtype=float)), z.shape).ravel()
    return result, z.ravel(), sd


# --------------------------------------------------------------------------------------------
# baselines


def _baselines(plan) -> tuple[dict[str, float] | None, str]:
    """Max variance/target of each baseline at the plan's alpha, or None and why not."""

    try:
        spec = parse_spec(plan.attrs["spec"])
    except (KeyError, ValueError) as exc:
        return None, f"baselines skipped: the plan's spec could not be parsed ({exc})"
    cells = spec.domain.size
    if cells > BASELINE_MAX_CELLS:
        return None, (f"baselines skipped: the domain has {cells} cells, more than "
                      f"{BASELINE_MAX_CELLS} for the dense baselines")
    try:
        workload = spec.workload()
        targets = np.asarray(plan.queries_targets, dtype=float)
        W = np.asarray(workload.matrix, dtype=float)
        if W.shape[0] != targets.shape[0]:
            return None, "baselines skipped: the spec's workload does not match the plan's queries"
        results = compare_baselines(W, targets, float(plan.attrs["alpha"]))
    except (ValueError, MemoryError, np.linalg.LinAlgError) as exc:
        return None, f"baselines skipped: {exc}"
    return ({name: float(r.max_ratio) for name, r in results.items()},
            f"baselines at the plan's alpha on the whole {W.shape[0]} x {W.shape[1]} workload")


# --------------------------------------------------------------------------------------------
# the page


_CSS = """
body { font-family: sans-serif; margin: 2em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; }
th { background: #eee; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.note { color: #555; font-size: 0.9em; } .warn { color: #a00; font-weight: bold; }
"""


def _table(header: list[str], rows: list[list[Any]], left: int = 1) -> str:
    out = ["<table><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(header)]
    out.append("</tr>")
    for row in rows:
        out.append("<tr>" + "".join(
            f'<td class="{"l" if i < left else ""}">{_e(v)}</td>' for i, v in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _bound_rows(planner: dict) -> list[list[Any]]:
    """The planner's lower bounds, named for what they bound (``distfit.plan.job.planner_bounds``;
    a version-1 plan's ``allocation_lower_bound`` is the bound on plans with the chosen blocks)."""
    rows = []
    chosen = planner.get("chosen_blocks_lower_bound")
    if isinstance(chosen, dict):
        rows.append(["plans with the chosen blocks only", chosen.get("value"), chosen.get("method"), chosen.get("bounds")])
    elif "allocation_lower_bound" in planner:
        rows.append(["plans with the chosen blocks only (allocation_lower_bound)", planner["allocation_lower_bound"],
                     "not recorded (a version-1 plan)", "the sum bound of plans with the chosen blocks"])
    whole = planner.get("global_lower_bound")
    if isinstance(whole, dict):
        value = whole.get("value")
        rows.append(["global: every plan of this form", "not known" if value is None else value,
                     whole.get("method"), whole.get("bounds")])
    else:
        rows.append(["global: every plan of this form", "not known", "not recorded", None])
    return rows


def _page(plan, release, blocks, ratios, baselines, baseline_note, answer_plots, calibrated=None) -> str:
    a = plan.attrs
    account = a.get("account") or {}
    planner = a.get("planner") or {}
    spec = a.get("spec") or {}
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>distfit report: {html.escape(str(spec.get('name', 'plan')))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>distfit report: {html.escape(str(spec.get('name', 'plan')))}</h1>",
        _table(["", ""], [
            ["plan", os.path.basename(plan.path.rstrip("/"))],
            ["plan checksum", a.get("checksum")],
            ["created", a.get("created")],
            ["distfit version", a.get("distfit_version")],
            ["schema", " x ".join(f"{n}[{s}]" for n, s in zip(a["schema"]["attributes"], a["schema"]["sizes"]))],
            ["queries", len(plan.queries_targets)],
            ["blocks", len(blocks)],
            ["release", os.path.basename(release.path.rstrip("/")) if release is not None else None],
        ], left=2),
        "<h2>Privacy account</h2>",
        _table(["quantity", "value"], [
            ["alpha (privacy cost)", a.get("alpha")],
            ["alpha exact", a.get("alpha_exact")],
            ["rho (zCDP)", a.get("rho")],
            ["composition", a.get("composition")],
        ]),
        "<h3>(epsilon, delta)</h3>",
        _table(["delta", "epsilon"],
               [[r["delta"], r["epsilon"]] for r in account.get("epsilon_delta", [])], left=0),
        '<img src="privacy_curve.png" alt="privacy curve epsilon(delta)">',
        "<h2>Planner decisions</h2>",
        "<ul>" + "".join(f"<li>{html.escape(str(d))}</li>" for d in planner.get("decisions", [])) + "</ul>",
        _table(["quantity", "value"], [[k, planner.get(k)] for k in (
            "alpha_sum_bound", "rounds", "variance_scale", "seconds", "spec_hash")
            if k in planner]),
        "<h3>Lower bounds on the privacy cost</h3>",
        '<p class="note">Each bound with what it bounds: the planner\'s bound holds for plans with the chosen '
        "blocks only, not for every plan; <code>distfit audit</code> re-certifies every bound by running its "
        "dual again and warns about any it did not.</p>",
        _table(["lower bound", "value", "how certified", "what it bounds"], _bound_rows(planner), left=1),
        "<h2>Blocks</h2>",
        '<img src="block_alpha.png" alt="alpha per block">',
    ]
    stat_keys = sorted({k for b in blocks for k in b["solver"] if k != "gap"})
    rows = []
    for b in blocks:
        lb = b["lower_bound"]
        cert = (b["alpha"] - lb) / b["alpha"] if math.isfinite(lb) and b["alpha"] > 0 else None
        rows.append([b["id"], ", ".join(b["attributes"]), b["shape"], b["alpha"], lb, cert,
                     b["solver"].get("gap")] + [b["solver"].get(k) for k in stat_keys])
    parts += [
        "<h3>Solver statistics and certificate gaps</h3>",
        '<p class="note">certificate gap = (alpha - lower bound) / alpha; solver gap as reported '
        "by the solver (- for a block re-optimised jointly, without a certificate of its own).</p>",
        _table(["block", "attributes", "queries x rows x cells", "alpha", "lower bound",
                "certificate gap", "solver gap"] + stat_keys, rows, left=3),
        "<h2>Accuracy: variance / target</h2>",
        _table(["quantity", "value"], [
            ["max variance/target", float(np.max(ratios)) if ratios.size else None],
            ["min variance/target", float(np.min(ratios)) if ratios.size else None],
            ["median variance/target", float(np.median(ratios)) if ratios.size else None],
        ]),
        '<img src="variance_ratio.png" alt="histogram of variance/target">',
        f'<p class="note">{html.escape(baseline_note)}</p>',
    ]
    if baselines:
        parts.append(_table(["mechanism", "max variance/target"],
                            [["SM-II (this plan)", float(np.max(ratios))]]
                            + [[k, v] for k, v in sorted(baselines.items())]))
    if release is not None:
        parts.append("<h2>Release: noisy answers</h2>")
        if not release.private:
            parts.append('<p class="warn">NOT PRIVATE: this release was drawn with a fixed seed (tests only).</p>')
        parts.append(f"<p class='note'>{html.escape(str(release.attrs.get('units')))} units; "
                     "the first units and queries with 95% confidence intervals "
                     "(answer +- 1.96 sqrt(variance)).</p>")
        for name, label in answer_plots:
            parts.append(f"<h3>{html.escape(label)}</h3>")
            parts.append(f'<img src="{name}" alt="answers of {html.escape(label)}">')
    if calibrated is not None:
        parts += [
            "<h2>Calibration: actual error against the promise</h2>",
            '<p class="warn">CONFIDENTIAL: this section compares the released answers with the true '
            "answers computed from the data. It is for the data owner's validation; do not publish "
            "a report that has it.</p>",
            _table(["quantity", "value"], [
                ["answers compared", f"{calibrated['count']} ({calibrated['units']} units x "
                                     f"{len(plan.queries_targets)} queries)"],
                ["within 1.96 sd (95% expected)", f"{calibrated['within_1.96sd']:.2%}"],
                ["within 1 sd (68.3% expected)", f"{calibrated['within_1sd']:.2%}"],
                ["mean standardised error (0 expected)", calibrated["mean_z"]],
                ["sd of standardised errors (1 expected)", calibrated["sd_z"]],
            ]),
            '<img src="calibration.png" alt="actual error against promised standard deviation">',
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# entry point


def write_report(plan_path: str | os.PathLike, out: str | os.PathLike,
                 release_path: str | os.PathLike | None = None,
                 data_path: str | os.PathLike | None = None) -> ReportResult:
    """Write the report of the plan (and release) to ``out`` (module docstring). With
    ``data_path`` (the release's data store) the report adds the calibration section."""
    out_path = Path(os.fspath(out))
    if STAGING_MARKER in out_path.name:
        raise ValueError(f"{out_path}: a report path may not contain {STAGING_MARKER!r}")
    with store_lock(out_path, "report"):  # one writer per report directory (stores/lock.py)
        return _write_report(plan_path, out_path, release_path, data_path)


def _write_report(plan_path: str | os.PathLike, out_path: Path, release_path: str | os.PathLike | None,
                  data_path: str | os.PathLike | None) -> ReportResult:
    if out_path.exists() or out_path.is_symlink():
        _check_out(out_path)  # refuse early, before any work
    plan = read_plan(plan_path)
    release = read_release(release_path) if release_path is not None else None
    if release is not None and release.attrs.get("plan_checksum") != plan.checksum:
        raise ValueError(f"{release.path}: the release was made from another plan "
                         f"(plan checksum {release.attrs.get('plan_checksum')}, not {plan.checksum})")

    blocks = []
    for bid in plan.block_ids:
        rec = plan.block(bid)
        blocks.append({"id": bid, "attributes": rec.attributes, "alpha": rec.alpha,
                       "lower_bound": rec.lower_bound, "solver": rec.solver,
                       "shape": " x ".join(map(str, rec.shape))})
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.asarray(plan.queries_variances / plan.queries_targets, dtype=float)
    baselines, note = _baselines(plan)
    if data_path is not None and release is None:
        raise ValueError("--data: the calibration compares a release with its data; give the release too")
    calibrated = _calibration(plan, release, data_path) if data_path is not None else None

    plt = _pyplot()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    staging.mkdir()
    try:
        result = ReportResult(path=str(out_path), baselines=baselines, baseline_note=note)
        _plot_privacy_curve(plt, float(plan.attrs["alpha"]), staging / "privacy_curve.png")
        _plot_block_alpha(plt, blocks, staging / "block_alpha.png")
        _plot_variance_ratio(plt, ratios, baselines, staging / "variance_ratio.png")
        result.plots += ["privacy_curve.png", "block_alpha.png", "variance_ratio.png"]
        answer_plots = []
        if release is not None:
            units = int(release.attrs.get("units", release.answers.shape[0]))
            n_units = min(ANSWER_UNITS, units)
            n_q = min(ANSWER_QUERIES, release.answers.shape[1])
            answers = np.asarray(release.answers[:n_units, :n_q], dtype=float)
            variances = release.variances
            labels = release.labels or [f"query {j}" for j in range(release.answers.shape[1])]
            unit_ids = [_fmt(u) for u in np.asarray(release.unit_ids[:n_units])]
            for j in range(n_q):
                name = f"answers_{j}.png"
                _plot_answers(plt, answers[:, j], math.sqrt(max(float(variances[j]), 0.0)), unit_ids,
                              str(labels[j]), staging / name)
                answer_plots.append((name, str(labels[j])))
                result.plots.append(name)
        calibration_summary = None
        if calibrated is not None:
            calibration_summary, z, sd = calibrated
            _plot_calibration(plt, z, sd, staging / "calibration.png")
            result.plots.append("calibration.png")
            result.calibration = calibration_summary
        (staging / "index.html").write_text(
            _page(plan, release, blocks, ratios, baselines, note, answer_plots, calibration_summary),
            encoding="utf-8")
        (staging / MARKER).write_text("distfit report directory; `distfit report` may replace it\n",
                                      encoding="utf-8")
        move_into_place(staging, out_path, _check_out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result
