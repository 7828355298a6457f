"""Render a ``distfit report`` page alone with headless Chromium, check it, save a screenshot.

Usage::

    python benchmarks/render_report.py DIR|PAGE.html [--out SHOT.png] [--width 1200] [--height 3000]

Copies ``DIR/index.html`` (or ``PAGE.html``) *alone* into an empty temporary directory, so that a
page that needs any other file shows it, and loads it as a ``file://`` URL in headless Chromium
(``/usr/bin/chromium``, or ``chromium`` / ``chromium-browser`` / ``google-chrome`` on PATH) with
networking features off and a throwaway profile. It writes a screenshot (default
``DIR.screenshot.png`` next to ``DIR``: the report itself is not touched) and prints its path,
the page's size and the checks:

* **references** (:func:`references`): every ``src``/``href``/``xlink:href``/``url(...)`` in the
  page must be a fragment (``#id``) naming an element of the page, or a ``data:`` URI; anything
  else (another file, a network URL) is listed;
* **loads** (:func:`render_page`): the files Chromium itself opened while rendering, read from
  its verbose log (``FileURLLoader::Start`` lines): the page, and nothing else;
* **ink** (:func:`ink`): the share of non-white pixels of the screenshot, and of pixels in
  matplotlib's first colour (C0, the plots' bars, lines and points), which proves the inline
  plots were drawn.

:func:`scroll_width` lays a page out in a window of a given width and returns the document's
scroll width (the window's width when nothing is wider): the test that both report pages fit
1,280 px uses it.

Exit status 0 when the screenshot was written and every check passed, 1 otherwise (including
no Chromium installed: ``apt-get install -y --no-install-recommends chromium``).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from PIL import Image

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
#: Chromium's switches: headless, no sandbox (it refuses to run as root with one), nothing that
#: reaches the network on its own, a throwaway profile; the verbose log names each file it opens.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=1")
#: matplotlib's first colour, #1f77b4, in which the report draws its bars, curves and points.
C0 = (31, 119, 180)
_LOADED = re.compile(r"FileURLLoader::Start: (\S+)")
_CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")\s]+)")


@dataclass(frozen=True)
class Render:
    """One headless render: Chromium's exit status, the ``file://`` URLs it opened (in order)
    and the last lines of its log."""
    returncode: int
    loaded: tuple[str, ...]
    log_tail: str


def find_chromium() -> str | None:
    """The first Chromium of :data:`CANDIDATES` found, or None."""
    for name in CANDIDATES:
        found = shutil.which(name) if not name.startswith("/") else (name if Path(name).exists() else None)
        if found:
            return found
    return None


def render_page(chromium: str, page: Path, shot: Path, width: int = 1200, height: int = 3000,
                timeout: float = 120.0) -> Render:
    """Screenshot ``page`` (a local HTML file) into ``shot`` at ``width`` x ``height`` CSS pixels.
    Raises ``subprocess.TimeoutExpired`` if Chromium does not finish within ``timeout`` s."""
    with tempfile.TemporaryDirectory(prefix="render-report-") as profile:
        cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
               f"--window-size={width},{height}", page.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    log = (proc.stdout or "") + (proc.stderr or "")
    return Render(proc.returncode, tuple(_LOADED.findall(log)), "\n".join(log.strip().splitlines()[-8:]))


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif name in ("src", "href", "xlink:href", "srcset", "data", "poster", "action", "background"):
                self.refs.append(value.strip())
            elif name == "style" or name in ("clip-path", "fill", "stroke", "mask", "filter"):
                self.refs.extend(_CSS_URL.findall(value))

    def handle_endtag(self, tag: str) -> None:
        self._style = False

    def handle_data(self, data: str) -> None:
        if self._style:
            self.refs.extend(_CSS_URL.findall(data))
            self.refs.extend(re.findall(r"@import\s+['\"]?([^'\";\s]+)", data))


def references(page_text: str) -> list[str]:
    """The page's references that need something outside it: every URL in an attribute or a
    style sheet that is neither a ``data:`` URI nor a fragment naming an element of the page
    (``#id`` with that id present). Empty for a self-contained page."""
    parser = _Refs()
    parser.feed(page_text)
    parser.close()
    outside = []
    for ref in parser.refs:
        if ref.startswith("data:"):
            continue
        if ref.startswith("#") and ref[1:] in parser.ids:
            continue
        outside.append(ref)
    return outside


#: Written into a copy of a page (never the page itself, which has no scripts): at the end of the
#: body, when everything above it is laid out, the document's scroll width as an attribute that
#: ``--dump-dom`` then prints.
_MEASURE = ('<script>document.body.setAttribute("data-scroll-width", '
            'String(document.documentElement.scrollWidth));</script></body>')
_MEASURED = re.compile(r'data-scroll-width="(\d+)"')


def scroll_width(chromium: str, page: Path, width: int = 1280, height: int = 900, timeout: float = 120.0) -> int:
    """The scroll width in CSS pixels of ``page`` (a local HTML file) laid out in a ``width`` px
    window by headless Chromium: the window's width when nothing is wider (no horizontal
    scrolling), more when something is. A copy of the page with a measuring script
    (:data:`_MEASURE`) is loaded from a temporary directory and its DOM dumped (``--dump-dom``).
    ValueError when the dump carries no measurement (Chromium failed; its log's end is quoted)."""
    text = page.read_text(encoding="utf-8")
    if "</body>" not in text:
        raise ValueError(f"{page}: no </body> to measure at")
    with tempfile.TemporaryDirectory(prefix="render-report-width-") as tmp:
        copy = Path(tmp) / page.name
        copy.write_text(text.replace("</body>", _MEASURE, 1), encoding="utf-8")
        cmd = [chromium, *[f for f in FLAGS if not f.startswith(("--enable-logging", "--v="))],
               f"--user-data-dir={Path(tmp) / 'profile'}", f"--window-size={width},{height}", "--dump-dom",
               copy.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    found = _MEASURED.search(proc.stdout or "")
    if found is None:
        raise ValueError(f"{page}: Chromium gave no measurement (exit {proc.returncode}): "
                         + "\n".join((proc.stderr or "").strip().splitlines()[-5:]))
    return int(found.group(1))


def ink(shot: Path) -> tuple[float, float]:
    """(share of pixels that are not white, share within a small distance of :data:`C0`)."""
    rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    not_white = np.any(rgb < 245, axis=2)
    c0 = np.all(np.abs(rgb - np.asarray(C0, dtype=np.int16)) <= 12, axis=2)
    return float(not_white.mean()), float(c0.mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", metavar="DIR|PAGE.html", help="a distfit report directory or its index.html")
    parser.add_argument("--out", metavar="SHOT.png", help="screenshot path (default: DIR.screenshot.png)")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before giving up")
    args = parser.parse_args(argv)

    target = Path(args.target).resolve()
    index = target / "index.html" if target.is_dir() else target
    if not index.is_file():
        print(f"render_report: error: {index} does not exist (not a distfit report)", file=sys.stderr)
        return 1
    chromium = find_chromium()
    if chromium is None:
        print("render_report: error: Chromium is not installed (looked for "
              f"{', '.join(CANDIDATES)}); install it, e.g. apt-get install -y --no-install-recommends chromium",
              file=sys.stderr)
        return 1
    shot = Path(args.out).resolve() if args.out else index.parent.with_name(index.parent.name + ".screenshot.png")
    shot.unlink(missing_ok=True)
    text = index.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="render-report-page-") as alone:
        page = Path(alone) / "index.html"
        shutil.copyfile(index, page)  # the page alone: nothing next to it to load
        try:
            result = render_page(chromium, page, shot, args.width, args.height, args.timeout)
        except subprocess.TimeoutExpired:
            print(f"render_report: error: Chromium did not finish within {args.timeout:g} s", file=sys.stderr)
            return 1
        others = [url for url in result.loaded if url != page.as_uri()]
        logged_page = page.as_uri() in result.loaded
    if not shot.is_file() or shot.stat().st_size == 0:
        print(f"render_report: error: no screenshot written (exit {result.returncode}):\n{result.log_tail}",
              file=sys.stderr)
        return 1
    outside = references(text)
    dark, blue = ink(shot)
    print(f"{shot}  {shot.stat().st_size} bytes  ({args.width}x{args.height})")
    print(f"page           {len(text.encode('utf-8')):,} bytes")
    print(f"references     {len(outside)} outside the page" + (f": {outside[:5]}" if outside else ""))
    print(f"loads          {len(others)} files besides the page" + (f": {others[:5]}" if others else "")
          + ("" if logged_page else " (Chromium's log named no file: not checked)"))
    print(f"ink            {dark:.1%} of the pixels not white, {blue:.2%} in the plots' colour C0")
    return 0 if not outside and not others and logged_page and blue > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
