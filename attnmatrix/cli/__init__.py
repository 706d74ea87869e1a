"""The `attnmatrix` command line: option parsing and printing over the workflow layer (attnmatrix/workflow.py).

Modules: group (the click group the commands register on; its table says which module defines each command),
common (exit codes, loading, option checks), probing (probe, run), fleet (probe --executor ray), sweeping (a
sweep's device, progress and summary), cross_compile (xcompile), evidence (validate, merge, generate, snapshot,
diff, ingest-cubins), check (the CI gate), ci_reports (validate's and check's CI report forms), query (show,
explain), stats, vllm (vllm-answers, vllm-patch). Exit codes: see common.py.
"""

from __future__ import annotations

from .group import main  # the commands register themselves on it when their module is imported (group.py)

__all__ = ["main"]
