"""`attnmatrix vllm-patch`: a unified diff git applies to a vLLM checkout, calling the generated module."""

from __future__ import annotations

import ast
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnmatrix.cli import main
from attnmatrix.engines.vllm import patch as P
from attnmatrix.engines.vllm import selection

# A checkout with the three functions in the shape vLLM 0.33.0 gives them (written for this test).
FILES = {
    P.FA_UTILS: '''
        from typing import Any

        import vllm.envs as envs
        from vllm.platforms import current_platform


        def get_flash_attn_version(requires_alibi=False, head_size=None, head_size_v=None, has_sinks=False,
                                   requires_softcap=False, kv_cache_block_size=None, supports_fa4_hd256=False):
            try:
                device_capability = current_platform.get_device_capability()
                assert device_capability is not None
                fa_version = 2 if requires_alibi else 4
                return fa_version
            except (ImportError, AssertionError):
                return None


        def is_fa_version_supported(fa_version):
            return True
    ''',
    P.INTERFACE: '''
        class Platform:
            @classmethod
            def get_mla_prefill_backend_cls(cls, mla_selector_config):
                """Pick one."""
                device_capability = cls.get_device_capability()
                priorities = ["FLASH_ATTN"]
                all_invalid_reasons = {}
                return priorities, all_invalid_reasons
    ''',
    P.FLASH_ATTN: '''
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version


        class FlashAttentionBackend:
            @classmethod
            def _get_fa4_hd256_block_size(cls, kv_cache_spec=None):
                head_size, head_size_v = 256, None
                if head_size == 256 and get_flash_attn_version(head_size=head_size) == 4:
                    return 128
                return None
    ''',
}


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "vllm-src"
    for path, text in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text).lstrip())
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="git applies the patch")
def test_patch_applies_and_calls_the_generated_module(checkout, tmp_path):
    out = tmp_path / "vllm.diff"
    res = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout), "-o", str(out)])
    assert res.exit_code == 0, res.output
    subprocess.run(["git", "apply", "--check", str(out)], cwd=checkout, check=True)
    subprocess.run(["git", "apply", str(out)], cwd=checkout, check=True)
    fa_utils = (checkout / P.FA_UTILS).read_text()
    assert "selection.get_flash_attn_version(" in fa_utils and "fa_version = 2 if requires_alibi" not in fa_utils
    assert "get_mla_prefill_backend_priorities(" in (checkout / P.INTERFACE).read_text()
    assert "return get_fa_kernel_page_size(head_size, head_size_v)" in (checkout / P.FLASH_ATTN).read_text()
    for path in (P.FA_UTILS, P.INTERFACE, P.FLASH_ATTN):
        ast.parse((checkout / path).read_text())
    vendored = checkout / P.VENDOR_DIR / "selection.py"
    assert vendored.read_text() == Path(selection.__file__).read_text()


def test_its_own_output_is_replaced_and_a_missing_checkout_refused(checkout, tmp_path):
    out = tmp_path / "vllm.diff"
    for _ in range(2):
        res = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout), "-o", str(out)])
        assert res.exit_code == 0, res.output
    assert P.is_our_patch(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(main, ["vllm-patch", "--source", str(empty)])
    assert res.exit_code == 2 and f"no {P.FA_UTILS}" in res.output


def test_stdout_and_deterministic(checkout):
    a = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout)])
    b = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout)])
    assert a.exit_code == 0 and a.output == b.output and a.output.startswith("diff --git a/vllm/attnmatrix/__init__.py")


def test_a_checkout_of_another_shape_is_refused_naming_file_and_function(checkout):
    (checkout / P.INTERFACE).write_text("class Platform:\n    pass\n")
    res = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout)])
    assert res.exit_code == 2
    assert f"{P.INTERFACE}: no function Platform.get_mla_prefill_backend_cls" in res.output


def test_a_foreign_output_file_is_not_replaced(checkout, tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    res = CliRunner().invoke(main, ["vllm-patch", "--source", str(checkout), "-o", str(other)])
    assert res.exit_code == 2 and other.read_text() == "mine\n"
