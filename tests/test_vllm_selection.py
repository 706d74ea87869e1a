"""The generated vLLM-shaped module (attnmatrix/engines/vllm/selection.py) and its call profile."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnmatrix import selector
from attnmatrix.engines.vllm import module as M
from attnmatrix.engines.vllm import selection as S
from attnmatrix.selector_vllm import EngineProfile, MultipleOf

BLACKWELL = (10, 0)
HD256 = dict(head_size=256, kv_cache_block_size=128, supports_fa4_hd256=True, capability=BLACKWELL)


def test_hd256_kernel_runs_when_nothing_rules_it_out():
    assert S.get_flash_attn_version(**HD256) == 4
    assert S.get_supported_kernel_block_sizes(256, capability=BLACKWELL) == [128]


@pytest.mark.parametrize("config", [
    dict(supports_fa4_hd256=False), dict(is_mm_prefix_lm=True), dict(rswa_window=512),
    dict(decode_context_parallel_size=2), dict(model_softcap=50.0), dict(kv_cache_dtype="fp8"),
    dict(requires_softcap=True), dict(kv_cache_block_size=16), dict(kv_cache_block_size=64),
])
def test_an_input_the_hd256_kernel_refuses_falls_back_to_fa2(config):
    assert S.get_flash_attn_version(**{**HD256, **config}) == 2


def test_a_block_that_is_a_multiple_of_the_kernel_page_is_split():
    assert S.get_flash_attn_version(**{**HD256, "kv_cache_block_size": 256}) == 4


def test_no_version_where_every_flash_attention_build_refuses():
    # vLLM's FA2 has no sinks (s_aux) and needs V at the Q/K head size; FA4's hd256 kernel has no sinks either.
    assert S.get_flash_attn_version(**{**HD256, "has_sinks": True}) is None
    assert S.get_flash_attn_version(**{**HD256, "head_size_v": 64}) is None
    assert S.get_supported_kernel_block_sizes(256, 128, capability=BLACKWELL) == [MultipleOf(16)]


def test_installed_versions_narrow_the_answer():
    assert S.get_flash_attn_version(**HD256, available_versions=(2,)) == 2
    assert S.get_flash_attn_version(**HD256, available_versions=()) is None


def test_unknown_capability_answers_none_and_flash_attn_only_for_mla():
    assert S.get_flash_attn_version(head_size=128, capability=None) is None
    assert S.get_mla_prefill_backend_priorities(None, 128, 64, 128) == ["FLASH_ATTN"]


def test_mla_priorities_raw_and_validated():
    raw = S.get_mla_prefill_backend_priorities(BLACKWELL, 192, 64, 256)
    valid = S.get_valid_mla_prefill_backends(BLACKWELL, 192, 64, 256)
    assert raw[:len(valid)] == valid and set(valid) < set(raw)
    assert raw[-1] == "TOKENSPEED_MLA"  # no attnmatrix backend: tried last
    assert S.get_mla_prefill_backend_priorities((9, 0), 128, 64, 128) == ["FLASH_ATTN"]
    assert S.get_valid_mla_prefill_backends(BLACKWELL, 0, 0, 0) == []
    assert S.get_mla_prefill_backend_priorities(BLACKWELL, 0, 0, 0)  # the names the arch accepts, all invalid


def test_a_refusal_removed_from_the_profile_changes_the_answer():
    profile = copy.deepcopy(S.PROFILE)
    profile["config_refusals"][0]["inputs"].remove("rswa")
    p = EngineProfile(selector._ENGINE, profile)
    assert p.flash_attn_version(BLACKWELL, head_size=256, kv_cache_block_size=128, config_inputs=("rswa",)) == 4
    assert S.get_flash_attn_version(**HD256, rswa_window=512) == 2


def test_an_input_name_outside_the_profile_is_refused():
    p = EngineProfile(selector._ENGINE, S.PROFILE)
    with pytest.raises(ValueError, match="config_inputs: typo"):
        p.flash_attn_version(BLACKWELL, head_size=256, config_inputs=("typo",))


def test_profile_errors_name_the_file_record_and_field(tmp_path):
    doc = json.loads(M.profile_file(M.DATA_DIR).read_text())
    bad = tmp_path / "profile.json"
    del doc["kernel_pages"][0]["page_size"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(M.ProfileError, match=r"profile.json: kernel_pages\[0\]: missing page_size"):
        M.load_profile(bad)
    doc["kernel_pages"] = []
    doc["config_refusals"][0]["sources"] = []
    bad.write_text(json.dumps(doc))
    with pytest.raises(M.ProfileError, match=r"config_refusals\[0\] \(vllm-fa4-hd256-config\): sources: empty"):
        M.load_profile(bad)


def test_vendored_as_plain_modules(tmp_path):
    import importlib

    from attnmatrix.generator.render import SELECTOR_MODULES

    for mod in (S, *(importlib.import_module(f"attnmatrix.{name}") for name in SELECTOR_MODULES)):
        shutil.copyfile(mod.__file__, tmp_path / Path(mod.__file__).name)
    code = textwrap.dedent("""
        import sys
        sys.modules.pop("attnmatrix", None)
        sys.meta_path.insert(0, type("NoPackage", (), {"find_spec": staticmethod(
            lambda name, *a: (_ for _ in ()).throw(ImportError(name)) if name.startswith("attnmatrix") else None)}))
        import selection
        print(selection.get_flash_attn_version(head_size=256, kv_cache_block_size=128, supports_fa4_hd256=True,
                                               capability=(10, 0)))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"


def test_generated_module_lines_are_within_the_line_length():
    """The module is excluded from ruff (its PROFILE is data), so its prose is held to 120 characters here."""
    long = [f"{i}: {len(line)}" for i, line in enumerate(Path(S.__file__).read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > 120]
    assert long == []
