"""The report's figures (:mod:`distfit.report.page`): matplotlib figures as inline SVG markup.

Each ``plot_*`` function takes the numbers it draws (numpy arrays, no store) and returns the
``<svg>`` markup of one figure (:func:`svg`): text kept as text (``svg.fonttype: none``), ids
prefixed with the figure's name and hashed with it (the same figure gives the same markup), a
scatter of more than :data:`RASTER_POINTS` points embedded as a bitmap. What each figure shows
and why: the module docstring of :mod:`distfit.report.page` and docs/report.md.
"""
from __future__ import annotations

import html
import io
import math
import re

import numpy as np

from distfit.export.tables import TableLayout
from distfit.mathematics.margins import MOE90_Z
from distfit.mathematics.privacy import epsilon_for_delta

CURVE_DELTAS = np.logspace(-12, -2, 41)
BLOCK_BARS = 40      # most blocks drawn in the alpha-per-block plot (the table lists every block)
TABLE_ROWS = 40      # most tables drawn in the margin-of-error plot (the accuracy table lists every one)
Z95 = 1.959963984540054
#: Most points drawn in the calibration scatter (an even subsample beyond).
CALIBRATION_POINTS = 20_000
#: A scatter with more points than this is drawn as a bitmap inside its SVG: one vector marker
#: per point would make the page megabytes (20,000 points: about 3 MB as vectors, 0.2 MB as a bitmap).
RASTER_POINTS = 2000
#: Resolution of those bitmaps (the rest of each figure is vector).
RASTER_DPI = 150
#: Space kept between a figure's edge, its legend and its axes' labels, and between two axes'
#: labels (inches): 3 points, the pads of matplotlib's constrained layout that :func:`fit_row` replaced.
PAD = 3 / 72
#: An id, or a reference to one, in matplotlib's SVG: ``id="``, ``href="#`` and ``url(#``.
_SVG_ID = re.compile(r'(\bid="|href="#|url\(#)')
_SVG_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)

__all__ = ["BLOCK_BARS", "CALIBRATION_POINTS", "CURVE_DELTAS", "PAD", "RASTER_DPI", "RASTER_POINTS", "TABLE_ROWS", "Z95",
           "fit_row", "label_rows", "log_scale", "outside_legend", "plot_block_alpha", "plot_calibration", "plot_estimate_error", "plot_moe_by_table",
           "plot_privacy_curve", "plot_variance_ratio", "pyplot", "svg"]


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------------------------
# plots: each returns inline SVG markup


def svg(plt, fig, name: str, description: str) -> str:
    """``fig`` as SVG markup to inline in the page (the figure is closed), laid out by
    :func:`fit_row` (every figure of the report is one row of axes).

    Text stays text (``svg.fonttype: none``: a few kB instead of glyph outlines, with a generic
    sans-serif fallback in its font list). Every id (and every reference to one) is prefixed with
    the figure's name, so the ids of a page are unique, and hashed with the figure's name as the
    salt instead of a random one, so the same figure gives the same markup. The XML prologue (not
    allowed inside HTML) and the metadata block are dropped."""
    fit_row(plt, fig, fig.axes)
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


def log_scale(plt, ax, which: str) -> None:
    """Axis ``which`` ("x" or "y") of ``ax`` on a log scale, its tick labels plain text:
    ``1e-03``, ``100``, ``1e+05`` at the decades, and the minor ticks' ``1.2``, ``1.3`` where the
    axis spans too little to hold a decade, as matplotlib's default labels them but without its
    mathtext (``10^k``): the same ticks, and no mathtext parse per label, which was ~9% of the CPU
    of Adult's report (cProfile: 60 parses, 1.46 of 16.8 s)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(plt.LogFormatter(base=10))
    axis.set_minor_formatter(plt.LogFormatter(base=10, labelOnlyBase=False))


def outside_legend(fig, ncols: int = 2) -> None:
    """One legend for the figure, outside the axes: centred at the figure's foot, where
    :func:`fit_row` keeps the axes clear of it, so it never covers data."""
    fig.legend(loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=ncols, fontsize=8, frameon=False)


def fit_row(plt, fig, axes) -> None:
    """Lay out ``axes``, one row of equal widths left to right, measured once: each axes' box
    with its tick labels and the height of its axis labels and title (``Axes.get_tightbbox``,
    ``for_layout_only``), and the widths of the texts centred on it (title, x label), measured
    where matplotlib first put the axes; its ticks then frozen (``FixedLocator`` at the ticks
    measured, so the labels drawn are the labels measured whatever the final size); the axes
    moved so that all of it lies :data:`PAD` inside the figure, apart from each other and above
    the figure's legend.

    The widths: ``each = (W - (n+1) PAD - sum(L_i + R_i)) / n`` with ``L_i, R_i`` the labels'
    room left and right of axes ``i``, each at least half the overhang ``(T_i - each) / 2`` of
    its widest centred text ``T_i`` (a fixed point of that equation, found by iterating it:
    the room is piecewise linear in ``each`` with slopes 0 and -1/2).

    What matplotlib's constrained layout did before, without its cost: it measured every axes
    in two passes and drew the figure once more to lay it out before drawing it to SVG (cProfile
    of a report: 2.1 of 4.7 s of ``savefig``); here one measure and one draw. No label is
    clipped (tests/report/test_plots.py draws every figure from awkward numbers and checks)."""
    renderer = fig.canvas.get_renderer()
    pad = PAD * fig.dpi
    width, height = fig.bbox.width, fig.bbox.height
    floor = max((legend.get_window_extent(renderer).y1 for legend in fig.legends), default=0.0)
    margins, centred = [], []
    for ax in axes:
        box, tight = ax.bbox, ax.get_tightbbox(renderer, for_layout_only=True)
        margins.append((box.x0 - tight.x0, tight.x1 - box.x1, box.y0 - tight.y0, tight.y1 - box.y1))
        centred.append(max((t.get_window_extent(renderer).width for t in (ax.title, ax.xaxis.label)
                            if t.get_visible() and t.get_text()), default=0.0))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(plt.FixedLocator(axis.get_majorticklocs()))
            axis.set_minor_locator(plt.FixedLocator(axis.get_minorticklocs()))
    left, right, below, above = np.maximum(np.asarray(margins, dtype=float), 0.0).T
    centred = np.asarray(centred)
    bottom = floor + pad + below.max()
    top = height - pad - above.max()
    room = width - pad * (len(axes) + 1)
    each = (room - left.sum() - right.sum()) / len(axes)
    for _ in range(60):  # converges by halves: 60 steps are far below a pixel
        overhang = np.maximum((centred - each) / 2, 0.0)
        lo, hi = np.maximum(left, overhang), np.maximum(right, overhang)
        each, before = (room - lo.sum() - hi.sum()) / len(axes), each
        if abs(each - before) < 1e-3:
            break
    x = pad
    for ax, l_i, r_i in zip(axes, lo, hi):
        ax.set_position([(x + l_i) / width, bottom / height, each / width, (top - bottom) / height])
        x += l_i + each + r_i + pad


def plot_privacy_curve(plt, alpha: float) -> str:
    eps = [epsilon_for_delta(alpha, float(d)) for d in CURVE_DELTAS]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(CURVE_DELTAS, eps, marker=".", color="C0")
    log_scale(plt, ax, "x")
    ax.set_xlabel("delta")
    ax.set_ylabel("epsilon")
    ax.set_title(f"Privacy curve epsilon(delta), alpha = {alpha:.4g}")
    ax.grid(True, which="both", alpha=0.3)
    return svg(plt, fig, "privacy_curve", "privacy curve epsilon(delta)")


def plot_block_alpha(plt, blocks: list[dict]) -> str:
    """The blocks' alphas, largest first, as horizontal bars (block ids readable on the y axis):
    all of them up to :data:`BLOCK_BARS`, else the largest BLOCK_BARS (the title says how many
    are shown; the table lists every block)."""
    order = sorted(blocks, key=lambda b: b["alpha"], reverse=True)[:BLOCK_BARS]
    y = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(7.5, 1.9 + 0.2 * len(order)))
    ax.barh(y, [b["alpha"] for b in order], height=0.6, color="C0", label="block alpha")
    lb = [(i, b["lower_bound"]) for i, b in enumerate(order) if math.isfinite(b["lower_bound"])]
    if lb:
        ax.scatter([v for _, v in lb], [i for i, _ in lb], color="C3", marker="|", s=250, linewidths=2,
                   zorder=3, label="certified lower bound")
    shown = f"the {len(order)} largest of {len(blocks)} blocks" if len(order) < len(blocks) else "every block"
    label_rows(ax, [b["id"] for b in order], "alpha (privacy cost of the block)",  # largest on top
               f"Privacy cost per block ({shown})")
    outside_legend(fig)
    return svg(plt, fig, "block_alpha", "privacy cost alpha per block")


def label_rows(ax, labels: list[str], xlabel: str, title: str) -> None:
    """The finish of a plot with one row per item: the items' names down the side, the first on
    top, the x axis labelled and gridded, the title."""
    ax.set_yticks(np.arange(len(labels)), labels=labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=10)


def plot_variance_ratio(plt, ratios: np.ndarray, baselines: dict[str, float] | None) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    finite = ratios[np.isfinite(ratios)]
    hi = max([1.0, float(finite.max(initial=1.0))] + list((baselines or {}).values())) * 1.05
    lo = min(1.0, float(finite.min(initial=1.0))) * 0.95
    bins = 40 if not baselines else np.linspace(lo, hi, 60)  # bars stay visible next to the baselines
    ax.hist(finite, bins=bins, color="C0", alpha=0.8, label="SM-II (this plan): its queries")
    ax.axvline(1.0, color="k", linestyle="--", label="target (ratio 1)")
    for i, (name, r) in enumerate(sorted((baselines or {}).items())):
        ax.axvline(r, color=f"C{i + 1}", linestyle="-", label=f"{name}: max {r:.3g}")
    if baselines and max(baselines.values()) > 20 * max(1.0, float(finite.max(initial=1.0))):
        log_scale(plt, ax, "x")
    ax.set_xlabel("variance / target")
    ax.set_ylabel("queries")
    ax.set_title("Variance relative to target", fontsize=10)
    outside_legend(fig, ncols=3)
    return svg(plt, fig, "variance_ratio", "histogram of variance/target")


def plot_moe_by_table(plt, layouts: tuple[TableLayout, ...], variances: np.ndarray, targets: np.ndarray) -> str:
    """Each figure's 90% margin of error ``MOE90_Z sqrt(v_j)`` (persons), one row per table in the
    spec's order (the first :data:`TABLE_ROWS`), with the margin each target allows
    ``MOE90_Z sqrt(t_j)`` as a tick: a figure left of its tick is more accurate than asked."""
    shown = layouts[:TABLE_ROWS]
    stop = shown[-1].stop
    rows = np.repeat(np.arange(len(shown)), [t.width for t in shown])
    moe = MOE90_Z * np.sqrt(np.maximum(np.asarray(variances[:stop], dtype=float), 0.0))
    allowed = MOE90_Z * np.sqrt(np.maximum(np.asarray(targets[:stop], dtype=float), 0.0))
    fig, ax = plt.subplots(figsize=(7.5, 1.9 + 0.25 * len(shown)))
    ax.scatter(allowed, rows, marker="|", s=220, linewidths=1.5, color="C3", label="margin the target allows",
               rasterized=allowed.size > RASTER_POINTS)
    ax.scatter(moe, rows, s=12, color="C0", label="a figure of the table", zorder=3,
               rasterized=moe.size > RASTER_POINTS)
    ax.set_xlim(0, float(max(moe.max(initial=0.0), allowed.max(initial=0.0))) * 1.08 or 1.0)
    which = f"the first {len(shown)} of {len(layouts)} tables" if len(shown) < len(layouts) else "every table"
    label_rows(ax, [t.name for t in shown], "90% margin of error (persons): figure ± this is a 90% interval",
               f"Margin of error of each figure, by table ({which})")  # the spec's first table on top
    outside_legend(fig)
    return svg(plt, fig, "moe_by_table", "90% margin of error of each figure, by table")


def plot_calibration(plt, z: np.ndarray, sd: np.ndarray) -> str:
    """Left: |actual error| against the promised sd per answer (log-log) with the 1.96 sd line;
    right: histogram of the standardised errors with the N(0, 1) density."""
    error = np.abs(z) * sd
    step = max(1, error.size // CALIBRATION_POINTS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    shown_sd, shown_error = sd[::step], np.maximum(error[::step], 1e-12)
    left.scatter(shown_sd, shown_error, s=3, alpha=0.3, color="C0", label="released answers",
                 rasterized=shown_sd.size > RASTER_POINTS)
    grid = np.geomspace(max(float(sd.min()), 1e-12), float(sd.max()) * 1.05, 50)
    left.plot(grid, Z95 * grid, color="C3", label="1.96 x promised sd")
    log_scale(plt, left, "x")
    log_scale(plt, left, "y")
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
    outside_legend(fig, ncols=4)
    return svg(plt, fig, "calibration", "actual error against promised standard deviation")


def plot_estimate_error(plt, raw: np.ndarray, estimated: np.ndarray) -> str:
    """Per query: RMSE of the estimates against RMSE of the raw answers, with the diagonal."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    ax.scatter(raw, estimated, s=10, color="C0", label="a query", rasterized=raw.size > RASTER_POINTS)
    top = float(max(raw.max(initial=1.0), estimated.max(initial=1.0))) * 1.05
    ax.plot([0, top], [0, top], color="k", linestyle="--", label="equal error")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("RMSE of the raw answers")
    ax.set_ylabel("RMSE of the estimates")
    ax.set_title("Error against the truth, per query (below the line: the estimate is closer)", fontsize=9)
    ax.grid(True, alpha=0.3)
    outside_legend(fig)
    return svg(plt, fig, "estimate_error", "root mean squared error of estimates against raw answers, per query")
