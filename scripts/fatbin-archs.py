#!/usr/bin/env python3
"""Which GPU archs a compiled CUDA extension carries code for: machine code (SASS) per sm, and PTX.

usage: python3 scripts/fatbin-archs.py EXTENSION.so [...] [--json]

Reads the CUDA fat binaries embedded in a shared object (no CUDA toolkit needed) and counts their entries
by kind and arch. Machine code for sm_XY runs on sm_XZ with Z >= Y of the same major; PTX for compute_XY
is compiled by the driver for any later arch on first use. So an extension with sm_80 code and compute_80
PTX only (vLLM 0.26.0's _vllm_fa2_C) runs on sm_90 and sm_10x through the driver's PTX compile, and one
with sm_90 code only (its _vllm_fa3_C) runs on sm_90 alone.

Fat binary layout (as cuobjdump reads it): a container header (magic 0xBA55ED50, u16 version, u16 header
size, u64 payload size), then entries, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size;
u64 payload size; ...; u32 arch at byte 28) followed by its payload.
"""

from __future__ import annotations

import argparse
import collections
import json
import struct
import sys
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "ptx", 2: "sass"}


def fatbin_archs(data: bytes) -> tuple[int, dict[str, list[str]]]:
    """(number of fat binaries, {"sass": ["sm_80", ...], "ptx": ["compute_80", ...]}) of a binary's bytes."""
    found: dict[str, collections.Counter] = {k: collections.Counter() for k in KINDS.values()}
    containers = 0
    i = data.find(MAGIC)
    while i != -1 and i + 16 <= len(data):
        _, header, size = struct.unpack_from("<HHQ", data, i + 4)
        p, end = i + header, i + header + size
        containers += 1
        while p + 32 <= min(end, len(data)):
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            if kind not in KINDS or not 0 < entry_header <= 4096:
                break
            arch = struct.unpack_from("<I", data, p + 28)[0]
            found[KINDS[kind]][arch] += 1
            p += entry_header + payload
        i = data.find(MAGIC, max(end, i + 4))
    return containers, {"sass": [f"sm_{a}" for a in sorted(found["sass"])],
                        "ptx": [f"compute_{a}" for a in sorted(found["ptx"])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object per file")
    args = ap.parse_args()
    for f in args.files:
        try:
            data = f.read_bytes()
        except OSError as e:
            sys.exit(f"fatbin-archs: {f}: {e.strerror or e}")
        n, archs = fatbin_archs(data)
        if args.json:
            print(json.dumps({"file": str(f), "fatbins": n, **archs}, sort_keys=True))
        else:
            print(f"{f}: {n} fat binaries; machine code: {', '.join(archs['sass']) or 'none'}; "
                  f"PTX: {', '.join(archs['ptx']) or 'none'}")


if __name__ == "__main__":
    main()
