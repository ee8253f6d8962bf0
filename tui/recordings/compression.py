"""How a chunk's body is compressed: zstd for new recordings, zlib as recordings were first
written (both read). The chunk frame's flags say which.

zstd (level 3) against zlib (level 6) on 10 M records of an 8-rank forum loop, on the VM:
about the same size (92.6 against 90.1 MB), compressed in 0.41 s against 4.0 s (what the
recorder costs the collector's process beside the job) and inflated in 0.18 s against 0.62 s
(what ``commtop report`` waits for). Without the ``zstandard`` package (an old install), new
chunks are written with zlib, and a zstd chunk says in one line what is missing.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

#: The chunk frame's flags: its body is compressed with zlib, or with zstd.
FLAG_ZLIB = 1
FLAG_ZSTD = 2
ZSTD_LEVEL = 3
#: The most a chunk's body may inflate to (a frame holds at most 256 MB compressed; a chunk
#: of the recorder's size is a few MB): a larger claim is damage, not an allocation.
MAX_INFLATED = 1 << 30


class CompressionError(ValueError):
    """A body that does not inflate (damaged, or zstd without the zstandard package)."""


_local = threading.local()


def _zstd() -> Any | None:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def compress(body: bytes, zlib_level: int = 6) -> tuple[bytes, int]:
    """(stored bytes, flags): zstd where the package is here, else zlib; ``body`` itself
    (flags 0) when compressing does not make it smaller."""
    zstd = _zstd()
    if zstd is not None:
        compressor = getattr(_local, "compressor", None)
        if compressor is None:  # one per thread: zstandard's objects are not thread-safe
            compressor = _local.compressor = zstd.ZstdCompressor(level=ZSTD_LEVEL)
        packed, flags = compressor.compress(body), FLAG_ZSTD
    else:
        packed, flags = zlib.compress(body, zlib_level), FLAG_ZLIB
    return (packed, flags) if len(packed) < len(body) else (body, 0)


def decompress(body: bytes, flags: int) -> bytes:
    """The body as written; raises CompressionError (one line) when it does not inflate."""
    if flags & FLAG_ZSTD:
        zstd = _zstd()
        if zstd is None:
            raise CompressionError("compressed with zstd: install the zstandard package (pip install zstandard)")
        try:
            size = zstd.frame_content_size(body)
            if not 0 <= size <= MAX_INFLATED:
                raise CompressionError(f"zstd frame claims {size} bytes")
            decompressor = getattr(_local, "decompressor", None)
            if decompressor is None:
                decompressor = _local.decompressor = zstd.ZstdDecompressor()
            out: bytes = decompressor.decompress(body)
            return out
        except zstd.ZstdError as exc:
            raise CompressionError(f"zstd: {exc}") from None
    if flags & FLAG_ZLIB:
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise CompressionError(f"zlib: {exc}") from None
    return body
