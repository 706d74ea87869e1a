"""Move an installed FlashAttention 2 out of its site directory into DEST (default /tmp/fa2site).

Runs ON the GPU machine, after build-fa2.sh installed FA2 into the system Python. FA2's regular
package `flash_attn` hides FA4's namespace package `flash_attn.cute` from every process that can see
both, so FA2 lives in its own folder, which only FA2's sweep and tests put on their
PYTHONPATH. Works from the installed files (the package, its extension module, its dist-info), not
from pip's wheel cache, which pip does not fill for a build from a local directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys


def main() -> int:
    dest = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fa2site"
    import torch  # noqa: F401 - FA2's extension needs torch's libraries loaded first

    # isort: split
    import flash_attn

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
