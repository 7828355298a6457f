"""``distfit report``: a plan store (and optionally a release store) in, one publishable HTML page out,
and with the data a second, confidential one.

``distfit report PLAN.zarr [RELEASE.zarr] --out DIR [--data DATA.zarr] [--estimate ESTIMATE.zarr]``
(docs/design.md section 5, docs/report.md) writes two self-contained files:

* ``DIR/index.html`` (:data:`PAGE`), **publishable**: derived from the plan, the release and its
  estimate only, never from the data (with or without ``--data`` it is the same file, byte for
  byte). In order: what was released (the tables, which are the spec's query groups, how many
  units and figures), the privacy guarantee in plain words (rho-zCDP and the exact (epsilon,
  delta) of the plan's account, docs/privacy.md), the accuracy of every table in persons (the
  standard error ``sqrt(v_j)`` and the 90% margin of error ``MOE90_Z sqrt(v_j)`` of its
  figures, :mod:`distfit.mathematics.margins`, with the table's target in the terms the spec
  stated it: ``MOE ±M at 90%``, ``CV C at N`` or the variance), the first units' answers with
  their margins, the estimates, then the plan's technical record (account, planner decisions,
  lower bounds, blocks, solver statistics, variance/target and the baselines);
* ``DIR/validation.html`` (:data:`VALIDATION`), **CONFIDENTIAL**, written only with ``--data``:
  the calibration of the released answers against the true answers computed from the data, and
  with an estimate the error of raw and estimated answers against the truth. A report written
  without ``--data`` has no such file (an earlier one in ``DIR`` is replaced with the directory).

Both pages have inline SVG plots (:mod:`distfit.report.plots`: matplotlib ``savefig(format="svg")``, text kept as text; a
scatter of more than :data:`distfit.report.plots.RASTER_POINTS` points is embedded as a bitmap inside its SVG), an
inline style sheet, no scripts, no links to other files and no network URLs: mailed or uploaded
alone each shows everything. Both fit a window 1,280 px wide without horizontal scrolling (table
cells wrap, figures scale down to the page). The figures (``id`` of each ``<figure>``):

``index.html`` (listed in :attr:`ReportResult.plots`):

* ``privacy_curve``   epsilon(delta) of the plan, delta from 1e-12 to 1e-2 (log x axis),
  exact (:func:`distfit.mathematics.privacy.epsilon_for_delta` at the plan's alpha);
* ``moe_by_table``    each figure's 90% margin of error in persons, one row per table in the
  spec's order (labelled with the table's name; at most :data:`distfit.report.plots.TABLE_ROWS` tables, the table
  beside it lists every one), with the margin its target allows;
* ``block_alpha``     each block's privacy cost alpha (horizontal bars, largest first, at most
  :data:`distfit.report.plots.BLOCK_BARS`), with its certified lower bound where that is finite;
* ``variance_ratio``  histogram of variance/target over all queries, with a line at 1 (SM-II
  meets every accuracy target at exactly 1 when the spec gives no privacy budget) and, when the
  spec's workload is small (domain of at most :data:`BASELINE_MAX_CELLS` cells), the baselines'
  max ratios at the plan's alpha (:func:`distfit.solver.baselines.compare_baselines`).

``validation.html`` (:attr:`ReportResult.validation_plots`):

* ``calibration``     query by query, the actual error of each released answer against its
  promised standard deviation (log-log scatter with the 1.96 sd line) and the histogram of the
  standardised errors ``z = (answer - true) / sd`` against N(0, 1); the page gives the share
  within 1.96 sd (95% expected) and within 1 sd (68.3%). The true answers are computed from the
  data's block marginals (:func:`distfit.report.packs.true_query_answers`) for at most
  :data:`CALIBRATION_ANSWERS` answers (the first units; the page says how many of how many);
* ``estimate_error``  with an estimate store (``estimate_path``, :mod:`distfit.stores.estimate`):
  per query, the root mean squared error of the raw answers and of the estimates against the
  true answers (the calibration's units; below the diagonal the estimate is closer).

A table's figures are its query group's queries, labelled in words as ``distfit export`` labels
them (:func:`distfit.export.tables.table_layouts`); a plan whose stored spec does not parse is
reported as one table of every query.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from distfit.export.tables import TableLayout, table_layouts
from distfit.mathematics.margins import MOE90_Z
from distfit.release.noise import calibration
from distfit.report.packs import block_rows, true_query_answers
from distfit.report.plots import (plot_block_alpha, plot_calibration, plot_estimate_error, plot_moe_by_table,
                                  plot_privacy_curve, plot_variance_ratio, pyplot)
from distfit.solver.baselines import compare_baselines
from distfit.spec.model import PipelineSpec, QueryGroupSpec
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data
from distfit.stores.estimate import read_sealed_estimate
from distfit.stores.lock import store_lock
from distfit.stores.files import STAGING_MARKER, check_marked_dir, move_into_place
from distfit.stores.plan import read_plan, read_verified_plan
from distfit.stores.release import read_sealed_release

MARKER = ".distfit-report"
PAGE = "index.html"
#: The confidential page, written only with the data (module docstring).
VALIDATION = "validation.html"
BASELINE_MAX_CELLS = 5000
ANSWER_QUERIES = 4   # the answer table: the first few queries
ANSWER_UNITS = 20    # ... of the first units
#: Most (unit, query) answers the calibration compares with the truth (the first units).
CALIBRATION_ANSWERS = 2_000_000

__all__ = ["BASELINE_MAX_CELLS", "MARKER", "PAGE", "VALIDATION", "ReportResult", "remove_report", "write_report"]


@dataclass(frozen=True)
class ReportResult:
    """Where the report went, the ids of the figures of ``index.html`` (each a ``<figure
    id=...>`` of the page), the baselines' max variance/target (or None and why not), the
    calibration summary, and the confidential page's path and figures (None and ``()`` without
    the data)."""
    path: str
    plots: tuple[str, ...] = ()
    baselines: dict[str, float] | None = None
    baseline_note: str = ""
    calibration: dict | None = None
    validation: str | None = None
    validation_plots: tuple[str, ...] = ()

    def manifest_entry(self) -> dict[str, Any]:
        """What a run's manifest records of this report (``report``): absolute paths, the figures."""
        return {"path": os.path.abspath(self.path), "index": os.path.abspath(os.path.join(self.path, PAGE)),
                "plots": list(self.plots), "calibration": self.calibration,
                "validation": self.validation and os.path.abspath(self.validation),
                "validation_plots": list(self.validation_plots)}


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
# the tables (query groups) and the baselines


def _stored_spec(plan) -> tuple[PipelineSpec | None, str]:
    """The plan's stored spec parsed (its groups are the release's tables), or None and why not."""
    try:
        return parse_spec(plan.attrs["spec"]), ""
    except (KeyError, ValueError) as exc:
        return None, f"the plan's spec could not be parsed ({exc})"


def _layouts(spec: PipelineSpec | None, m: int) -> tuple[TableLayout, ...]:
    """The tables: the spec's query groups in order (:func:`distfit.export.tables.table_layouts`),
    or one table of every query when the stored spec does not parse or is not the plan's."""
    if spec is not None and not spec.multilevel and spec.num_queries == m:
        return table_layouts(spec, m)
    return (TableLayout("all queries", 0, m, tuple(f"query {j}" for j in range(m))),)


def _target_words(group: QueryGroupSpec | None, targets: np.ndarray) -> str:
    """A table's target in the terms the spec stated it: ``MOE ±M at 90%``, ``CV C at N``, else
    the variance (and its standard deviation) of its figures."""
    stated = group.stated if group is not None else None
    if stated and "moe" in stated:
        return f"MOE ±{_fmt(stated['moe'])} at 90%"
    if stated and "cv" in stated:
        return f"CV {_fmt(stated['cv'])} at {_fmt(stated['at'])}"
    lo, hi = float(targets.min()), float(targets.max())
    if lo == hi:
        return f"variance {lo:.4g} (sd {math.sqrt(lo):.4g})"
    return f"variance {lo:.4g} to {hi:.4g} by figure (sd {math.sqrt(lo):.4g} to {math.sqrt(hi):.4g})"


def _span(lo: float, hi: float, sign: str = "") -> str:
    """``lo`` to ``hi`` in persons, one number when they agree to the digits shown."""
    a, b = f"{sign}{lo:.4g}", f"{sign}{hi:.4g}"
    return a if a == b else f"{a} to {b}"


def _accuracy_rows(layouts: tuple[TableLayout, ...], spec: PipelineSpec | None, variances: np.ndarray,
                   targets: np.ndarray) -> list[list[Any]]:
    """One row per table: its name, figures per unit, its target as stated, the standard errors
    ``sqrt(v_j)`` and 90% margins of error ``MOE90_Z sqrt(v_j)`` of its figures (the smallest to
    the largest, persons), and whether every figure meets its target (``v_j <= t_j``)."""
    starts = np.array([t.start for t in layouts], dtype=np.int64)
    v = np.maximum(np.asarray(variances, dtype=float), 0.0)
    t = np.asarray(targets, dtype=float)
    low, high = np.sqrt(np.minimum.reduceat(v, starts)), np.sqrt(np.maximum.reduceat(v, starts))
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = np.maximum.reduceat(v / t, starts)
    groups = {g.name: g for g in spec.groups} if spec is not None and not spec.multilevel else {}
    rows = []
    for i, table in enumerate(layouts):
        met = "yes" if worst[i] <= 1 + 1e-9 else f"no: variance up to {worst[i]:.3g} x the target"
        rows.append([table.name, table.width, _target_words(groups.get(table.name), t[table.start:table.stop]),
                     _span(low[i], high[i]), _span(MOE90_Z * low[i], MOE90_Z * high[i], "±"), met])
    return rows


def _baselines(spec: PipelineSpec | None, why: str, plan) -> tuple[dict[str, float] | None, str]:
    """Max variance/target of each baseline at the plan's alpha, or None and why not."""
    if spec is None:
        return None, f"baselines skipped: {why}"
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
# the pages


#: Fits 1,280 px: the body at most 1,100 px wide, table cells wrap anywhere (a checksum, a long
#: label) rather than widen their table past the page, figures scale down to it.
_CSS = """
body { font-family: sans-serif; margin: 0 auto; padding: 1em 2em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.9em; max-width: 100%; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; overflow-wrap: anywhere; }
th { background: #eee; } td.l, th.l { text-align: left; }
figure { margin: 0.5em 0 1.5em 0; max-width: 100%; }
figure svg { display: block; max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption, .note { color: #555; font-size: 0.9em; } .warn { color: #a00; font-weight: bold; }
.confidential { color: #a00; border: 3px solid #a00; padding: 0.5em 1em; font-weight: bold; }
"""


def _table(header: list[str] | None, rows: list[list[Any]], left: int = 1) -> str:
    """An HTML table; ``header`` None for a table of name/value rows without a header row; the
    first ``left`` columns left-aligned."""
    out = ["<table>"]
    if header is not None:
        out.append("<tr>" + "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>'
                                    for i, h in enumerate(header)) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(
            f'<td class="{"l" if i < left else ""}">{_e(v)}</td>' for i, v in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _figure(figures: dict[str, str], name: str, caption: str = "") -> str:
    caption = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure id="{name}">\n{figures[name]}{caption}</figure>'


def _head(title: str) -> list[str]:
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style></head><body>"]


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


def _column_labels(layouts: tuple[TableLayout, ...], count: int) -> list[str]:
    """``table: words`` of the first ``count`` figures (the spec's first tables)."""
    out = []
    for table in layouts:
        out += [f"{table.name}: {words}" for words in table.words[:count - len(out)]]
        if len(out) >= count:
            break
    return out


def _answer_rows(release, layouts: tuple[TableLayout, ...]) -> tuple[list[str], list[list[Any]]]:
    """The first units' answers to the first figures, below one row with each figure's 90% margin
    of error ``MOE90_Z sqrt(v_j)`` (the same for every unit)."""
    n_units = min(ANSWER_UNITS, int(release.answers.shape[0]))
    n_q = min(ANSWER_QUERIES, int(release.answers.shape[1]))
    answers = np.asarray(release.answers[:n_units, :n_q], dtype=float)
    moe = MOE90_Z * np.sqrt(np.maximum(np.asarray(release.variances[:n_q], dtype=float), 0.0))
    units = [_fmt(u) for u in np.asarray(release.unit_ids[:n_units])]
    rows = [["90% margin of error"] + [f"± {h:.4g}" for h in moe]]
    rows += [[u] + list(answers[i]) for i, u in enumerate(units)]
    return ["unit"] + _column_labels(layouts, n_q), rows


def _estimate_rows(release, estimate, layouts: tuple[TableLayout, ...]) -> tuple[list[str], list[list[Any]]]:
    """The first units' raw and estimated answers to the first figures, side by side."""
    n_units = min(ANSWER_UNITS, int(release.answers.shape[0]))
    n_q = min(ANSWER_QUERIES, int(release.answers.shape[1]))
    raw = np.asarray(release.answers[:n_units, :n_q], dtype=float)
    est = np.asarray(estimate.estimates[:n_units, :n_q])
    header = ["unit"] + [f"{label} {kind}" for label in _column_labels(layouts, n_q) for kind in ("raw", "estimate")]
    units = [_fmt(u) for u in np.asarray(release.unit_ids[:n_units])]
    return header, [[u] + [v for j in range(n_q) for v in (raw[i, j], est[i, j])] for i, u in enumerate(units)]


def _geography(geography: dict) -> str:
    """A level's estimate's place in its geography (the estimate store's ``geography`` attr)."""
    level, above = geography.get("level"), geography.get("parent_level")
    if above is None:
        return f"level {level}, the coarsest of {', '.join(geography.get('levels') or [])}: the root of the geography"
    return f"level {level}: every unit's table sums exactly, cell by cell, to its parent's in level {above}"


#: The estimate section's heading and what it says the estimates are, by the store's method
#: (a multi-level run's ``hierarchy-gls``, :mod:`distfit.estimate.levels`; every other method).
_HIERARCHY_WORDS = ("Estimates: best linear unbiased, consistent across the geography",
                    "every level's units estimated together by generalised least squares over the geography "
                    "(every unit's table the sum of its children's), each query's best linear unbiased estimate; "
                    "real-valued estimates may be below 0 where the release is noisy around 0 (with --nonnegative "
                    "the tables published are their nearest nonnegative ones, still adding up, and the margins "
                    "of error the unbiased estimates'), integer ones are nonnegative counts that add up exactly")
_PROJECTION_WORDS = ("Estimates: nonnegative and consistent",
                     "per unit the nonnegative data vector closest to the release in the noise's metric, and every "
                     "query's estimate computed from it, so that the estimates never go below 0 and every table "
                     "adds up")


def _estimate_section(release, estimate, summary: dict, layouts: tuple[TableLayout, ...]) -> list[str]:
    """The estimates on the publishable page: what they are, the projection's fit, how many raw
    answers and estimates are below 0, the first units' of each (nothing from the data)."""
    a = estimate.attrs
    fit = a.get("fit") or {}
    header, rows = _estimate_rows(release, estimate, layouts)
    units = summary["units"]
    # hierarchy-gls and hierarchy-gls-nonnegative (distfit.estimate.level_stores: not imported by the report)
    heading, words = _HIERARCHY_WORDS if str(a.get("method")).startswith("hierarchy-gls") else _PROJECTION_WORDS
    return [
        f"<h2>{heading}</h2>",
        f"<p class='note'>Post-processing of the release (no privacy cost; the data is not read): {words} "
        f"({html.escape(str(a.get('objective')))}).</p>",
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


def _privacy_words(a: dict, private: bool | None) -> list[str]:
    """The guarantee in plain words: the (epsilon, delta) reading of the plan's account and its
    zCDP rho (docs/privacy.md); NOT PRIVATE for a release drawn with a fixed seed."""
    rows = (a.get("account") or {}).get("epsilon_delta", [])
    pairs = [f"ε = {float(r['epsilon']):.4g} at δ = {float(r['delta']):.0e}" for r in (rows[:1] + rows[-1:])]
    parts = [
        "<p>Every figure has random noise added to it, so the release is differentially private: whether "
        "any one person's record is in the data or not changes the probability of any outcome of the whole "
        "release (every table, every unit) by at most a factor of e<sup>ε</sup>, except with a probability "
        f"of at most δ; {' and '.join(html.escape(p) for p in pairs) or 'no (ε, δ) pairs recorded'} "
        "(every pair: the table below; smaller is more private). The guarantee is "
        f"ρ-zero-concentrated differential privacy with ρ = {_e(a.get('rho'))}, of which the (ε, δ) "
        "are the exact reading for the Gaussian noise used. A person belongs to one unit; every table of "
        "the release is counted in the one guarantee. Releasing the same data again spends it again.</p>"]
    if private is False:
        parts.append('<p class="warn">NOT PRIVATE: this release was drawn with a fixed seed (tests only); '
                     "the guarantee above holds only for a release drawn with fresh entropy.</p>")
    return parts


def _page(plan, release, spec, layouts, blocks, ratios, baselines, baseline_note, figures: dict[str, str],
          estimated: tuple | None = None) -> str:
    """``index.html``: publishable (module docstring); nothing on it is derived from the data."""
    a = plan.attrs
    account = a.get("account") or {}
    planner = a.get("planner") or {}
    m = len(plan.queries_targets)
    name = str((a.get("spec") or {}).get("name", "plan"))
    units = int(release.attrs.get("units", release.answers.shape[0])) if release is not None else None
    shown = ", ".join(t.name for t in layouts[:12]) + (f", ... ({len(layouts) - 12} more)" if len(layouts) > 12 else "")
    summary = [["tables", f"{len(layouts):,}: {shown}"], ["figures per unit", f"{m:,}"]]
    if release is not None:
        summary += [["units", f"{units:,}"], ["figures released", f"{units * m:,}"],
                    ["release", os.path.basename(release.path.rstrip("/"))], ["release checksum", release.checksum]]
    else:
        summary.append(["release", "none given: the plan's privacy and accuracy, before any release"])
    if estimated is not None:
        summary.append(["estimates", "nonnegative, consistent estimates of every figure (post-processing, "
                                     "no further privacy cost)"])
    summary += [["plan", os.path.basename(plan.path.rstrip("/"))], ["plan checksum", a.get("checksum")],
                ["created", a.get("created")], ["distfit version", a.get("distfit_version")]]
    parts = _head(f"{name}: what was released") + [
        f"<h1>{html.escape(name)}: what was released</h1>",
        _table(None, summary, left=2),
        '<p class="note">This page may be published: it is derived from the plan and the release only, never '
        "from the data. It is one file: its plots are inline, it needs no other file and no network.</p>",
        "<h2>Privacy guarantee</h2>",
        *_privacy_words(a, None if release is None else release.private),
        _table(["delta", "epsilon"], [[r["delta"], r["epsilon"]] for r in account.get("epsilon_delta", [])], left=0),
        _figure(figures, "privacy_curve"),
        "<h2>Accuracy of each table, in persons</h2>",
        "<p class='note'>Each figure is its true count plus Gaussian noise of a known standard error (the same for "
        f"every unit); figure ± its 90% margin of error ({MOE90_Z} standard errors) is a 90% interval, as the "
        "American Community Survey publishes it. The target is each table's as the spec states it.</p>",
        _table(["table", "figures per unit", "target", "standard error", "90% margin of error", "target met"],
               _accuracy_rows(layouts, spec, plan.queries_variances, plan.queries_targets), left=3),
        _figure(figures, "moe_by_table", "Dot: a figure's 90% margin of error; red tick: the margin its target "
                "allows. Tables in the spec's order."),
    ]
    if release is not None:
        header, answer_rows = _answer_rows(release, layouts)
        parts += [
            "<h2>The released figures</h2>",
            f"<p class='note'>{units:,} units x {m:,} figures, in the files of <code>distfit export</code>. The first "
            "units' answers to the first figures, under each figure's 90% margin of error:</p>",
            _table(header, answer_rows, left=1),
        ]
    if estimated is not None:
        parts += _estimate_section(release, *estimated, layouts)
    parts += [
        "<h2>Technical record of the plan</h2>",
        "<h3>Privacy account</h3>",
        _table(["quantity", "value"], [
            ["alpha (privacy cost)", a.get("alpha")],
            ["alpha exact", a.get("alpha_exact")],
            ["rho (zCDP)", a.get("rho")],
            ["composition", a.get("composition")],
            ["schema", " x ".join(f"{n}[{s}]" for n, s in zip(a["schema"]["attributes"], a["schema"]["sizes"]))],
            ["queries", m],
            ["blocks", len(blocks)],
        ]),
        "<h3>Planner decisions</h3>",
        "<ul>" + "".join(f"<li>{html.escape(str(d))}</li>" for d in planner.get("decisions", [])) + "</ul>",
        _table(["quantity", "value"], [[k, planner.get(k)] for k in (
            "alpha_sum_bound", "rounds", "variance_scale", "seconds", "spec_hash")
            if k in planner]),
        "<h3>Lower bounds on the privacy cost</h3>",
        '<p class="note">Each bound with what it bounds: the planner\'s bound holds for plans with the chosen '
        "blocks only, not for every plan; <code>distfit audit</code> re-certifies every bound by running its "
        "dual again and warns about any it did not.</p>",
        _table(["lower bound", "value", "how certified", "what it bounds"], _bound_rows(planner), left=4),
        "<h3>Blocks</h3>",
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
        "<h3>Variance / target</h3>",
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
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _validation_page(plan, release, calibrated: dict, figures: dict[str, str], compared: dict | None) -> str:
    """``validation.html``: CONFIDENTIAL (module docstring): the release, and its estimate, against
    the true answers computed from the data."""
    name = str((plan.attrs.get("spec") or {}).get("name", "plan"))
    m = len(plan.queries_targets)
    units, of_units = calibrated["units"], calibrated["of_units"]
    scope = f"all {units:,}" if units == of_units else f"the first {units:,} of {of_units:,}"
    parts = _head(f"CONFIDENTIAL: {name}: validation against the data") + [
        f"<h1>CONFIDENTIAL: {html.escape(name)}: validation against the data</h1>",
        '<p class="confidential">CONFIDENTIAL: this page compares the released answers with the true answers '
        "computed from the data. It is for the data owner's validation; do not publish or mail it. The "
        f"publishable report is {PAGE}.</p>",
        _table(None, [["plan", os.path.basename(plan.path.rstrip("/"))], ["plan checksum", plan.checksum],
                      ["release", os.path.basename(release.path.rstrip("/"))],
                      ["release checksum", release.checksum]], left=2),
        "<h2>Calibration: actual error against the promise</h2>",
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
    if compared is not None:
        parts += [
            "<h2>Estimates: error against the truth</h2>",
            _table(["error against the truth", "raw answers", "estimates"], [
                ["root mean squared error", compared["rmse_raw"], compared["rmse_estimate"]],
                ["mean absolute error", compared["mae_raw"], compared["mae_estimate"]],
            ]),
            f"<p class='note'>{compared['queries_improved']:.1%} of the queries have an estimate error at most "
            f"their raw error (RMSE over the first {compared['units']:,} units).</p>",
            _figure(figures, "estimate_error"),
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# entry point


def remove_report(out: str | os.PathLike) -> bool:
    """Remove the distfit report at ``out`` (a run told not to draw one leaves no earlier run's
    report beside its new stores); True if there was one. FileExistsError, as
    :func:`write_report`'s, for anything at ``out`` that is not a distfit report or empty."""
    path = Path(os.fspath(out))
    if not path.exists() and not path.is_symlink():
        return False
    _check_out(path)
    shutil.rmtree(path)
    return True


def write_report(plan_path: str | os.PathLike, out: str | os.PathLike,
                 release_path: str | os.PathLike | None = None,
                 data_path: str | os.PathLike | None = None,
                 estimate_path: str | os.PathLike | None = None, *, verified: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> ReportResult:
    """Write the report of the plan (and release) to ``out`` (module docstring): ``index.html``,
    and with ``data_path`` (the release's data store) the confidential ``validation.html``; with
    ``estimate_path`` (an estimate of the release) the estimate's sections. Every store is
    verified against its checksum before anything is written (one line naming the store that
    changed): the plan whole, first, and the data's root, unless ``verified`` (the caller wrote
    or verified them just before: ``distfit run``); the release and the estimate always as they
    are read (:meth:`distfit.stores.sealing.SealedKind.read_sealed`: the root first, then each
    chunk of the units the report shows hashed as it is read; the chunks it does not read it
    neither reads nor vouches for). ``progress(done, total)`` is called as the figures are drawn
    (matplotlib, laid out once per figure by :func:`distfit.report.plots.fit_row`: about 0.3 CPU-s
    each, the report's main cost, ``benchmarks/bench_report.py``; ``distfit run`` shows it as a
    progress line)."""
    out_path = Path(os.fspath(out))
    if STAGING_MARKER in out_path.name:
        raise ValueError(f"{out_path}: a report path may not contain {STAGING_MARKER!r}")
    with store_lock(out_path, "report"):  # one writer per report directory (stores/lock.py)
        return _write_report(plan_path, out_path, release_path, data_path, estimate_path, verified, progress)


def _write_report(plan_path: str | os.PathLike, out_path: Path, release_path: str | os.PathLike | None,
                  data_path: str | os.PathLike | None, estimate_path: str | os.PathLike | None,
                  verified: bool, progress: Callable[[int, int], None] | None = None) -> ReportResult:
    if out_path.exists() or out_path.is_symlink():
        _check_out(out_path)  # refuse early, before any work
    # every input verified against its checksum, before anything is written: the plan whole, the
    # release and the estimate as they are read (their roots now, each chunk when it is read)
    plan = (read_plan if verified else read_verified_plan)(plan_path)
    release = read_sealed_release(release_path) if release_path is not None else None
    if release is not None and release.attrs.get("plan_checksum") != plan.checksum:
        raise ValueError(f"{release.path}: the release was made from another plan "
                         f"(plan checksum {release.attrs.get('plan_checksum')}, not {plan.checksum})")

    blocks = block_rows(plan)  # packed blocks from their packs' arrays (distfit.report.packs)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.asarray(plan.queries_variances / plan.queries_targets, dtype=float)
    spec, why = _stored_spec(plan)
    layouts = _layouts(spec, len(plan.queries_targets))
    if data_path is not None and release is None:
        raise ValueError("--data: the calibration compares a release with its data; give the release too")
    calibrated = _calibration(plan, release, data_path, verified) if data_path is not None else None
    estimate = read_sealed_estimate(estimate_path) if estimate_path is not None else None
    if estimate is not None and (release is None or estimate.attrs.get("release_checksum") != release.checksum):
        raise ValueError(f"{estimate.path}: the estimate is not of the release "
                         f"{'given' if release is None else release.path} (release checksum "
                         f"{estimate.attrs.get('release_checksum')}); give the release it was made from")
    # the publishable page's part is computed without the truth, so it is the same with or without
    # --data; read (and each chunk checked) before any figure is drawn
    estimated = (estimate, _estimate_summary(release, estimate, None)) if estimate is not None else None
    baselines, note = _baselines(spec, why, plan)

    plt = pyplot()
    total = 4 + (calibrated is not None) + (calibrated is not None and estimate is not None)
    drawn = 0

    def draw(figure: str) -> str:
        nonlocal drawn
        drawn += 1
        if progress is not None:
            progress(drawn, total)
        return figure

    figures = {"privacy_curve": draw(plot_privacy_curve(plt, float(plan.attrs["alpha"]))),
               "moe_by_table": draw(plot_moe_by_table(plt, layouts, np.asarray(plan.queries_variances),
                                                       np.asarray(plan.queries_targets))),
               "block_alpha": draw(plot_block_alpha(plt, blocks)),
               "variance_ratio": draw(plot_variance_ratio(plt, ratios, baselines))}
    hidden: dict[str, str] = {}  # the confidential page's figures
    summary = true = validation = None
    if calibrated is not None:
        summary, z, sd, true = calibrated
        hidden["calibration"] = draw(plot_calibration(plt, z, sd))
    compared = None
    if estimate is not None and true is not None:
        compared = _estimate_summary(release, estimate, true)
        hidden["estimate_error"] = draw(plot_estimate_error(plt, compared["query_rmse_raw"],
                                                             compared["query_rmse_estimate"]))
    page = _page(plan, release, spec, layouts, blocks, ratios, baselines, note, figures, estimated)
    if summary is not None:
        validation = _validation_page(plan, release, summary, hidden, compared)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    staging.mkdir()
    try:
        (staging / PAGE).write_text(page, encoding="utf-8")
        if validation is not None:
            (staging / VALIDATION).write_text(validation, encoding="utf-8")
        (staging / MARKER).write_text("distfit report directory; `distfit report` may replace it\n",
                                      encoding="utf-8")
        move_into_place(staging, out_path, _check_out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ReportResult(path=str(out_path), plots=tuple(figures), baselines=baselines, baseline_note=note,
                        calibration=summary, validation=str(out_path / VALIDATION) if validation is not None else None,
                        validation_plots=tuple(hidden))
