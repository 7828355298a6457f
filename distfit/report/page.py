"""``distfit report``: a plan store (and optionally a release store) in, one HTML page out.

``distfit report PLAN.zarr [RELEASE.zarr] --out DIR`` (docs/design.md section 5) writes
``DIR/index.html``: one self-contained file. Every plot is inline SVG (matplotlib
``savefig(format="svg")``, text kept as text so it stays small, sharp at any zoom and
searchable; a scatter of more than :data:`RASTER_POINTS` points is embedded as a bitmap inside
its SVG), the style sheet is inline, and the page has no scripts, no links to other files and
no network URLs: mailed or uploaded alone it shows everything. The figures (``id`` of each
``<figure>``, listed in :attr:`ReportResult.plots` and the run manifest):

* ``privacy_curve``   epsilon(delta) of the plan, delta from 1e-12 to 1e-2 (log x axis),
  exact (:func:`distfit.mathematics.privacy.epsilon_for_delta` at the plan's alpha);
* ``block_alpha``     each block's privacy cost alpha (horizontal bars, largest first, at most
  :data:`BLOCK_BARS`), with its certified lower bound where that is finite;
* ``variance_ratio``  histogram of variance/target over all queries, with a line at 1 (SM-II
  meets every accuracy target at exactly 1 when the spec gives no privacy budget) and, when the
  spec's workload is small (domain of at most :data:`BASELINE_MAX_CELLS` cells), the baselines'
  max ratios at the plan's alpha (:func:`distfit.solver.baselines.compare_baselines`);
* ``interval_width``  with a release: each query's 95% interval half-width ``1.96 sqrt(variance)``.
  The noise of a query has the same variance for every unit, so the half-width is one number
  per query; the first units' answers to the first queries are a table, under a row with each
  query's half-width, rather than error bars, which on the scale of the answers (hundreds) would be
  invisible;
* ``calibration``     with a release and its data (``--data``, :func:`distfit.stores.data.open_data`):
  query by query, the actual error of each released answer against its promised standard
  deviation (log-log scatter with the 1.96 sd line) and the histogram of the standardised
  errors ``z = (answer - true) / sd`` against N(0, 1); the page gives the share within 1.96 sd
  (95% expected) and within 1 sd (68.3%). The true answers are computed from the data's block
  marginals (:func:`distfit.release.noise.true_block_answers`) for at most
  :data:`CALIBRATION_ANSWERS` answers (the first units; the page says how many of how many).
  This section is derived from the confidential data: the page says so, and such a report is
  for the data owner's validation, not for publication;
* ``estimate_error``  with an estimate store (``estimate_path``, :mod:`distfit.stores.estimate`)
  and the data: per query, the root mean squared error of the raw answers and of the estimates
  against the true answers (the same first units as the calibration; points below the diagonal:
  the estimate is closer to the truth). Without the data the estimate section still compares
  raw and estimated answers (how many raw answers were negative; the first units' answers side
  by side) and gives the fit of the projection.

The page also holds the privacy account (alpha, rho, the epsilon/delta table), the planner's
decisions and a table of per-block solver statistics and certificate gaps.

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
import io
import math
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distfit.mathematics.privacy import epsilon_for_delta
from distfit.release.noise import calibration
from distfit.report.packs import block_rows, true_query_answers
from distfit.solver.baselines import compare_baselines
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data
from distfit.stores.estimate import read_estimate, read_verified_estimate
from distfit.stores.lock import store_lock
from distfit.stores.files import STAGING_MARKER, check_marked_dir, move_into_place
from distfit.stores.plan import read_plan, read_verified_plan
from distfit.stores.release import read_release, read_verified_release

MARKER = ".distfit-report"
PAGE = "index.html"
BASELINE_MAX_CELLS = 5000
CURVE_DELTAS = np.logspace(-12, -2, 41)
ANSWER_QUERIES = 4   # the answer table: the first few queries
ANSWER_UNITS = 20    # ... of the first units
BLOCK_BARS = 40      # most blocks drawn in the alpha-per-block plot (the table lists every block)
Z95 = 1.959963984540054
#: Most (unit, query) answers the calibration compares with the truth (the first units).
CALIBRATION_ANSWERS = 2_000_000
#: Most points drawn in the calibration scatter (an even subsample beyond).
CALIBRATION_POINTS = 20_000
#: A scatter with more points than this is drawn as a bitmap inside its SVG: one vector marker
#: per point would make the page megabytes (20,000 points: about 3 MB as vectors, 0.2 MB as a bitmap).
RASTER_POINTS = 2000
#: Resolution of those bitmaps (the rest of each figure is vector).
RASTER_DPI = 150
#: An id, or a reference to one, in matplotlib's SVG: ``id="``, ``href="#`` and ``url(#``.
_SVG_ID = re.compile(r'(\bid="|href="#|url\(#)')
_SVG_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)

__all__ = ["BASELINE_MAX_CELLS", "MARKER", "PAGE", "ReportResult", "write_report"]


@dataclass(frozen=True)
class ReportResult:
    """Where the report went, the ids of its figures (each a ``<figure id=...>`` of the page),
    the baselines' max variance/target (or None and why not) and the calibration summary."""
    path: str
    plots: tuple[str, ...] = ()
    baselines: dict[str, float] | None = None
    baseline_note: str = ""
    calibration: dict | None = None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _check_out(path: Path) -> None:
    """Raise unless ``path`` may be replaced by a report (:func:`distfit.stores.files.check_marked_dir`)."""
    check_marked_dir(path, MARKER, "report")


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
# plots: each returns inline SVG markup


def _svg(plt, fig, name: str, description: str) -> str:
    """``fig`` as SVG markup to inline in the page (the figure is closed).

    Text stays text (``svg.fonttype: none``: a few kB instead of glyph outlines, with a generic
    sans-serif fallback in its font list). Every id (and every reference to one) is prefixed with
    the figure's name, so the ids of a page are unique, and hashed with the figure's name as the
    salt instead of a random one, so the same figure gives the same markup. The XML prologue (not
    allowed inside HTML) and the metadata block are dropped."""
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"distfit-report-{name}"}):
        fig.savefig(buf, format="svg", dpi=RASTER_DPI)
    plt.close(fig)
    text = buf.getvalue()
    svg = _SVG_METADATA.sub("", text[text.index("<svg"):])  # its RDF block: a date, "made by matplotlib"
    # matplotlib names its groups axes_1, legend_1, patch_1, ... in every figure: prefix every id,
    # and every reference to one, with the figure's name, so that the ids of a page stay unique
    svg = _SVG_ID.sub(lambda m: f'{m.group(1)}{name}-', svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(description)}" ', 1)


def _outside_legend(fig, ncols: int = 2) -> None:
    """One legend for the figure, outside the axes (below them), so it never covers data."""
    fig.legend(loc="outside lower center", ncols=ncols, fontsize=8, frameon=False)


def _plot_privacy_curve(plt, alpha: float) -> str:
    eps = [epsilon_for_delta(alpha, float(d)) for d in CURVE_DELTAS]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    ax.plot(CURVE_DELTAS, eps, marker=".", color="C0")
    ax.set_xscale("log")
    ax.set_xlabel("delta")
    ax.set_ylabel("epsilon")
    ax.set_title(f"Privacy curve epsilon(delta), alpha = {alpha:.4g}")
    ax.grid(True, which="both", alpha=0.3)
    return _svg(plt, fig, "privacy_curve", "privacy curve epsilon(delta)")


def _plot_block_alpha(plt, blocks: list[dict]) -> str:
    """The blocks' alphas, largest first, as horizontal bars (block ids readable on the y axis):
    all of them up to :data:`BLOCK_BARS`, else the largest BLOCK_BARS (the title says how many
    are shown; the table lists every block)."""
    order = sorted(blocks, key=lambda b: b["alpha"], reverse=True)[:BLOCK_BARS]
    y = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(7.5, 1.9 + 0.2 * len(order)), layout="constrained")
    ax.barh(y, [b["alpha"] for b in order], height=0.6, color="C0", label="block alpha")
    lb = [(i, b["lower_bound"]) for i, b in enumerate(order) if math.isfinite(b["lower_bound"])]
    if lb:
        ax.scatter([v for _, v in lb], [i for i, _ in lb], color="C3", marker="|", s=250, linewidths=2,
                   zorder=3, label="certified lower bound")
    ax.set_yticks(y, labels=[b["id"] for b in order], fontsize=8)
    ax.set_ylim(len(order) - 0.5, -0.5)  # largest on top
    ax.set_xlabel("alpha (privacy cost of the block)")
    ax.grid(True, axis="x", alpha=0.3)
    shown = f"the {len(order)} largest of {len(blocks)} blocks" if len(order) < len(blocks) else "every block"
    ax.set_title(f"Privacy cost per block ({shown})", fontsize=10)
    _outside_legend(fig)
    return _svg(plt, fig, "block_alpha", "privacy cost alpha per block")


def _plot_variance_ratio(plt, ratios: np.ndarray, baselines: dict[str, float] | None) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    finite = ratios[np.isfinite(ratios)]
    hi = max([1.0, float(finite.max(initial=1.0))] + list((baselines or {}).values())) * 1.05
    lo = min(1.0, float(finite.min(initial=1.0))) * 0.95
    bins = 40 if not baselines else np.linspace(lo, hi, 60)  # bars stay visible next to the baselines
    ax.hist(finite, bins=bins, color="C0", alpha=0.8, label="SM-II (this plan): its queries")
    ax.axvline(1.0, color="k", linestyle="--", label="target (ratio 1)")
    for i, (name, r) in enumerate(sorted((baselines or {}).items())):
        ax.axvline(r, color=f"C{i + 1}", linestyle="-", label=f"{name}: max {r:.3g}")
    if baselines and max(baselines.values()) > 20 * max(1.0, float(finite.max(initial=1.0))):
        ax.set_xscale("log")
    ax.set_xlabel("variance / target")
    ax.set_ylabel("queries")
    ax.set_title("Variance relative to target", fontsize=10)
    _outside_legend(fig, ncols=3)
    return _svg(plt, fig, "variance_ratio", "histogram of variance/target")


def _plot_interval_width(plt, variances: np.ndarray) -> str:
    """Each query's 95% interval half-width 1.96 sqrt(variance), against the query's index."""
    half = Z95 * np.sqrt(np.maximum(np.asarray(variances, dtype=float), 0.0))
    fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    ax.scatter(np.arange(half.size), half, s=8, color="C0", rasterized=half.size > RASTER_POINTS)
    ax.set_ylim(0, float(half.max(initial=1.0)) * 1.1 or 1.0)
    ax.set_xlabel("query (its index in the release)")
    ax.set_ylabel("half-width (units of the answer)")
    ax.set_title("95% interval: answer ± 1.96 standard deviations; the half-width per query", fontsize=10)
    ax.grid(True, alpha=0.3)
    return _svg(plt, fig, "interval_width", "95% interval half-width per query")


def _plot_calibration(plt, z: np.ndarray, sd: np.ndarray) -> str:
    """Left: |actual error| against the promised sd per answer (log-log) with the 1.96 sd line;
    right: histogram of the standardised errors with the N(0, 1) density."""
    error = np.abs(z) * sd
    step = max(1, error.size // CALIBRATION_POINTS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    shown_sd, shown_error = sd[::step], np.maximum(error[::step], 1e-12)
    left.scatter(shown_sd, shown_error, s=3, alpha=0.3, color="C0", label="released answers",
                 rasterized=shown_sd.size > RASTER_POINTS)
    grid = np.geomspace(max(float(sd.min()), 1e-12), float(sd.max()) * 1.05, 50)
    left.plot(grid, Z95 * grid, color="C3", label="1.96 x promised sd")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("promised standard deviation")
    left.set_ylabel("|released - true|")
    drawn = f", {shown_sd.size:,} drawn" if step > 1 else ""
    left.set_title(f"actual error against the promise ({error.size:,} answers{drawn})", fontsize=9)
    left.grid(True, which="both", alpha=0.2)
    bins = np.linspace(-5, 5, 81)
    right.hist(np.clip(z, -5, 5), bins=bins, density=True, color="C0", alpha=0.7,
               label="standardised error z = (released - true) / sd")
    x = np.linspace(-5, 5, 400)
    right.plot(x, np.exp(-x * x / 2) / math.sqrt(2 * math.pi), color="k", label="N(0, 1) density")
    for edge in (-Z95, Z95):
        right.axvline(edge, color="grey", linestyle="--", linewidth=1)
    right.set_xlabel("standardised error z (dashed: ±1.96)")
    right.set_title(f"{np.mean(np.abs(z) <= Z95):.1%} within ±1.96 sd (95% expected)", fontsize=9)
    _outside_legend(fig, ncols=4)
    return _svg(plt, fig, "calibration", "actual error against promised standard deviation")


def _calibration(plan, release, data_path, verified: bool) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """Standardised errors of the first units' released answers (module docstring), and those
    units' true answers (units x m)."""
    data = open_data(data_path, verify=not verified)
    if data.units != int(release.attrs.get("units", -1)):
        raise ValueError(f"{data_path}: holds {data.units} units, the release {release.attrs.get('units')}; "
                         "give the data the release was made from")
    m = len(plan.queries_targets)
    units = max(1, min(data.units, CALIBRATION_ANSWERS // max(m, 1)))
    ids = np.asarray(release.unit_ids[:units])
    data_ids = data.ids(0, units)  # checked against the chunk's digest, as every chunk read of the data
    if not np.array_equal(ids, data_ids):
        raise ValueError(f"{data_path}: its unit ids differ from the release's; give the data the "
                         "release was made from")
    true = true_query_answers(plan, data, units)  # packed blocks in bulk (distfit.report.packs)
    noisy = np.asarray(release.answers[:units], dtype=float)
    result = calibration(noisy, true, release.variances)
    z = result.pop("z")
    result["units"] = units
    result["of_units"] = int(data.units)
    sd = np.broadcast_to(np.sqrt(np.asarray(release.variances, dtype=float)), z.shape).ravel()
    return result, z.ravel(), sd, true


def _plot_estimate_error(plt, raw: np.ndarray, estimated: np.ndarray) -> str:
    """Per query: RMSE of the estimates against RMSE of the raw answers, with the diagonal."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    ax.scatter(raw, estimated, s=10, color="C0", label="a query", rasterized=raw.size > RASTER_POINTS)
    top = float(max(raw.max(initial=1.0), estimated.max(initial=1.0))) * 1.05
    ax.plot([0, top], [0, top], color="k", linestyle="--", label="equal error")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("RMSE of the raw answers")
    ax.set_ylabel("RMSE of the estimates")
    ax.set_title("Error against the truth, per query (below the line: the estimate is closer)", fontsize=9)
    ax.grid(True, alpha=0.3)
    _outside_legend(fig)
    return _svg(plt, fig, "estimate_error", "root mean squared error of estimates against raw answers, per query")


def _estimate_summary(release, estimate, true: np.ndarray | None) -> dict:
    """Raw against estimated answers for the first units (the calibration's, with ``true``;
    else up to :data:`CALIBRATION_ANSWERS` answers): negative shares, and with ``true`` each
    one's error (RMSE overall and per query, mean absolute error)."""
    m = int(release.answers.shape[1])
    units = true.shape[0] if true is not None else max(
        1, min(int(release.answers.shape[0]), CALIBRATION_ANSWERS // max(m, 1)))
    raw = np.asarray(release.answers[:units], dtype=float)
    est = np.asarray(estimate.estimates[:units], dtype=float)
    out = {"units": units, "raw_negative": float(np.mean(raw < 0)), "estimate_negative": float(np.mean(est < 0))}
    if true is not None:
        raw_err, est_err = raw - true, est - true
        out.update({"rmse_raw": float(np.sqrt(np.mean(raw_err ** 2))),
                    "rmse_estimate": float(np.sqrt(np.mean(est_err ** 2))),
                    "mae_raw": float(np.mean(np.abs(raw_err))), "mae_estimate": float(np.mean(np.abs(est_err))),
                    "query_rmse_raw": np.sqrt(np.mean(raw_err ** 2, axis=0)),
                    "query_rmse_estimate": np.sqrt(np.mean(est_err ** 2, axis=0))})
        out["queries_improved"] = float(np.mean(out["query_rmse_estimate"] <= out["query_rmse_raw"]))
    return out


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
.wide { overflow-x: auto; max-width: 100%; }
figure { margin: 0.5em 0 1.5em 0; }
figure svg { display: block; max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption, .note { color: #555; font-size: 0.9em; } .warn { color: #a00; font-weight: bold; }
"""


def _table(header: list[str] | None, rows: list[list[Any]], left: int = 1) -> str:
    """An HTML table (wrapped to scroll sideways when wider than the page); ``header`` None for
    a table of name/value rows without a header row; the first ``left`` columns left-aligned."""
    out = ['<div class="wide"><table>']
    if header is not None:
        out.append("<tr>" + "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>'
                                    for i, h in enumerate(header)) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(
            f'<td class="{"l" if i < left else ""}">{_e(v)}</td>' for i, v in enumerate(row)) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _figure(figures: dict[str, str], name: str, caption: str = "") -> str:
    caption = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure id="{name}">\n{figures[name]}{caption}</figure>'


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


def _answer_rows(release) -> tuple[list[str], list[list[Any]]]:
    """The first units' answers to the first queries, below one row with each query's 95%
    interval half-width (1.96 sd: the same for every unit)."""
    n_units = min(ANSWER_UNITS, int(release.answers.shape[0]))
    n_q = min(ANSWER_QUERIES, int(release.answers.shape[1]))
    answers = np.asarray(release.answers[:n_units, :n_q], dtype=float)
    half = Z95 * np.sqrt(np.maximum(np.asarray(release.variances[:n_q], dtype=float), 0.0))
    labels = release.labels or [f"query {j}" for j in range(release.answers.shape[1])]
    units = [_fmt(u) for u in np.asarray(release.unit_ids[:n_units])]
    rows = [["95% interval"] + [f"answer ± {h:.4g}" for h in half]]
    rows += [[u] + list(answers[i]) for i, u in enumerate(units)]
    # a zero-width space after each ":" of a label (group:cell) lets the long headers wrap there
    return ["unit"] + [str(labels[j]).replace(":", ":\u200b") for j in range(n_q)], rows


def _estimate_rows(release, estimate) -> tuple[list[str], list[list[Any]]]:
    """The first units' raw and estimated answers to the first queries, side by side."""
    n_units = min(ANSWER_UNITS, int(release.answers.shape[0]))
    n_q = min(ANSWER_QUERIES, int(release.answers.shape[1]))
    raw = np.asarray(release.answers[:n_units, :n_q], dtype=float)
    est = np.asarray(estimate.estimates[:n_units, :n_q])
    labels = release.labels or [f"query {j}" for j in range(release.answers.shape[1])]
    # a zero-width space after each ":" of a label lets the long headers wrap there (as _answer_rows)
    header = ["unit"] + [str(labels[j]).replace(":", ":\u200b") + f" {kind}"
                         for j in range(n_q) for kind in ("raw", "estimate")]
    units = [_fmt(u) for u in np.asarray(release.unit_ids[:n_units])]
    return header, [[u] + [v for j in range(n_q) for v in (raw[i, j], est[i, j])] for i, u in enumerate(units)]


def _geography(geography: dict) -> str:
    """A top-down estimate's place in its geography (the estimate store's ``geography`` attr)."""
    level, above = geography.get("level"), geography.get("parent_level")
    if above is None:
        return f"level {level}, the coarsest of {', '.join(geography.get('levels') or [])}: the top of the top-down estimate"
    return f"level {level}: every unit's table sums exactly, cell by cell, to its parent's in level {above}"


def _estimate_section(release, estimate, summary: dict, figures: dict[str, str]) -> list[str]:
    a = estimate.attrs
    fit = a.get("fit") or {}
    header, rows = _estimate_rows(release, estimate)
    units = summary["units"]
    parts = [
        "<h2>Estimates: nonnegative and consistent</h2>",
        "<p class='note'>Post-processing of the release (no privacy cost; the data is not read): per unit the "
        "nonnegative data vector closest to the release in the noise's metric "
        f"({html.escape(str(a.get('objective')))}), and every query's estimate computed from it, so that the "
        "estimates never go below 0 and every table adds up.</p>",
        _table(["quantity", "value"], [
            ["estimate", os.path.basename(estimate.path.rstrip("/"))],
            ["method", a.get("method")],
            ["integer", a.get("integer")],
            ["objective per unit: mean, max", f"{_fmt(fit.get('objective_mean'))}, {_fmt(fit.get('objective_max'))}"],
            ["iterations (most of any unit)", fit.get("iterations_max")],
            ["units not converged", fit.get("unconverged_units")],
            *([["geography", _geography(a["geography"])]] if a.get("geography") else []),
            [f"raw answers below 0 (first {units:,} units)", f"{summary['raw_negative']:.2%}"],
            [f"estimates below 0 (first {units:,} units)", f"{summary['estimate_negative']:.2%}"],
        ]),
        f"<h3>The first {len(rows)} units' raw and estimated answers</h3>",
        _table(header, rows, left=1),
    ]
    if "rmse_raw" in summary:
        parts += [
            '<p class="warn">CONFIDENTIAL: the error of each against the true answers, computed from the data '
            "(for the data owner's validation; do not publish).</p>",
            _table(["error against the truth", "raw answers", "estimates"], [
                ["root mean squared error", summary["rmse_raw"], summary["rmse_estimate"]],
                ["mean absolute error", summary["mae_raw"], summary["mae_estimate"]],
            ]),
            f"<p class='note'>{summary['queries_improved']:.1%} of the queries have an estimate error at most "
            f"their raw error (RMSE over the first {units:,} units).</p>",
            _figure(figures, "estimate_error"),
        ]
    return parts


def _page(plan, release, blocks, ratios, baselines, baseline_note, figures: dict[str, str],
          calibrated: dict | None = None, estimated: tuple | None = None) -> str:
    a = plan.attrs
    account = a.get("account") or {}
    planner = a.get("planner") or {}
    spec = a.get("spec") or {}
    m = len(plan.queries_targets)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>distfit report: {html.escape(str(spec.get('name', 'plan')))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>distfit report: {html.escape(str(spec.get('name', 'plan')))}</h1>",
        _table(None, [
            ["plan", os.path.basename(plan.path.rstrip("/"))],
            ["plan checksum", a.get("checksum")],
            ["created", a.get("created")],
            ["distfit version", a.get("distfit_version")],
            ["schema", " x ".join(f"{n}[{s}]" for n, s in zip(a["schema"]["attributes"], a["schema"]["sizes"]))],
            ["queries", m],
            ["blocks", len(blocks)],
            ["release", os.path.basename(release.path.rstrip("/")) if release is not None else None],
        ], left=2),
        '<p class="note">This page is one file: its plots are inline, it needs no other file and no network.</p>',
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
        _figure(figures, "privacy_curve"),
        "<h2>Planner decisions</h2>",
        "<ul>" + "".join(f"<li>{html.escape(str(d))}</li>" for d in planner.get("decisions", [])) + "</ul>",
        _table(["quantity", "value"], [[k, planner.get(k)] for k in (
            "alpha_sum_bound", "rounds", "variance_scale", "seconds", "spec_hash")
            if k in planner]),
        "<h3>Lower bounds on the privacy cost</h3>",
        '<p class="note">Each bound with what it bounds: the planner\'s bound holds for plans with the chosen '
        "blocks only, not for every plan; <code>distfit audit</code> re-certifies every bound by running its "
        "dual again and warns about any it did not.</p>",
        _table(["lower bound", "value", "how certified", "what it bounds"], _bound_rows(planner), left=4),
        "<h2>Blocks</h2>",
        _figure(figures, "block_alpha", "Bar: the block's privacy cost alpha; red tick: its certified lower "
                "bound (the block's dual certificate), where it has one."),
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
        _figure(figures, "variance_ratio", baseline_note),
    ]
    if baselines:
        parts.append(_table(["mechanism", "max variance/target"],
                            [["SM-II (this plan)", float(np.max(ratios))]]
                            + [[k, v] for k, v in sorted(baselines.items())]))
    if release is not None:
        parts.append("<h2>Release: noisy answers</h2>")
        if not release.private:
            parts.append('<p class="warn">NOT PRIVATE: this release was drawn with a fixed seed (tests only).</p>')
        header, answer_rows = _answer_rows(release)
        parts += [
            f"<p class='note'>{int(release.attrs.get('units', release.answers.shape[0])):,} units x "
            f"{release.answers.shape[1]:,} queries. 95% interval: answer ± 1.96 standard deviations of "
            "the query's noise. The noise of a query has the same variance for every unit, so the interval's "
            "half-width is one number per query (the plot); drawn as error bars on the scale of the answers "
            "the intervals would be too small to see, so the first units' answers are a table.</p>",
            _figure(figures, "interval_width"),
            f"<h3>The first {len(answer_rows) - 1} units' answers to the first {len(header) - 1} queries</h3>",
            _table(header, answer_rows, left=1),
        ]
    if calibrated is not None:
        units, of_units = calibrated["units"], calibrated["of_units"]
        scope = f"all {units:,}" if units == of_units else f"the first {units:,} of {of_units:,}"
        parts += [
            "<h2>Calibration: actual error against the promise</h2>",
            '<p class="warn">CONFIDENTIAL: this section compares the released answers with the true '
            "answers computed from the data. It is for the data owner's validation; do not publish "
            "a report that has it.</p>",
            _table(["quantity", "value"], [
                ["answers compared", f"{calibrated['count']:,} ({scope} units x {m:,} queries)"],
                ["within 1.96 sd (95% expected)", f"{calibrated['within_1.96sd']:.2%}"],
                ["within 1 sd (68.3% expected)", f"{calibrated['within_1sd']:.2%}"],
                ["mean standardised error (0 expected)", calibrated["mean_z"]],
                ["sd of standardised errors (1 expected)", calibrated["sd_z"]],
            ]),
            f'<p class="note">At most {CALIBRATION_ANSWERS:,} answers are compared (the first units), '
            "so that a large release is checked in seconds.</p>",
            _figure(figures, "calibration"),
        ]
    if estimated is not None:
        parts += _estimate_section(release, *estimated, figures)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# entry point


def write_report(plan_path: str | os.PathLike, out: str | os.PathLike,
                 release_path: str | os.PathLike | None = None,
                 data_path: str | os.PathLike | None = None,
                 estimate_path: str | os.PathLike | None = None, *, verified: bool = False) -> ReportResult:
    """Write the report of the plan (and release) to ``out`` (module docstring). With
    ``data_path`` (the release's data store) the report adds the calibration section; with
    ``estimate_path`` (an estimate of the release) the estimate section. Every store is
    verified against its checksum first (one line naming the store that changed), unless
    ``verified``: the caller wrote or verified each of them just before (``distfit run``)."""
    out_path = Path(os.fspath(out))
    if STAGING_MARKER in out_path.name:
        raise ValueError(f"{out_path}: a report path may not contain {STAGING_MARKER!r}")
    with store_lock(out_path, "report"):  # one writer per report directory (stores/lock.py)
        return _write_report(plan_path, out_path, release_path, data_path, estimate_path, verified)


def _write_report(plan_path: str | os.PathLike, out_path: Path, release_path: str | os.PathLike | None,
                  data_path: str | os.PathLike | None, estimate_path: str | os.PathLike | None,
                  verified: bool) -> ReportResult:
    if out_path.exists() or out_path.is_symlink():
        _check_out(out_path)  # refuse early, before any work
    # every input verified against its checksum once, before anything is written
    plan = (read_plan if verified else read_verified_plan)(plan_path)
    read_release_store = read_release if verified else read_verified_release
    release = read_release_store(release_path) if release_path is not None else None
    if release is not None and release.attrs.get("plan_checksum") != plan.checksum:
        raise ValueError(f"{release.path}: the release was made from another plan "
                         f"(plan checksum {release.attrs.get('plan_checksum')}, not {plan.checksum})")

    blocks = block_rows(plan)  # packed blocks from their packs' arrays (distfit.report.packs)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.asarray(plan.queries_variances / plan.queries_targets, dtype=float)
    baselines, note = _baselines(plan)
    if data_path is not None and release is None:
        raise ValueError("--data: the calibration compares a release with its data; give the release too")
    calibrated = _calibration(plan, release, data_path, verified) if data_path is not None else None
    read_estimate_store = read_estimate if verified else read_verified_estimate
    estimate = read_estimate_store(estimate_path) if estimate_path is not None else None
    if estimate is not None and (release is None or estimate.attrs.get("release_checksum") != release.checksum):
        raise ValueError(f"{estimate.path}: the estimate is not of the release "
                         f"{'given' if release is None else release.path} (release checksum "
                         f"{estimate.attrs.get('release_checksum')}); give the release it was made from")

    plt = _pyplot()
    figures = {"privacy_curve": _plot_privacy_curve(plt, float(plan.attrs["alpha"])),
               "block_alpha": _plot_block_alpha(plt, blocks),
               "variance_ratio": _plot_variance_ratio(plt, ratios, baselines)}
    if release is not None:
        figures["interval_width"] = _plot_interval_width(plt, release.variances)
    summary = true = estimated = None
    if calibrated is not None:
        summary, z, sd, true = calibrated
        figures["calibration"] = _plot_calibration(plt, z, sd)
    if estimate is not None:
        compared = _estimate_summary(release, estimate, true)
        if true is not None:
            figures["estimate_error"] = _plot_estimate_error(plt, compared["query_rmse_raw"],
                                                             compared["query_rmse_estimate"])
        estimated = (estimate, compared)
    page = _page(plan, release, blocks, ratios, baselines, note, figures, summary, estimated)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    staging.mkdir()
    try:
        (staging / PAGE).write_text(page, encoding="utf-8")
        (staging / MARKER).write_text("distfit report directory; `distfit report` may replace it\n",
                                      encoding="utf-8")
        move_into_place(staging, out_path, _check_out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ReportResult(path=str(out_path), plots=tuple(figures), baselines=baselines, baseline_note=note,
                        calibration=summary)
