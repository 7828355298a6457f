"""Tests for the report's figures (distfit.report.plots) drawn alone, on awkward inputs: every
label the SVG draws lies inside the figure (:func:`plots.fit_row` lays each figure out, measured
once, in place of matplotlib's constrained layout), clear of the legend and of the other axes."""
from __future__ import annotations

import numpy as np
import pytest

import distfit.report.plots as plots
from distfit.export.tables import TableLayout

#: Drawn-text boxes may touch the figure's edge by this much (pixels at 100 dpi) and still count as inside.
SLACK = 0.5


def _long_blocks(count: int) -> list[dict]:
    rng = np.random.default_rng(3)
    names = ["voting_age", "hispanic", "race_single", "race_multi", "household_type", "tenure"]
    return [{"id": f"r-{'.'.join(names[: 1 + i % len(names)])}-{i}", "alpha": float(a),
             "lower_bound": float(a) * 0.9 if i % 3 else float("nan")}
            for i, a in enumerate(rng.uniform(0.01, 5.0, count))]


def _tables(count: int, width: int) -> tuple[TableLayout, ...]:
    return tuple(TableLayout(f"table_{i}_{'x' * (i % 30)}", i * width, (i + 1) * width, ("q",) * width)
                 for i in range(count))


def _draw(name: str):
    """The markup and the figure of one report figure (``name``) drawn from awkward numbers:
    long row labels, wide tick labels, offset texts, log axes."""
    plt = plots.pyplot()
    rng = np.random.default_rng(1)
    if name == "privacy_curve":
        return plots.plot_privacy_curve(plt, 1e-3)  # epsilon to ~1e+02: wide y labels
    if name == "block_alpha":
        return plots.plot_block_alpha(plt, _long_blocks(60))  # the largest 40 drawn
    if name == "moe_by_table":
        layouts = _tables(45, 3)
        return plots.plot_moe_by_table(plt, layouts, rng.uniform(1e6, 4e8, 135), np.full(135, 1e8))
    if name == "variance_ratio":  # two million queries in one bin: counts with an offset (1e6)
        ratios = np.concatenate([np.ones(2_000_000), rng.uniform(1, 3, 100)])
        return plots.plot_variance_ratio(plt, ratios, {"gaussian": 120.0, "hierarchical": 7.5})
    if name == "calibration":
        sd = np.geomspace(1e-3, 1e5, 50_000)
        return plots.plot_calibration(plt, rng.standard_normal(sd.size), sd)
    assert name == "estimate_error"
    return plots.plot_estimate_error(plt, rng.uniform(0, 3e7, 500), rng.uniform(0, 2e7, 500))


def _in_view(axis, labels: list, coordinate: int) -> list:
    """The tick ``labels`` of ``axis`` that matplotlib draws: those of ticks in the axis's view
    interval (it keeps tick objects, and their labels, for ticks beyond the view undrawn)."""
    scale = axis.get_transform()  # compared on the axis's scale (a log axis's view starts above 0)
    lo, hi = sorted(scale.transform(np.asarray(axis.get_view_interval(), dtype=float)))
    near = 1e-9 * (hi - lo)
    at = scale.transform(np.asarray([label.get_position()[coordinate] for label in labels], dtype=float))
    return [label for label, x in zip(labels, at) if lo - near <= x <= hi + near]


def _drawn_texts(fig) -> list:
    """The figure's texts as drawn: every axes' visible tick labels (the ticks in view), axis
    labels, offset texts and title, and its legends' texts; empty ones left out."""
    texts = []
    for ax in fig.axes:
        texts += _in_view(ax.xaxis, ax.get_xticklabels(which="both"), 0)
        texts += _in_view(ax.yaxis, ax.get_yticklabels(which="both"), 1)
        texts += [ax.xaxis.label, ax.yaxis.label, ax.xaxis.offsetText, ax.yaxis.offsetText, ax.title]
    for legend in fig.legends:
        texts += legend.get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def _renderer(fig):
    """An Agg renderer of ``fig`` at the SVG's 72 dpi, the figure drawn with it again (the report
    closed the figure, and a few positions, such as an axis label's offset from its tick labels,
    are kept in pixels of the last draw): the texts then stand where the SVG has them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(72)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return renderer


def _outside(fig) -> list[str]:
    """The drawn texts whose box is not inside the figure (each with its box)."""
    renderer = _renderer(fig)
    box = fig.bbox
    found = []
    for text in _drawn_texts(fig):
        extent = text.get_window_extent(renderer)
        if (extent.x0 < box.x0 - SLACK or extent.y0 < box.y0 - SLACK
                or extent.x1 > box.x1 + SLACK or extent.y1 > box.y1 + SLACK):
            found.append(f"{text.get_text()!r} at {extent.bounds}")
    return found


@pytest.fixture
def figures(monkeypatch):
    """Each figure laid out by the report's fit_row, kept after the markup is written."""
    kept = []
    fit_row = plots.fit_row

    def keeping(plt, fig, axes):
        kept.append(fig)
        fit_row(plt, fig, axes)

    monkeypatch.setattr(plots, "fit_row", keeping)
    return kept


@pytest.mark.parametrize("name", ["privacy_curve", "block_alpha", "moe_by_table", "variance_ratio",
                                  "calibration", "estimate_error"])
def test_no_label_is_clipped(figures, name):
    """Every text the figure draws (tick labels, axis labels, offsets, titles, legend entries)
    lies inside the figure; the axes' labelled boxes are clear of the legend and of each other."""
    markup = _draw(name)
    assert markup.startswith("<svg ") and len(figures) == 1
    fig = figures[0]
    assert _outside(fig) == []
    renderer = _renderer(fig)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    for legend in fig.legends:
        drawn = legend.get_window_extent(renderer)
        assert all(box.y0 >= drawn.y1 for box in boxes), name
        assert drawn.y0 >= -SLACK  # the legend itself is in the figure
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 <= right.x0, name


def test_the_check_sees_clipped_labels(monkeypatch):
    """The check above is not empty: without the layout (matplotlib's default axes position,
    fit_row skipped), the 40 long block ids run off the figure's left edge and are reported."""
    kept = []
    monkeypatch.setattr(plots, "fit_row", lambda plt, fig, axes: kept.append(fig))
    _draw("block_alpha")
    outside = _outside(kept[0])
    assert len(outside) >= 20 and all("r-voting_age" in line for line in outside[:20])


def test_ticks_are_those_measured(figures):
    """fit_row freezes each axis at the ticks it measured: after the axes moved, the ticks (and
    so the labels that were measured) are the same, and they are matplotlib's own choice for the
    axes where it first stood (the plot's values untouched)."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([0.0, 1.0], [0.0, 0.7])
    chosen = ax.yaxis.get_majorticklocs().copy(), ax.xaxis.get_majorticklocs().copy()
    plots.fit_row(plt, fig, [ax])
    np.testing.assert_array_equal(ax.yaxis.get_majorticklocs(), chosen[0])
    np.testing.assert_array_equal(ax.xaxis.get_majorticklocs(), chosen[1])
    position = ax.get_position()
    assert position.x0 < 0.125 and position.y0 < 0.11 and position.y1 > 0.88  # larger than the default axes
    plt.close(fig)
