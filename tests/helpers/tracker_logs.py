"""Read back what W&B and SwanLab wrote offline, for the sink tests.

Both trackers keep an offline run as one transaction log in LevelDB's log format (a 7-byte
file header, then 32 KiB blocks of records, each ``crc32 (4) | length (2, LE) | type (1) |
data``, a protobuf message split over FIRST/MIDDLE/LAST pieces when it crosses a block). This
reader reassembles the messages; each test parses them with its tracker's own ``Record``
protobuf class. CRCs are not checked: the trackers' own sync does that.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

HEADER = 7
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # zero padding at a block's end
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        else:  # a zeroed tail: the writer stopped mid-block
            return
