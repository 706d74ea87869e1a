"""Move an installed FlashAttention 2 out of its site directory into a folder of its own.

usage: python scripts/isolate-fa2.py DEST

Run on the GPU machine after FA2 is installed (site/gpu-probing.md, step 1). FA2's regular package
`flash_attn` hides FA4's namespace package `flash_attn.cute` from every process that can see both, so
FA2 lives in DEST, which only FA2's sweep and tests put on their PYTHONPATH
(`PYTHONPATH=DEST bash scripts/gpu-probe.sh --backends fa2`). Moves the installed files (the package,
its extension module, its dist-info), so it works for a wheel built from source as the recipe does.
Exit 0 moved, 1 no FA2 to move (none installed, or only FA4's namespace package).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", help="the folder FA2 moves into (created if missing), e.g. ~/fa2site")
    dest = os.path.expanduser(ap.parse_args(argv).dest)
    import torch  # noqa: F401 - FA2's extension needs torch's libraries loaded first

    try:
        import flash_attn
    except ImportError as e:
        print(f"no flash_attn to move ({e})", file=sys.stderr)
        return 1
    if not getattr(flash_attn, "__file__", None):
        print("flash_attn here is a namespace package (FA4 only): no FA2 to move", file=sys.stderr)
        return 1
    site = os.path.dirname(os.path.dirname(os.path.abspath(flash_attn.__file__)))
    names = ["flash_attn"] + [os.path.basename(p) for p in
                              glob.glob(os.path.join(site, "flash_attn_2_cuda*.so"))
                              + glob.glob(os.path.join(site, "flash_attn-2*.dist-info"))]
    os.makedirs(dest, exist_ok=True)
    for name in names:
        target = os.path.join(dest, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        shutil.move(os.path.join(site, name), target)
    print(f"moved {', '.join(names)} from {site} to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
