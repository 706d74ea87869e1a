"""scripts/host-check.py: the comparison that guards an error message in a compiled library's host code."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("host_check", Path(__file__).parent.parent / "scripts" / "host-check.py")
host_check = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(host_check)

SOURCE = r"""
void refuse(const char *why);
int accepts(int major) {
    if (major < 8) refuse("only supports Ampere GPUs or newer.");
    return major * 3;
}
"""


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("objdump") and shutil.which("readelf")),
                    reason="needs gcc and binutils")
def test_the_guard_of_a_refusal_is_found(tmp_path):
    src = tmp_path / "ext.c"
    src.write_text(SOURCE)
    lib = tmp_path / "ext.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    (site,) = host_check.guards(str(lib), "only supports Ampere GPUs or newer.")
    assert site["function"] == "accepts"
    assert "$0x7" in site["compare"] and site["jump"].startswith("jle")
    with pytest.raises(SystemExit, match="not in .rodata"):
        host_check.guards(str(lib), "a message it does not have")
