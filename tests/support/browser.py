"""Headless Chromium (Debian's ``chromium``) for tests of the service's pages: a screenshot
of a URL, the boxes of a page's elements after layout, and the pixels of a PNG.

The boxes come from the page's own bytes with a short script appended that writes, for
every element a CSS selector picks, its box, text and computed style into an attribute of
the root element; ``--dump-dom`` returns the DOM after that script ran, that is after
layout. The pages themselves carry no script, so the bytes are measured from a file at the
window size of the screenshot: a box's pixels in the screenshot are the element's (the
tests sample them). The PNG decoder reads what Chromium writes: 8-bit RGB or RGBA, not
interlaced, with any of the five row filters."""

from __future__ import annotations

import html
import json
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",  # one CSS pixel is one pixel of the screenshot
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chromium() -> str:
    found = shutil.which("chromium")
    assert found, "Debian's chromium package is missing (.ci/run installs it with apt-get)"
    return found


@contextmanager
def _profile() -> Iterator[str]:
    """A fresh profile directory per run: runs share nothing, and none is left behind."""
    directory = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run(*args: str) -> str:
    with _profile() as profile:
        return subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout


def screenshot(url: str, path: Path, window: tuple[int, int]) -> Image:
    """The page at ``url`` as Chromium draws it in a window of ``window`` (width, height)
    CSS pixels, written to ``path`` and decoded."""
    _run(f"--screenshot={path}", f"--window-size={window[0]},{window[1]}", url)
    return read_png(path.read_bytes())


def dump_dom(url: str) -> str:
    """The page's DOM, serialised, once it has loaded."""
    return _run("--dump-dom", url)


@dataclass(frozen=True)
class Box:
    """An element after layout: its box in page pixels, its text as shown, its classes,
    computed background colour ("rgb(r, g, b)") and font weight, the ``data-ranks`` of the
    table row it is in (None outside one) and its index among its row's cells."""

    selector: str
    tag: str
    classes: tuple[str, ...]
    text: str
    x: float
    y: float
    width: float
    height: float
    background: str
    font_weight: int
    ranks: str | None
    cell: int | None

    @property
    def centre(self) -> tuple[int, int]:
        return int(self.x + self.width / 2), int(self.y + self.height / 2)

    def inside(self, width: int, height: int) -> bool:
        """Wholly within the first ``width`` x ``height`` pixels of the page."""
        return (
            self.width > 0
            and self.height > 0
            and self.x >= 0
            and self.y >= 0
            and self.x + self.width <= width
            and self.y + self.height <= height
        )


_MEASURE = """<script>
(() => {
  const boxes = [];
  for (const selector of SELECTORS) {
    for (const element of document.querySelectorAll(selector)) {
      const box = element.getBoundingClientRect(), style = getComputedStyle(element);
      const row = element.closest("tr");
      boxes.push({selector, tag: element.tagName.toLowerCase(), classes: [...element.classList],
        text: element.innerText, x: box.x + scrollX, y: box.y + scrollY, width: box.width,
        height: box.height, background: style.backgroundColor,
        font_weight: Number(style.fontWeight),
        ranks: row && row.dataset.ranks !== undefined ? row.dataset.ranks : null,
        cell: element.cellIndex === undefined ? null : element.cellIndex});
    }
  }
  document.documentElement.setAttribute("data-boxes", JSON.stringify(boxes));
})();
</script>"""


def boxes(page: str, selectors: list[str], window: tuple[int, int], scratch: Path) -> list[Box]:
    """The boxes of the elements of ``page`` (HTML) that each of ``selectors`` picks, in
    that order, laid out in a window of ``window`` pixels (as ``screenshot``'s)."""
    script = _MEASURE.replace("SELECTORS", json.dumps(selectors))
    assert page.count("</body>") == 1
    path = scratch / "measured.html"
    path.write_text(page.replace("</body>", script + "</body>"))
    dom = _run(f"--window-size={window[0]},{window[1]}", "--dump-dom", path.as_uri())
    start = dom.index('data-boxes="') + len('data-boxes="')
    found = json.loads(html.unescape(dom[start : dom.index('"', start)]))
    return [Box(**{**box, "classes": tuple(box["classes"])}) for box in found]


# --------------------------------------------------------------------------- PNG


@dataclass(frozen=True)
class Image:
    """Decoded pixels, ``pixels[y, x]`` = (r, g, b[, a])."""

    pixels: np.ndarray

    def rgb(self, x: int, y: int) -> tuple[int, int, int]:
        r, g, b = (int(value) for value in self.pixels[y, x, :3])
        return r, g, b


def read_png(data: bytes) -> Image:
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    header, compressed = _chunks(data)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(compressed), dtype=np.uint8).reshape(height, stride + 1)
    pixels = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        previous = pixels[y] = _unfilter(int(raw[y, 0]), raw[y, 1:], previous, channels)
    return Image(pixels.reshape(height, width, channels))


def _chunks(data: bytes) -> tuple[bytes, bytes]:
    """The IHDR chunk's body and the IDAT chunks' bodies joined."""
    position, header, compressed = 8, b"", []
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            compressed.append(body)
    return header, b"".join(compressed)


def _unfilter(kind: int, line: np.ndarray, up: np.ndarray, channels: int) -> np.ndarray:
    """One row with its filter undone: none, Sub and Up in numpy, Average and Paeth (which
    need each byte's decoded left neighbour) byte by byte."""
    if kind == 0:
        return line.copy()
    if kind == 1:
        summed = line.reshape(-1, channels).astype(np.int64).cumsum(axis=0) % 256
        return summed.astype(np.uint8).reshape(-1)
    if kind == 2:
        return line + up
    return np.array(_average_or_paeth(kind, line.tolist(), up.tolist(), channels), np.uint8)


def _average_or_paeth(kind: int, line: list[int], up: list[int], channels: int) -> list[int]:
    row = [0] * len(line)
    for i, value in enumerate(line):
        left = row[i - channels] if i >= channels else 0
        if kind == 3:
            row[i] = (value + (left + up[i]) // 2) & 255
            continue
        upper_left = up[i - channels] if i >= channels else 0
        guess = left + up[i] - upper_left
        by_left, by_up, by_corner = abs(guess - left), abs(guess - up[i]), abs(guess - upper_left)
        if by_left <= by_up and by_left <= by_corner:
            predicted = left
        else:
            predicted = up[i] if by_up <= by_corner else upper_left
        row[i] = (value + predicted) & 255
    return row
