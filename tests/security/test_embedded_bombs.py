"""The HTML report's embedded run is zlib-compressed (report/interactive.py) and inflated in the
page by extension/src/embedded.ts: its output is bounded before it sizes memory. A zip bomb
(a small stream claiming gigabytes) is refused once its output passes MAX_EMBEDDED, the 64 MiB
a view reads (`trace_view.MAX_BYTES`), quickly; a stream cut short or not zlib at all is an
EmbedError naming what does not read, never bytes half read. Run under node (as the mirror
tests run the extension's modules); in the browser: tests/browser/test_report_bombs.py."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import zlib

import pytest

from ddpviz.report import interactive
from ddpviz.widgets import trace_view
from tests.extension.mirror import _PRELUDE, EXT, TYPESCRIPT

EMBEDDED_TS = EXT / "src" / "embedded.ts"

# each case: [base64 of a zlib stream, limit]; the answer: [inflated length, crc32] or the error
_RUN = """
(async () => {
  const out = [];
  for (const [text, limit] of cases) {
    try {
      const bytes = await g.inflate(g.base64Bytes(text), limit, 'the embedded trace');
      let crc = 0;  // (a cheap digest: the bytes themselves are megabytes)
      for (let i = 0; i < bytes.length; i += 4099) crc = (crc * 31 + bytes[i]) >>> 0;
      out.push([bytes.length, crc]);
    } catch (err) {
      out.push(`${err.constructor.name}: ${err.message}`);
    }
  }
  process.stdout.write(JSON.stringify(out));
})();
"""


def _inflate(cases: list[tuple[bytes, int]]) -> list[object]:
    node = shutil.which("node")
    if node is None or not TYPESCRIPT.is_dir():
        pytest.skip("needs node and the extension's node_modules (cd extension && jlpm install)")
    payload = json.dumps([[base64.b64encode(raw).decode(), limit] for raw, limit in cases])
    result = subprocess.run([node, "-e", _PRELUDE + _RUN, str(TYPESCRIPT), "embedded", str(EXT)],
                            input=payload, capture_output=True, text=True, timeout=120,
                            check=True)
    answer: list[object] = json.loads(result.stdout)
    return answer


def _digest(data: bytes) -> list[int]:
    crc = 0
    for i in range(0, len(data), 4099):
        crc = (crc * 31 + data[i]) & 0xFFFFFFFF
    return [len(data), crc]


def _zeros(size: int) -> bytes:
    z = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join([*(z.compress(chunk) for _ in range(size >> 20)), z.flush()])


def test_the_page_s_bounds_are_python_s() -> None:
    text = EMBEDDED_TS.read_text()
    found = re.search(r"export const MAX_EMBEDDED = (\d+);", text)
    assert found is not None and int(found.group(1)) == trace_view.MAX_BYTES
    assert f"export const ENCODING = '{interactive.ENCODING}';" in text
    # what a report embeds fits in what the page inflates
    assert interactive.EMBED_MAX <= trace_view.MAX_BYTES


def test_a_zip_bomb_is_refused_once_it_passes_the_limit_and_fast() -> None:
    bomb = _zeros(256 << 20)  # 256 MiB of zeros in a quarter of a MiB
    assert len(bomb) < 1 << 19
    start = time.monotonic()
    got = _inflate([(bomb, trace_view.MAX_BYTES), (bomb, 1 << 20)])
    assert time.monotonic() - start < 30  # (node's start included; ~0.1 s of inflating)
    assert got == [
        "EmbedError: the embedded trace inflates to over the 64 MiB a view reads; it was not "
        "read past that (a damaged or tampered report).",
        "EmbedError: the embedded trace inflates to over the 1 MiB a view reads; it was not "
        "read past that (a damaged or tampered report)."]


def test_a_stream_within_the_limit_reads_whole() -> None:
    data = bytes(range(256)) * 40_000 + b"end"  # ~10 MiB
    exact = zlib.compress(b"x" * (1 << 20))
    assert _inflate([(zlib.compress(data, 6), trace_view.MAX_BYTES), (exact, 1 << 20),
                     (exact, (1 << 20) - 1), (zlib.compress(b""), 16)]) == [
        _digest(data), _digest(b"x" * (1 << 20)),
        "EmbedError: the embedded trace inflates to over the 1,048,575 bytes a view reads; it "
        "was not read past that (a damaged or tampered report).",
        [0, 0]]


@pytest.mark.parametrize("raw", [
    zlib.compress(bytes(range(256)) * 100)[:-5],  # cut short
    b"DDPVIZ\x00\x1a not compressed",  # an old report's bytes, or anything else
    zlib.compress(b"abc")[:-1] + b"\x00",  # a bad checksum
], ids=["truncated", "not-zlib", "bad-adler"])
def test_a_stream_that_does_not_inflate_is_an_error(raw: bytes) -> None:
    [got] = _inflate([(raw, trace_view.MAX_BYTES)])
    assert isinstance(got, str)
    assert got.startswith("EmbedError: the embedded trace is not a zlib stream that reads whole")


def test_the_bound_is_checked_before_the_bytes_are_kept() -> None:
    """The reader keeps chunks only while their sum is within the limit, and allocates the
    output once, of that sum: no allocation is sized by the stream's own claims."""
    text = EMBEDDED_TS.read_text()
    body = text[text.index("export async function inflate"):]
    assert body.index("if (total > limit)") < body.index("parts.push(step.value)")
    assert "new Uint8Array(total)" in body

