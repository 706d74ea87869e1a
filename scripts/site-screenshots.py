#!/usr/bin/env python3
"""Screenshots of the built site in headless Chromium, at a desktop (1440 px) and a phone (390 px) width.

    python -m mkdocs build --strict -d /tmp/site-build
    python scripts/site-screenshots.py /tmp/site-build site/assets/screenshots

Serves the built site on 127.0.0.1 (Chromium resolves no other host), takes the home page, the sm_90 arch
page, the query page answering "B200, head size 256, sliding window" and the sm_90 decode plot, and writes each
as a JPEG (quality 70; a page-long PNG would outgrow the site's 300 KB per-file limit).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM = os.environ.get("ATTNMATRIX_CHROMIUM", "/usr/bin/chromium")
PAGES = [  # (name, path, height at 1440 px, height at 390 px)
    ("home", "", 1500, 2400),
    ("arch-sm_90", "archs/sm_90/", 1500, 2400),
    ("query-b200-hd256-sliding-window", "query/#gpu=sm_100%7CB200&op=prefill&dtype=bfloat16&hd=256"
     "&f=causal%2Csliding_window", 1300, 2600),
    ("plot-sm_90-decode", "plots/sm_90-tflops.svg", 760, 760),
]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def main(built: str, out_dir: str) -> None:
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=built))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, h_desktop, h_phone in PAGES:
            for width, height in ((1440, h_desktop), (390, h_phone)):
                if path.endswith(".svg") and width == 390:
                    continue  # an image is the same at any width
                png = Path(tmp) / f"{name}-{width}.png"
                subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                                f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                                "--virtual-time-budget=10000", f"--screenshot={png}", base + path],
                               check=True, capture_output=True, timeout=120)
                target = out / f"{name}-{width}.jpg"
                Image.open(png).convert("RGB").save(target, "JPEG", quality=70, optimize=True)
                print(f"{target} {target.stat().st_size // 1024} KB")
    server.shutdown()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
