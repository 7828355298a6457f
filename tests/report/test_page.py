"""Tests for ``distfit report`` (distfit.report.page): a publishable ``index.html`` and, with the
data, a confidential ``validation.html``, each one self-contained HTML file with inline SVG plots
(checked in the markup and, when Chromium is installed, rendered alone in headless Chromium and
measured at 1,280 px), the pages' content, refusals."""
from __future__ import annotations

import math
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import distfit.report.page as report_module
from benchmarks.render_report import find_chromium, ink, references, render_page, scroll_width
from tests.clitools import assert_one_line_error, run
from tests.reference import SMALL_SPEC
from tests.storetools import planned
from distfit.audit.plan import audit_plan
from distfit.export.tables import table_layouts
from distfit.mathematics.margins import MOE90_Z
from distfit.stores.data import write_synthetic
from distfit.estimate.job import run_estimate
from distfit.release.job import run_release
from distfit.release.noise import query_answers, true_block_answers
from distfit.stores.data import open_data
from distfit.stores.estimate import read_estimate
from distfit.report.page import MARKER, PAGE, VALIDATION
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from distfit.runtime.placement import Placement

SVG = "{http://www.w3.org/2000/svg}"


#: tests.reference.SMALL_SPEC with two of its targets stated as users state them: a 90% margin
#: of error of 3.29 (the variance (3.29 / 1.645)^2 = 4) and a CV of 0.1 at sqrt(200) (the variance 2).
STATED_SPEC = {**SMALL_SPEC, "queries": [
    SMALL_SPEC["queries"][0],
    {**SMALL_SPEC["queries"][1], "target": {"moe": 3.29}},
    {**SMALL_SPEC["queries"][2], "target": {"cv": 0.1, "at": math.sqrt(200)}},
]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-inputs")
    stated = planned(root, STATED_SPEC)
    spec, plan = stated.spec, stated.plan
    data = root / "data.zarr"
    write_synthetic(spec, 30, data, seed=1, chunk_units=10)
    release = root / "release.zarr"
    run_release(str(plan), str(data), str(release), seed=5, placement=Placement(serial=True), fsync=False)
    estimate = root / "estimate.zarr"
    run_estimate(str(plan), release, estimate, placement=Placement(serial=True), fsync=False)
    return {"plan": str(plan), "release": str(release), "root": root, "data": str(data), "spec": spec,
            "estimate": str(estimate)}


@pytest.fixture(scope="module")
def full_report(inputs, tmp_path_factory):
    """The report of the plan, its release, its data and its estimate (every section), written once."""
    out = tmp_path_factory.mktemp("full-report") / "report"
    result = report_module.write_report(inputs["plan"], out, inputs["release"], inputs["data"], inputs["estimate"])
    return out, result


def _figures(page: str) -> dict[str, ET.Element]:
    """Each ``<figure id=...>``'s inline SVG, parsed as XML (so it is well-formed)."""
    found = re.findall(r'<figure id="(\w+)">\s*(<svg .*?</svg>)', page, flags=re.S)
    return {name: ET.fromstring(svg) for name, svg in found}


def _rows(markup: str) -> list[list[str]]:
    """The cells of every table row in ``markup`` that has ``<td>`` cells (header rows left out)."""
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", markup, flags=re.S)]
    return [row for row in rows if row]


def _check_report(out: Path, validation: bool = False) -> str:
    """The directory holds the page, the marker and (``validation``: only then) the confidential
    page; each page is one file: it refers to nothing outside itself (no file, no URL: every
    src/href is a fragment naming an element of the page or a data: URI) and its ids are unique
    (so every fragment reference means one element). Returns index.html's text."""
    assert sorted(p.name for p in out.iterdir()) == sorted([PAGE, MARKER] + ([VALIDATION] if validation else []))
    if validation:
        _check_page((out / VALIDATION).read_text(encoding="utf-8"))
    return _check_page((out / PAGE).read_text(encoding="utf-8"))


def _check_page(page: str) -> str:
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), [i for i in set(ids) if ids.count(i) > 1][:5]
    for ref in re.findall(r'(?:src|href)="([^"]*)"', page) + re.findall(r"url\(([^)]*)\)", page):
        assert ref.startswith("data:") or (ref.startswith("#") and ref[1:] in ids), ref
    assert references(page) == []
    # no scripts, no URLs but the SVG namespace names (identifiers, never fetched)
    assert "<script" not in page.lower()
    assert not re.findall(r"(?:https?|ftp)://", re.sub(r'xmlns(?::\w+)?="[^"]*"', "", page))
    assert "<img" not in page  # every plot is inline SVG
    figures = _figures(page)
    assert figures and page.count("<figure ") == len(figures)
    for name, svg in figures.items():
        assert svg.tag == f"{SVG}svg", name
        assert len(list(svg.iter(f"{SVG}path"))) > 10, name  # axes, ticks and data were drawn
    assert not re.search(r"<th[^>]*></th>", page)  # no empty header cell (issue 13)
    return page


def _rect(path_d: str) -> tuple[float, float, float, float]:
    xs, ys = zip(*[(float(x), float(y)) for x, y in re.findall(r"([-\d.]+) ([-\d.]+)", path_d)])
    return min(xs), min(ys), max(xs), max(ys)


def _legend_points(svg: ET.Element, name: str) -> tuple[list, list]:
    """(the axes rectangles, every coordinate the figure's legends draw at), in SVG units."""
    groups = {g.get("id"): g for g in svg.iter(f"{SVG}g")}
    axes = [_rect(next(g.iter(f"{SVG}path")).get("d")) for gid, g in groups.items()
            if re.fullmatch(rf"{name}-axes_\d+", gid or "")]
    points = []
    for gid, g in groups.items():
        if re.fullmatch(rf"{name}-legend_\d+", gid or ""):
            for el in g.iter():
                if el.get("x") is not None and el.get("y") is not None:
                    points.append((float(el.get("x")), float(el.get("y"))))
                if el.tag == f"{SVG}path" and el.get("d"):
                    points += [(float(x), float(y)) for x, y in re.findall(r"([-\d.]+) ([-\d.]+)", el.get("d"))]
    return axes, points


def test_legends_do_not_cover_the_plots(full_report):
    """Issue 13: every legend is drawn outside every axes of its figure (the block bars and the
    baselines' lines were hidden behind legends inside the axes)."""
    out, _ = full_report
    figures = {**_figures((out / PAGE).read_text(encoding="utf-8")),
               **_figures((out / VALIDATION).read_text(encoding="utf-8"))}
    with_legend = 0
    for name, svg in figures.items():
        axes, points = _legend_points(svg, name)
        assert axes, name
        if not points:
            continue
        with_legend += 1
        inside = [(x, y) for x, y in points for x0, y0, x1, y1 in axes if x0 < x < x1 and y0 < y < y1]
        assert not inside, (name, inside[:3])
    assert with_legend >= 5  # moe_by_table, block_alpha, variance_ratio, calibration, estimate_error


def test_report_with_release(inputs, full_report, tmp_path, capsys):
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out))
    assert code == 0, err
    page = _check_report(out)
    assert set(_figures(page)) == {"privacy_curve", "moe_by_table", "block_alpha", "variance_ratio"}
    assert "plots          4  (privacy_curve, moe_by_table, block_alpha, variance_ratio)" in stdout
    assert "validation" not in stdout and "CONFIDENTIAL" not in page
    plan = read_plan(inputs["plan"])
    assert f"{plan.attrs['alpha']:.6g}" in page
    assert "Privacy account" in page and "Privacy guarantee" in page and "differentially private" in page
    for row in plan.attrs["account"]["epsilon_delta"]:
        assert f"<td class=\"\">{row['delta']:.6g}</td>" in page
        assert f"{row['epsilon']:.6g}" in page
    for decision in plan.attrs["planner"]["decisions"]:
        assert decision.split(":")[0] in page
    assert "certificate gap" in page and "NOT PRIVATE" in page
    # small domain (36 cells): the baselines are computed and shown
    assert "matrix_mechanism" in page and "gaussian" in page
    assert "baselines" in stdout
    # nothing but the report is left next to it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_what_was_released_and_its_accuracy_in_persons(inputs, full_report):
    """Issue 30: the page says what was released (the tables, units and figures), the guarantee
    in plain words with the plan's rho and (epsilon, delta), and each table's accuracy in persons:
    the standard errors sqrt(v) and 90% margins of error 1.645 sqrt(v) of its figures (recomputed
    here from the plan's variances, spec order), its target in the spec's own terms (a margin of
    error, a CV, else the variances) and whether every figure meets it."""
    out, _ = full_report
    page = (out / PAGE).read_text(encoding="utf-8")
    plan, release, spec = read_plan(inputs["plan"]), read_release(inputs["release"]), inputs["spec"]
    summary = _rows(page[page.index("what was released</h1>"):page.index("<h2>Privacy guarantee")])
    assert summary[0] == ["tables", "3: age, age_sex, sex_edu"] and ["units", "30"] in summary
    assert ["figures per unit", "24"] in summary and ["figures released", f"{30 * 24:,}"] in summary
    assert ["release checksum", release.checksum] in summary
    words = page[page.index("<h2>Privacy guarantee"):page.index("<table>", page.index("<h2>Privacy guarantee"))]
    assert "one person's record" in words and f"ρ = {plan.attrs['rho']:.6g}" in words
    first = plan.attrs["account"]["epsilon_delta"][0]
    assert f"ε = {first['epsilon']:.4g} at δ = {first['delta']:.0e}" in words
    accuracy = _rows(page[page.index("<h2>Accuracy of each table"):page.index('<figure id="moe_by_table"')])
    v = np.asarray(plan.queries_variances, dtype=float)
    stated = {"age": "variance 1 to 3 by figure (sd 1 to 1.732)", "age_sex": "MOE ±3.29 at 90%",
              "sex_edu": "CV 0.1 at 14.1421"}
    assert [row[0] for row in accuracy] == [g.name for g in spec.groups]
    for row, table in zip(accuracy, table_layouts(spec, v.size)):
        se = np.sqrt(v[table.start:table.stop])
        lo, hi = f"{se.min():.4g}", f"{se.max():.4g}"
        assert row[1] == str(table.width) and row[2] == stated[table.name]
        assert row[3] == (lo if lo == hi else f"{lo} to {hi}")
        lo, hi = f"±{1.645 * se.min():.4g}", f"±{1.645 * se.max():.4g}"
        assert row[4] == (lo if lo == hi else f"{lo} to {hi}") and row[5] == "yes"  # accuracy-first: met
    assert MOE90_Z == 1.645
    # the stored spec keeps the stated targets (the page's source) and the plan still passes the audit
    assert [q["target"] for q in plan.attrs["spec"]["queries"][1:]] == [{"moe": 3.29}, {"cv": 0.1, "at": math.sqrt(200)}]
    assert audit_plan(inputs["plan"]).ok


def test_answers_with_their_margins_of_error(inputs, full_report):
    """The first units' answers to the first figures as numbers under each figure's 90% margin
    of error 1.645 sqrt(variance) (recomputed here from the release), the figures labelled in
    words by table; the margin-of-error plot has one row per table, labelled with its name, in
    the spec's order (not by query index), and a dot and a target tick per figure."""
    out, _ = full_report
    page = (out / PAGE).read_text(encoding="utf-8")
    release = read_release(inputs["release"])
    moe = 1.645 * np.sqrt(np.asarray(release.variances, dtype=float))
    table = page[page.index("<h2>The released figures"):page.index("<h2>Estimates")]
    header = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert header == ["unit", "age: age 0", "age: age 0 to 1", "age: age 0 to 2", "age: age 0 to 3"]
    cells = _rows(table)
    assert cells[0] == ["90% margin of error"] + [f"± {h:.4g}" for h in moe[:4]]
    answers = np.asarray(release.answers[:20, :4], dtype=float)
    assert len(cells) == 1 + 20
    for i, row in enumerate(cells[1:]):
        assert row[0] == str(np.asarray(release.unit_ids[:20])[i])
        np.testing.assert_allclose([float(v) for v in row[1:]], answers[i], rtol=1e-5)
    assert "95% interval" not in page and "(+-" not in page
    svg = _figures(page)["moe_by_table"]
    texts = ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]
    names = [g.name for g in inputs["spec"].groups]
    assert [t for t in texts if t in names] == names  # the y axis: the tables, first on top
    assert not any("index" in t for t in texts) and any("90% margin of error (persons)" in t for t in texts)
    points = [u for g in svg.iter(f"{SVG}g") if (g.get("id") or "").startswith("moe_by_table-PathCollection")
              for u in g.iter(f"{SVG}use")]
    assert len(points) == 2 * moe.size + 2  # a dot and a tick per figure, and the legend's two markers
    assert math.isfinite(moe.max())


def test_report_without_release_and_overwrite(inputs, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 0, err
    page = _check_report(out)
    assert "The released figures" not in page and "none given" in page
    # a previous report (marker file) is replaced, also one of an earlier version with PNG files
    (out / "answers_0.png").write_bytes(b"old")
    code, _, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out), "--data", inputs["data"])
    assert code == 0, err
    assert "The released figures" in _check_report(out, validation=True)
    # a report without the data replaces one with it: no confidential page is left behind
    code, _, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out))
    assert code == 0, err
    _check_report(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(empty))
    assert code == 0, err
    _check_report(empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "report"]


def _chromium() -> str:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium binary (chromium, chromium-browser, google-chrome): the rendering check "
                    "needs one (apt-get install -y --no-install-recommends chromium); the markup checks ran")
    return chromium


def test_the_pages_render_alone_in_chromium(full_report, tmp_path):
    """Issue 13: each page, copied alone into an empty directory, renders in headless Chromium:
    a screenshot with the plots drawn (pixels in matplotlib's colour C0), and Chromium opens no
    file but the page. The same page with one image file it lacks is caught (the check can fail)."""
    chromium = _chromium()
    out, _ = full_report
    for name in (PAGE, VALIDATION):
        alone = tmp_path / f"alone-{name}"
        alone.mkdir()
        page = alone / name
        shutil.copyfile(out / name, page)
        shot = tmp_path / f"{name}.png"
        result = render_page(chromium, page, shot, width=1200, height=6000, timeout=120)
        assert shot.is_file() and shot.stat().st_size > 10_000, result.log_tail
        assert page.as_uri() in result.loaded, ("Chromium's verbose log names no file it opened "
                                               f"(FileURLLoader::Start): {result.log_tail}")
        assert result.loaded == (page.as_uri(),), result.loaded
        dark, blue = ink(shot)
        # text, tables and the inline plots were drawn (the validation's scatter and histogram are
        # translucent, alpha 0.3 and 0.7: few of their pixels are C0 itself)
        assert dark > 0.02 and blue > {PAGE: 1e-3, VALIDATION: 3e-5}[name], (name, dark, blue)
    page = tmp_path / f"alone-{PAGE}" / PAGE
    # negative control: a page that needs another file
    broken = tmp_path / "broken"
    broken.mkdir()
    text = page.read_text(encoding="utf-8").replace("</body>", '<img src="missing.png" alt="x"></body>')
    (broken / PAGE).write_text(text, encoding="utf-8")
    result = render_page(chromium, broken / PAGE, tmp_path / "broken.png", width=400, height=300, timeout=120)
    assert (broken / "missing.png").as_uri() in result.loaded
    assert references(text) == ["missing.png"]


def test_the_pages_fit_1280_pixels(full_report, tmp_path):
    """Issue 30: laid out by headless Chromium in a window 1,280 px wide, neither page is wider
    than the window (the document's scroll width: no horizontal scrolling), the block table of
    13 columns and the 71-character checksums included. The same page with one element 1,500 px
    wide measures wider (the measurement can fail)."""
    chromium = _chromium()
    out, _ = full_report
    for name in (PAGE, VALIDATION):
        assert scroll_width(chromium, out / name, width=1280) <= 1280, name
    wide = tmp_path / PAGE
    wide.write_text((out / PAGE).read_text(encoding="utf-8").replace(
        "</body>", '<div style="width: 1500px">wide</div></body>'), encoding="utf-8")
    assert scroll_width(chromium, wide, width=1280) > 1500


def test_report_bad_inputs(inputs, tmp_path, capsys):
    code, _, err = run(capsys, "report", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "no such plan store")
    notplan = tmp_path / "notplan"
    notplan.mkdir()
    (notplan / "x.txt").write_text("x")
    code, _, err = run(capsys, "report", str(notplan), "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "not a Zarr v3 group")
    # a plan given where the release belongs
    code, _, err = run(capsys, "report", inputs["plan"], inputs["plan"], "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "not 'release'")
    assert not (tmp_path / "r").exists()


def test_report_refuses_foreign_directory(inputs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 2
    assert_one_line_error(err, "not a distfit report")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    afile = tmp_path / "file.html"
    afile.write_text("x")
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(afile))
    assert code == 2
    assert_one_line_error(err, "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.html", "mine"]


def test_true_answers_are_the_workload_times_the_counts(inputs):
    """The calibration's truth (block marginals through B and L, summed per query) equals the
    dense workload matrix times the full-domain counts: an independent path."""
    import numpy as np

    from distfit.stores.data import open_data
    from distfit.release.noise import query_answers, true_block_answers

    plan = read_plan(inputs["plan"])
    data = open_data(inputs["data"])
    rows = [(plan.block(b).query_index, true_block_answers(plan.block(b), data.block_counts(plan.block(b).attributes, 0, 30)))
            for b in plan.block_ids]
    workload = inputs["spec"].workload()
    counts = np.asarray(data.counts[:30], dtype=float)
    np.testing.assert_allclose(query_answers(rows, workload.matrix.shape[0]), counts @ workload.matrix.T,
                               rtol=1e-9, atol=1e-8)


def test_calibration_section(inputs, tmp_path, capsys, monkeypatch):
    """30 units x 24 queries of a seeded release: the standardised errors are N(0, 1), so about
    95% lie within 1.96 sd (the binomial sd of the share over 720 answers is 0.8%; the noise is
    correlated within a unit, so the bounds are wide). With a cap below the release's size the
    page says that the answers compared are a subset (issue 13)."""
    m = len(read_plan(inputs["plan"]).queries_targets)
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out),
                            "--data", inputs["data"])
    assert code == 0, err
    page = _check_report(out, validation=True)
    confidential = (out / VALIDATION).read_text(encoding="utf-8")
    assert "calibration" in _figures(confidential) and "CONFIDENTIAL" in confidential
    assert f"{30 * m} (all 30 units x {m} queries)" in confidential
    assert f"validation     {out / VALIDATION}  (CONFIDENTIAL" in stdout
    # nothing of the data on the publishable page: it is the page written without the data
    alone = tmp_path / "alone"
    code, _, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(alone))
    assert code == 0, err
    assert page == _check_report(alone) and "CONFIDENTIAL" not in page and "calibration" not in page
    share = float(re.search(r"calibration +([0-9.]+)% of (\d+) answers", stdout).group(1)) / 100
    assert 0.90 <= share <= 0.99, stdout
    monkeypatch.setattr(report_module, "CALIBRATION_ANSWERS", 10 * m + 1)
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out),
                            "--data", inputs["data"])
    assert code == 0, err
    _check_report(out, validation=True)
    assert f"{10 * m} (the first 10 of 30 units x {m} queries)" in (out / VALIDATION).read_text(encoding="utf-8")
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(tmp_path / "r2"), "--data", inputs["data"])
    assert code == 2 and "give the release too" in err


def test_the_planner_bounds_are_named_for_what_they_bound(inputs, tmp_path, capsys):
    """Issue 12: the planner's bound holds for plans with the chosen blocks only, and the page
    says so; the global bound is stated beside it ("not known" for this two-block plan)."""
    out = tmp_path / "report"
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 0, err
    page = (out / PAGE).read_text(encoding="utf-8")
    bound = read_plan(inputs["plan"]).attrs["planner"]["chosen_blocks_lower_bound"]
    assert "plans with the chosen blocks only" in page and f"{bound['value']:.6g}" in page
    assert bound["method"] in page and "block-diagonal plan with the chosen blocks" in page
    assert "global: every plan of this form" in page and "not known: the plan has 2 blocks" in page
    assert "allocation_lower_bound" not in page


def _estimate_table(page: str) -> list[list[str]]:
    section = page[page.index("<h2>Estimates: nonnegative"):]
    table = section[section.index("raw and estimated answers"):]
    table = table[:table.index("</table>")]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)][1:]


def test_estimate_section(inputs, full_report, tmp_path, capsys):
    """Raw against estimated answers: the first units' answers side by side (read back here), the
    share of raw answers below 0 (none of the estimates), the projection's fit; with the data, the
    RMSE and mean absolute error of each against the truth, recomputed here, and one point per
    query in the figure. An estimate of another release is refused (exit 2)."""
    release, estimate = read_release(inputs["release"]), read_estimate(inputs["estimate"])
    raw, est = np.asarray(release.answers[...], dtype=float), np.asarray(estimate.estimates[...])
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out),
                            "--estimate", inputs["estimate"])
    assert code == 0, err
    page = _check_report(out)
    assert "estimate_error" not in _figures(page) and "CONFIDENTIAL" not in page
    assert f"<td class=\"\">{np.mean(raw < 0):.2%}</td>" in page and f"<td class=\"\">{0:.2%}</td>" in page
    assert f"{estimate.attrs['fit']['objective_mean']:.6g}" in page and "projection" in page
    rows = _estimate_table(page)
    assert len(rows) == 20
    for i, row in enumerate(rows):
        assert row[0] == str(np.asarray(release.unit_ids[:20])[i])
        np.testing.assert_allclose([float(v) for v in row[1:]], np.column_stack([raw[i, :4], est[i, :4]]).ravel(),
                                   rtol=1e-5)
    assert page == (full_report[0] / PAGE).read_text(encoding="utf-8")  # the data adds nothing to index.html
    full = (full_report[0] / VALIDATION).read_text(encoding="utf-8")
    assert full_report[1].validation_plots == ("calibration", "estimate_error")
    assert "estimate_error" not in full_report[1].plots
    plan, data = read_plan(inputs["plan"]), open_data(inputs["data"])
    true = query_answers([(plan.block(b).query_index,
                           true_block_answers(plan.block(b), data.block_counts(plan.block(b).attributes, 0, 30)))
                          for b in plan.block_ids], raw.shape[1])
    for value in (np.sqrt(np.mean((raw - true) ** 2)), np.sqrt(np.mean((est - true) ** 2)),
                  np.mean(np.abs(raw - true)), np.mean(np.abs(est - true))):
        assert f"<td class=\"\">{value:.6g}</td>" in full
    svg = _figures(full)["estimate_error"]
    points = [u for g in svg.iter(f"{SVG}g") if (g.get("id") or "").startswith("estimate_error-PathCollection")
              for u in g.iter(f"{SVG}use")]
    assert len(points) == raw.shape[1] + 1  # one per query, and the legend's marker
    other = tmp_path / "other.zarr"
    run_release(inputs["plan"], inputs["data"], other, seed=6, placement=Placement(serial=True), fsync=False)
    capsys.readouterr()
    code, _, err = run(capsys, "report", inputs["plan"], str(other), "--out", str(tmp_path / "r2"),
                       "--estimate", inputs["estimate"])
    assert code == 2
    assert_one_line_error(err, "the estimate is not of the release")
