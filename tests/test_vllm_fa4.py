"""vLLM's FA4 copy (backend vllm_fa4): extraction from the wheel, the call vLLM makes, and (slow, where the
copy and the CuTe DSL are present) a small cross-compile subset for sm_100a with the kernel's own refusals."""

from __future__ import annotations

import importlib.util
import zipfile

import pytest
import torch
from attnmatrix.kernels import vllm_fa4, xcompile
from attnmatrix.kernels.problem import VALIDATION_SHAPES, Unsupported, make_problem
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.storage import read_records

METADATA = """Metadata-Version: 2.1
Name: vllm
Version: 0.33.0
Requires-Dist: torch==2.14.0
Requires-Dist: nvidia-cutlass-dsl[cu13]==4.8.0
Requires-Dist: apache-tvm-ffi==0.1.11
"""


def test_extract_takes_only_the_cute_sources_and_metadata(tmp_path):
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "raise SystemExit('must not be extracted')")
        zf.writestr("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", b"\x7fELF")
        zf.writestr("vllm/vllm_flash_attn/cute/interface.py", "X = 1\n")
        zf.writestr("vllm/vllm_flash_attn/cute/utils.py", "Y = 2\n")
        zf.writestr("vllm-0.33.0.dist-info/METADATA", METADATA)
    got = vllm_fa4.extract_wheel(wheel, tmp_path / "out")
    assert got == {"version": "0.33.0", "cutlass_dsl": "4.8.0", "tvm_ffi": "0.1.11", "files": 2}
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == ["vllm-0.33.0.dist-info/METADATA", "vllm/vllm_flash_attn/cute/interface.py",
                     "vllm/vllm_flash_attn/cute/utils.py"]
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as zf:
        zf.writestr("vllm/__init__.py", "")
    with pytest.raises(ValueError, match="no vllm/vllm_flash_attn/cute/"):
        vllm_fa4.extract_wheel(tmp_path / "empty.whl", tmp_path / "o2")


def _call(monkeypatch, arch: str, *feats: str, hd: int = 128, hdv: int | None = None, op: str = "prefill"):
    monkeypatch.setenv("FLASH_ATTENTION_ARCH", arch)
    case = Case(arch, "vllm_fa4", op, "bfloat16", hd, hdv or hd, feats)
    return vllm_fa4.build_vllm_call(make_problem(case, VALIDATION_SHAPES[op]))


def test_paged_kv_is_called_as_vllms_kv_cache(monkeypatch):
    call = _call(monkeypatch, "sm_100a", "causal", "paged_kv:64")
    kw = call.kwargs
    assert call.func == "_flash_attn_fwd" and kw["num_splits"] == 0
    assert kw["cu_seqlens_q"].dtype == torch.int32 and kw["page_table"].shape[1] == -(-300 // 64)
    assert kw["max_seqlen_k"] == 300 and kw["seqused_k"].tolist() == [300, 300]
    assert call.args[0].dim() == 3  # packed queries, as vLLM passes them
    assert kw["softcap"] is None and kw["learnable_sink"] is None
    assert kw["window_size_left"] is None and kw["window_size_right"] is None


def test_hd256_gets_vllms_page_aligned_length_and_no_splitkv(monkeypatch):
    kw = _call(monkeypatch, "sm_100a", "causal", "paged_kv:128", hd=256).kwargs
    assert kw["max_seqlen_k"] == kw["page_table"].shape[1] * 128 == 384 and kw["num_splits"] == 1
    assert _call(monkeypatch, "sm_100a", "causal", hd=256).kwargs["num_splits"] == 1
    # only on the archs where FA4 routes (256, 256) to the dedicated kernel
    assert _call(monkeypatch, "sm_90a", "causal", "paged_kv:128", hd=256).kwargs["max_seqlen_k"] == 300
    assert _call(monkeypatch, "sm_100a", "causal", "paged_kv:128", hd=128).kwargs["num_splits"] == 0


def test_hd256_in_vllms_profile_is_always_paged_in_128_token_kernel_pages(monkeypatch):
    # vLLM's decoder always passes block_table + seqused_k (flash_attn.py), so a window reaches the kernel with
    # seqused_k; a 256-token cache block is two 128-token kernel pages (fa_utils.py), in order.
    call = _call(monkeypatch, "sm_100a", "sliding_window", hd=256)
    kw = call.kwargs
    assert kw["seqused_k"].tolist() == [300, 300] and call.args[1].shape[1] == 128 and kw["num_splits"] == 1
    case = Case("sm_100a", "vllm_fa4", "prefill", "bfloat16", 256, 256, ("causal", "paged_kv:256"))
    p = make_problem(case, VALIDATION_SHAPES["prefill"])
    call = vllm_fa4.build_vllm_call(p)
    k, table = call.args[1], call.kwargs["page_table"]
    assert k.shape[1] == 128 and table.shape[1] == 3 and call.kwargs["max_seqlen_k"] == 384
    gathered = k[table[1].long()].reshape(-1, *k.shape[2:])[:300]
    assert torch.equal(gathered, p.k[1])  # the kernel pages hold sequence 1's keys in order
    # a block size vLLM never gives this kernel (it falls back to FA2) goes in as it is: the kernel answers
    assert _call(monkeypatch, "sm_100a", "causal", "paged_kv:16", hd=256).args[1].shape[1] == 16
    # MLA prefill keeps vLLM's gathered K/V (no block table)
    assert "page_table" not in _call(monkeypatch, "sm_100a", "causal", "qk_rope:0", hd=256, op="mla_prefill").kwargs


def test_sm90_fp8_is_vllms_fp8_kv_cache_bf16_query_and_in_kernel_dequant(monkeypatch):
    call = _call(monkeypatch, "sm_90a", "causal", "fp8", hd=512)
    kw = call.kwargs
    q, k, v = call.args
    assert q.dtype == torch.bfloat16 and k.dtype == v.dtype == torch.float8_e4m3fn
    assert kw["fp8_kv_dequant"] is True and "q_descale" not in kw and kw["k_descale"].shape == (2, 8)
    assert k.shape[1] == vllm_fa4.SM90_FP8_KV_PAGE_SIZE and kw["seqused_k"].tolist() == [300, 300]
    # on SM100 vLLM quantizes the query too: fp8 Q/K/V with three descales, no dequant flag
    kw100 = _call(monkeypatch, "sm_100a", "causal", "fp8").kwargs
    assert "fp8_kv_dequant" not in kw100 and "q_descale" in kw100


def test_features_map_to_vllms_arguments(monkeypatch):
    kw = _call(monkeypatch, "sm_100a", "sliding_window").kwargs
    assert kw["window_size_left"] > 0 and kw["window_size_right"] == 0
    assert _call(monkeypatch, "sm_100a", "causal", "softcap").kwargs["softcap"] > 0
    assert _call(monkeypatch, "sm_100a", "causal", "sinks").kwargs["learnable_sink"].shape == (8,)
    fp8 = _call(monkeypatch, "sm_100a", "causal", "fp8").kwargs
    assert fp8["q_descale"].shape == (2, 8) and fp8["k_descale"].dtype == torch.float32
    varlen = _call(monkeypatch, "sm_100a", "causal", "varlen").kwargs
    assert "cu_seqlens_k" in varlen and "page_table" not in varlen
    with pytest.raises(Unsupported, match="Alibi is not supported in FA4"):
        _call(monkeypatch, "sm_100a", "causal", "alibi")


def test_missing_copy_is_unavailable_and_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_fa4.DIR_ENV, str(tmp_path / "nothing"))
    for name in [m for m in list(__import__("sys").modules) if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("an installed vLLM answers instead of the extracted copy")
    why = vllm_fa4.VLLM_FA4.availability()
    assert why and "fetch-vllm-fa4.sh" in why and vllm_fa4.DIR_ENV in why


HAVE_COPY = (vllm_fa4.source_dir() / vllm_fa4.CUTE_SUBDIR / "interface.py").is_file()
HAVE_DSL = importlib.util.find_spec("cutlass") is not None


@pytest.mark.slow
@pytest.mark.skipif(not (HAVE_COPY and HAVE_DSL), reason="needs vLLM's FA4 copy (scripts/fetch-vllm-fa4.sh) and "
                    "nvidia-cutlass-dsl")
def test_cross_compile_subset_sm100a(tmp_path):
    """Two cases for sm_100a: a head-dim-128 causal kernel compiles; the dedicated head-dim-256 kernel is
    given a 64-token page, which vLLM never passes, and refuses it in its own words."""
    cases = [Case("sm_100", "vllm_fa4", "prefill", "bfloat16", 128, 128, ("causal",)),
             Case("sm_100", "vllm_fa4", "prefill", "bfloat16", 256, 256, ("causal", "paged_kv:64"))]
    out = tmp_path / "x.jsonl"
    xcompile.xcompile_cases(cases, out, ["sm_100a"], workers=1, timeout_s=600)
    got = {r.case.head_dim: r for _, r in read_records(out)}
    ok, hd256 = got[128], got[256]
    assert ok.outcome == "compiled" and ok.tier == "compiled", ok.reason
    assert ok.provenance["library"] == "vllm" and ok.provenance["kernel_version"] == vllm_fa4.kernel_version()
    assert ok.provenance["target"] == "sm_100a" and ok.extra.get("kernels", 0) >= 1
    assert hd256.outcome == "rejected" and not hd256.reason.startswith("attnmatrix"), hd256.reason


def test_xcompile_takes_only_backends_that_compile_without_a_gpu(tmp_path):
    from click.testing import CliRunner

    from attnmatrix.cli import main

    out = str(tmp_path / "x.jsonl")
    r = CliRunner().invoke(main, ["xcompile", "--backends", "fa2", "--arch", "sm_100a", "-o", out])
    assert r.exit_code == 2 and "fa2 cannot be cross-compiled" in r.output and "vllm_fa4" in r.output
    assert not (tmp_path / "x.jsonl").exists()


def test_the_extracted_copy_is_found_after_vllms_fa3_build_was_imported_from_another_folder(tmp_path):
    """A sweep imports vLLM's FA2/FA3 builds (their own `vllm` package, scripts/vllm-fa-site.py) before vllm_fa4:
    the extracted FA4 copy must still be what `vllm.vllm_flash_attn.cute` resolves to."""
    import subprocess
    import sys

    site, extracted = tmp_path / "vllm-fa", tmp_path / "vllm-fa4"
    (site / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "vllm_flash_attn" / "__init__.py").write_text("FA3 = True\n")
    cute = extracted / "vllm" / "vllm_flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text("")
    (cute / "interface.py").write_text("_flash_attn_fwd = 'the extracted copy'\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm.vllm_flash_attn as fa; assert fa.FA3\n"
            "from attnmatrix.kernels import vllm_fa4\n"
            "print(vllm_fa4.import_cute()._flash_attn_fwd, vllm_fa4.import_cute()._flash_attn_fwd)")
    r = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "ATTNMATRIX_VLLM_FA4_DIR": str(extracted)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "the extracted copy the extracted copy"


@pytest.mark.parametrize("arch,feats,hd", [("sm_90a", ("paged_kv:16",), 128), ("sm_100a", ("paged_kv:128",), 256),
                                           ("sm_90a", ("fp8",), 128)])
def test_a_decode_step_is_padded_to_vllms_captured_batch_with_empty_sequences(monkeypatch, arch, feats, hd):
    from attnmatrix.kernels.problem import Shape

    monkeypatch.setenv("FLASH_ATTENTION_ARCH", arch)
    p = make_problem(Case(arch, "vllm_fa4", "decode", "bfloat16", hd, hd, feats), Shape("t", 3, 1, 300, 4, 2))
    call = vllm_fa4.build_vllm_call(p)
    kw = call.kwargs
    assert kw["cu_seqlens_q"].tolist() == [0, 1, 2, 3, 3] and kw["seqused_k"].tolist() == [300, 300, 300, 0]
    assert kw["page_table"].shape[0] == 4 and not kw["page_table"][3].any() and call.args[0].shape[0] == 4
    if "k_descale" in kw:
        assert kw["k_descale"].shape == (4, 2)
    # the output handed back is the step's own three sequences
    out = torch.arange(4.0).view(4, 1, 1).expand(4, 4, hd)
    assert call.post(out).shape == (3, 1, 4, hd) and call.post(out)[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]
