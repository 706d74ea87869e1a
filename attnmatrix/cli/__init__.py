"""The `attnmatrix` command line: option parsing and printing over the workflow layer (attnmatrix/workflow.py).

Modules: group (the click group the commands register on), common (exit codes, loading, option checks),
probing (probe, run; fleet: probe --executor ray; sweeping: a sweep's device, progress and summary), cross_compile
(xcompile), evidence (validate, merge, generate, check, snapshot, diff), query (show, explain). Exit codes: see
common.py.
"""

from __future__ import annotations

from .group import main  # the commands register themselves on it when their module is imported (group.py)

__all__ = ["main"]
