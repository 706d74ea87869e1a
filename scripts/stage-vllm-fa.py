#!/usr/bin/env python3
"""Stage one carried part of a vLLM FlashAttention bundle on the GPU machine; unpack once all parts are in.

usage: python3 scripts/stage-vllm-fa.py .gpu/vllm-fa3 [--parts /root/vllm-fa-parts] [--site /root/vllm-fa]

Each bundle folder (written by scripts/pack-vllm-fa.py) holds one part of a zip and a manifest.json with
the sha256 of the part and of the whole zip. Parts are copied to --parts as they arrive, one call each
(a call carries at most 64 MiB). When every part of a build is there, the joined zip's sha256 is checked
and it is unpacked into --site, the folder to put on PYTHONPATH: `vllm/vllm_flash_attn/` with the
extension, and `vllm-<release>.dist-info/`, so the records name the vLLM release as the kernel version.
Standard library only (the machine has no `unzip`). Exit 0 with "staged ... into SITE" when the build is
ready, 0 with "part i of n staged" when more parts are to come, 1 on a checksum or file error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import zipfile
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fail(msg: str) -> None:
    print(f"stage-vllm-fa: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="a carried bundle folder, e.g. .gpu/vllm-fa2-1")
    ap.add_argument("--parts", type=Path, default=Path("/root/vllm-fa-parts"))
    ap.add_argument("--site", type=Path, default=Path("/root/vllm-fa"))
    args = ap.parse_args()
    mf_path = args.bundle / "manifest.json"
    try:
        mf = json.loads(mf_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        fail(f"{mf_path}: cannot read the manifest ({e}); was the folder carried?")
    part = args.bundle / mf["part_file"]
    if not part.is_file():
        fail(f"{part}: missing (the manifest names it)")
    if sha256(part) != mf["part_sha256"]:
        fail(f"{part}: sha256 differs from the manifest's; carry the folder again")
    store = args.parts / mf["backend"]
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / (mf["part_file"] + ".tmp")
    shutil.copyfile(part, tmp)
    tmp.replace(store / mf["part_file"])
    n = mf["parts"]
    names = [f"{mf['zip']}.part{i + 1}of{n}" for i in range(n)]
    have = [p for p in names if (store / p).is_file()]
    if len(have) < n:
        left = [i + 1 for i, p in enumerate(names) if p not in have]
        print(f"{mf['backend']}: part {mf['part']} of {n} staged in {store}; still to carry: part(s) "
              f"{', '.join(map(str, left))}")
        return
    joined = store / mf["zip"]
    with joined.open("wb") as out:
        for p in names:
            with (store / p).open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256(joined) != mf["zip_sha256"]:
        joined.unlink()
        fail(f"{joined}: sha256 of the joined parts differs from the manifest's; stage the parts again")
    args.site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(joined) as z:
        z.extractall(args.site)
    joined.unlink()
    for p in names:
        (store / p).unlink()
    so = args.site / mf["extension"]
    print(f"staged {mf['backend']} (vLLM {mf['vllm']}, {so.stat().st_size / 2**20:.0f} MiB extension, "
          f"from {mf['wheel']}) into {args.site}")


if __name__ == "__main__":
    main()
