"""Render a ``distfit report`` directory with headless Chromium and save a screenshot.

Usage::

    python benchmarks/render_report.py DIR [--out SHOT.png] [--width 1200] [--height 2000]

Loads ``DIR/index.html`` as a ``file://`` URL in ``/usr/bin/chromium`` (or ``chromium`` /
``chromium-browser`` on PATH) with networking features off and a throwaway profile directory,
writes a screenshot (default ``DIR.screenshot.png`` next to ``DIR``: the report directory itself
is not touched) and prints its path and size. Exits with status 1 and a clear message if no
Chromium is installed (``apt-get install -y chromium``) or the screenshot was not written.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name) if not name.startswith("/") else (name if Path(name).exists() else None)
        if found:
            return found
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", metavar="DIR", help="a distfit report directory (holds index.html)")
    parser.add_argument("--out", metavar="SHOT.png", help="screenshot path (default: DIR.screenshot.png)")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before giving up")
    args = parser.parse_args(argv)

    index = Path(args.dir).resolve() / "index.html"
    if not index.is_file():
        print(f"render_report: error: {index} does not exist (not a distfit report directory)", file=sys.stderr)
        return 1
    chromium = find_chromium()
    if chromium is None:
        print("render_report: error: Chromium is not installed (looked for "
              f"{', '.join(CANDIDATES)}); install it, e.g. apt-get install -y chromium", file=sys.stderr)
        return 1
    shot = Path(args.out).resolve() if args.out else index.parent.with_name(index.parent.name + ".screenshot.png")
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="render-report-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={shot}",
               f"--window-size={args.width},{args.height}", index.as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"render_report: error: Chromium did not finish within {args.timeout:g} s", file=sys.stderr)
            return 1
    if not shot.is_file() or shot.stat().st_size == 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-5:])
        print(f"render_report: error: no screenshot written (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return 1
    print(f"{shot}  {shot.stat().st_size} bytes  ({args.width}x{args.height})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
