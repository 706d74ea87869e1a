"""Filesystem paths of the machine that ran a probe, found in and removed from the text a record keeps.

A kernel's message may name files of the machine it ran on (a JIT build's cache directory, a checkout, a
compiler's location). Those say where the probe ran, not what the kernel does, and differ per machine: a
record keeps the message with each absolute path cut to the part that names what it is (from the package
or cache folder on, else its last two components), behind a `<...>` marker. Standard library only.
"""

from __future__ import annotations

import re

# An absolute path (or ~/...) of at least two components, not inside a longer word, a relative path or a URL.
MACHINE_PATH_RE = re.compile(r"(?<![\w.>/:~-])~?/(?:[\w.+@-]+/)+[\w.+@-]*")
# Folders from which on a path names the same thing on every machine.
ANCHORS = (("site-packages/", "<site-packages>/"), ("dist-packages/", "<site-packages>/"), ("/.cache/", "<cache>/"))
KEEP_COMPONENTS = 2


def machine_paths(text: str | None) -> list[str]:
    """The machine paths in `text`, in order."""
    return MACHINE_PATH_RE.findall(text or "")


def _scrub_one(m: re.Match) -> str:
    path = m.group(0)
    for anchor, marker in ANCHORS:
        i = path.rfind(anchor)
        if i >= 0:
            return marker + path[i + len(anchor):]
    parts = [p for p in path.split("/") if p and p != "~"]
    return "<...>/" + "/".join(parts[-KEEP_COMPONENTS:])


def scrub_machine_paths(text: str | None) -> str | None:
    """`text` with every machine path cut (see the module docstring); None stays None."""
    if text is None:
        return None
    return MACHINE_PATH_RE.sub(_scrub_one, text)
