"""Shipped-binary evidence from flashinfer-cubin's kernel table, on a committed sample of the real header
(tests/data/flashInferMetaInfo-sample.h: its struct definition and 13 of its 13,452 entries)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from attnmatrix.kernels import trtllm_cubins as tc
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.policy import SUPPORTED, UNSUPPORTED, rank, resolve_cell
from attnmatrix.matrix.records import TIER_ORDER, TIERS, Record, parse_record
from attnmatrix.matrix.storage import dump_record, read_records
from click.testing import CliRunner

from attnmatrix.cli import main

SAMPLE = Path(__file__).parent / "data" / "flashInferMetaInfo-sample.h"
ARTIFACT = "158f6fa11ef139a098cfddcdddce73ca99d164ad"
HEADER = f"flashinfer_cubin/cubins/{ARTIFACT}/fmha/trtllm-gen/include/flashInferMetaInfo.h"


def make_wheel(path: Path, header: str | None = None, version: str = "0.6.13") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo(HEADER, (2026, 6, 24, 21, 24, 0)), header or SAMPLE.read_text())
        zf.writestr("flashinfer_cubin/_build_meta.py",
                    f'__version__ = "{version}"\n__git_version__ = "57ba7eeb7ea3003a2d6ad5d9a057c4f952709bac"\n')
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tc.KernelTable:
    return tc.read_wheel(make_wheel(tmp_path_factory.mktemp("w") / "fc.whl"))


def rec(table, arch, backend, op, dtype, hd, hdv, *feats) -> Record | None:
    return tc.shipped_record(Case(arch, backend, op, dtype, hd, hdv, feats), table)


def test_the_header_is_read_by_its_own_struct(table):
    assert len(table.kernels) == 13 and table.version == "0.6.13" and table.artifact == ARTIFACT
    assert table.date == "2026-06-24"
    k = next(k for k in table.kernels if "HQk192HV128SeparateQkvCausal" in k.name and k.dtype_q.endswith("BF16"))
    assert (k.head_dim_qk, k.head_dim_v, k.qkv_layout, k.mask_type, k.kernel_type, k.sm) == (192, 128, 0, 1, 0,
                                                                                            "kSM_100f")
    assert SAMPLE.read_text().splitlines()[k.line - 1].startswith("{ DATA_TYPE_BF16")


def test_reordered_struct_fields_are_followed():
    text = SAMPLE.read_text()
    # Swap two declarations and the two values of every entry: the parse must not change.
    text2 = text.replace("    int mHeadDimQk;\n    int mHeadDimV;", "    int mHeadDimV;\n    int mHeadDimQk;")
    rows = []
    for line in text2.splitlines():
        if line.startswith("{ DATA_TYPE"):
            v = line.strip().rstrip(",").strip("{} ").split(", ")
            v[10], v[11] = v[11], v[10]
            line = "{ " + ", ".join(v) + "},"
        rows.append(line)
    a = tc.parse_header(text)
    b = tc.parse_header("\n".join(rows))
    assert [(k.name, k.head_dim_qk, k.head_dim_v) for k in a] == [(k.name, k.head_dim_qk, k.head_dim_v) for k in b]


def test_malformed_headers_name_the_line():
    text = SAMPLE.read_text()
    bad = text.replace(", kSM_100f, nullptr,", ", kSM_100f, nullptr, 7,", 1)
    line = next(i for i, ln in enumerate(bad.splitlines(), 1) if ", nullptr, 7," in ln)
    with pytest.raises(tc.CubinError, match=rf"flashInferMetaInfo.h:{line}: 38 values for 37 fields"):
        tc.parse_header(bad)
    with pytest.raises(tc.CubinError, match="no 'struct TllmGenFmhaKernelMetaInfo"):
        tc.parse_header("static int x;")
    with pytest.raises(tc.CubinError, match="mFuncName"):
        tc.parse_header(text.replace("mFuncName", "mName"))


def test_ragged_mla_dims_ship_with_the_kernel_name_and_line(table):
    r = rec(table, "sm_100", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128, "causal")
    assert r.outcome == "shipped" and r.tier == "shipped"
    assert r.reason.startswith("kernel fmhaSm100fKernel_QkvBfloat16OBfloat16HQk192HV128SeparateQkvCausal")
    assert "(+1 more variant)" in r.reason and r.extra["kernel_count"] == 2
    assert r.sources[0].startswith(f"pypi:flashinfer-cubin==0.6.13:{HEADER}#L")
    assert r.provenance["target"] == "sm_100a" and r.provenance["library"] == "flashinfer-cubin"
    # fp8 q/k/v with bf16 output is its own kernel; sinks and ragged lengths do not change the lookup
    for extra in ("fp8", "sinks"):
        assert rec(table, "sm_100", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128, "causal", extra).outcome \
            == "shipped"


def test_a_missing_kernel_is_refused_in_the_loaders_terms(table):
    r = rec(table, "sm_100", "trtllm_ragged", "prefill", "float16", 192, 128, "causal")
    assert r.outcome == "rejected"
    assert r.reason.startswith("Trtllm-gen kernels not found: SM=kSM_100/kSM_100f, dtypeQ=FP16, dtypeKv=FP16, "
                               "dtypeO=FP16, qkvLayout=SeparateQkv, kernelType=Context, maskType=Causal, "
                               "headDimQk=192, headDimV=128")
    assert "dtypes Q/Kv/O BF16/BF16/BF16, E4M3/E4M3/BF16" in r.reason
    # a window longer than nothing: the ragged kernels have no sliding-window mask
    w = rec(table, "sm_100", "trtllm_ragged", "prefill", "bfloat16", 192, 128, "sliding_window")
    assert w.outcome == "rejected" and "maskType=SlidingOrChunkedCausal" in w.reason
    assert "maskType Dense, Causal" in w.reason


def test_sm_family_compatibility(table):
    # an Sm103a kernel serves sm_103 only; Sm100f kernels serve both
    assert rec(table, "sm_103", "trtllm_ragged", "prefill", "bfloat16", 256, 256, "causal").outcome == "shipped"
    r = rec(table, "sm_100", "trtllm_ragged", "prefill", "bfloat16", 256, 256, "causal")
    assert r.outcome == "rejected" and "SM=kSM_100/kSM_100f" in r.reason
    r = rec(table, "sm_103", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128, "causal")
    assert r.outcome == "shipped" and r.provenance["target"] == "sm_103a"


def test_paged_kernels_are_keyed_by_page_size_and_dynamic_pages(table):
    assert rec(table, "sm_100", "trtllm_context", "prefill", "bfloat16", 128, 128, "causal", "paged_kv:16").outcome \
        == "shipped"
    # no paged_kv feature: the adapter's default page of 16 tokens
    assert rec(table, "sm_100", "trtllm_context", "prefill", "bfloat16", 128, 128, "causal").outcome == "shipped"
    # a 128-token page without grouped heads asks for a non-dynamic 128-token kernel: none is shipped
    r = rec(table, "sm_100", "trtllm_context", "prefill", "bfloat16", 128, 128, "causal", "paged_kv:128")
    assert r.outcome == "rejected" and "numTokensPerPage=128;" in r.reason and "128 (dynamic)" in r.reason
    # with GQA a 256-token page uses the dynamic 128-token kernels (fmhaKernels.cuh selectNumTokensPerPage)
    q = tc.query_for(Case("sm_100", "trtllm_decode", "decode", "bfloat16", 128, 128, ("causal", "gqa", "paged_kv:256")))
    assert (q.tokens_per_page, q.dynamic_pages) == (128, True)
    r = rec(table, "sm_100", "trtllm_decode", "decode", "bfloat16", 128, 128, "causal", "gqa", "paged_kv:256")
    assert r.outcome == "shipped" and "CausalPagedVarSeq" in r.reason
    window = rec(table, "sm_100", "trtllm_context", "prefill", "bfloat16", 128, 128, "sliding_window")
    assert window.outcome == "shipped" and "SlidingOrChunkedCausal" in window.reason


def test_decode_uses_generation_kernels(table):
    r = rec(table, "sm_100", "trtllm_decode", "decode", "bfloat16", 128, 128, "causal", "paged_kv:16")
    assert r.outcome == "shipped" and "KeepsAbForGen" in r.reason
    r = rec(table, "sm_100", "trtllm_decode", "decode", "float16", 128, 128, "causal")
    assert r.outcome == "rejected" and "kernelType=Generation/SwapsMmaAbForGeneration" in r.reason


def test_what_the_api_cannot_express_gets_no_record(table):
    assert rec(table, "sm_100", "trtllm_ragged", "prefill", "bfloat16", 192, 128, "causal", "softcap") is None
    assert rec(table, "sm_100", "trtllm_context", "prefill", "bfloat16", 128, 128, "alibi", "causal") is None
    assert rec(table, "sm_100", "trtllm_decode", "prefill", "bfloat16", 128, 128, "causal") is None
    assert rec(table, "sm_100", "trtllm_decode", "decode", "bfloat16", 192, 128, "causal") is None
    assert rec(table, "sm_90", "trtllm_ragged", "prefill", "bfloat16", 192, 128, "causal") is None
    # the ragged entry point takes no block table: a paged lookup is never made, whatever kernels the table has
    for page in (16, 64, 128, 256):
        assert rec(table, "sm_100", "trtllm_ragged", "prefill", "bfloat16", 192, 128, "causal",
                   f"paged_kv:{page}") is None


def test_records_are_valid_and_round_trip(table):
    recs = list(tc.shipped_records(table, archs=["sm_100"], backends=["trtllm_ragged"]))
    assert recs and {r.outcome for r in recs} == {"shipped", "rejected"}
    for r in recs:
        assert parse_record(json.loads(dump_record(r))) == r


def test_tier_table_and_resolution_rank():
    assert tuple(TIERS) == ("validated", "compiled", "shipped", "declared") and TIER_ORDER["shipped"] == 2
    case = Case("sm_100", "trtllm_ragged", "prefill", "bfloat16", 128, 128, ("causal",))
    shipped = Record(case, "shipped", "shipped", {"library": "flashinfer-cubin", "kernel_version": "0.6.13",
                                                 "date": "2026-06-24"}, reason="kernel k", sources=("h#L1",))
    compiled = Record(case, "compiled", "compiled", {"kernel_version": "0.6.13", "date": "2026-06-24"})
    declared_no = Record(case, "rejected", "declared", {"date": "2026-11-30", "kernel_version": "0.6.13"},
                         reason="refused", sources=("src",))
    declared_yes = Record(case, "pass", "declared", {"date": "2026-11-30", "kernel_version": "0.6.13"},
                          sources=("src",))
    assert rank(shipped) == rank(compiled) < rank(declared_yes)
    assert rank(declared_no) < rank(shipped)
    cell = resolve_cell([shipped, declared_yes])
    assert cell.status == SUPPORTED and cell.tier == "shipped"
    cell = resolve_cell([shipped, declared_no])
    assert cell.status == UNSUPPORTED and any("shipped shipped" in c for c in cell.conflicts)


def test_a_newer_declared_fact_keeps_an_older_shipped_binary_as_corroboration():
    case = Case("sm_100", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128, ("causal",))
    shipped = Record(case, "shipped", "shipped", {"library": "flashinfer-cubin", "kernel_version": "0.6.13",
                                                 "date": "2026-06-24", "target": "sm_100a"},
                     reason="kernel fmhaX", sources=("h#L9",))
    newer = Record(case, "pass", "declared", {"date": "2026-11-30", "kernel_version": "0.7.4"}, sources=("src",))
    cell = resolve_cell([shipped, newer])
    assert cell.tier == "declared" and cell.corroborated_by == [shipped]
    assert any("kernel fmhaX" in s and "h#L9" in s for s in cell.sources)
    refused = Record(case, "rejected", "declared", {"date": "2026-11-30", "kernel_version": "0.7.4"},
                     reason="no", sources=("src",))
    cell = resolve_cell([shipped, refused])
    assert cell.status == UNSUPPORTED and not cell.corroborated_by
    assert any(c.startswith("superseded by version 0.7.4: shipped shipped") for c in cell.conflicts)


def test_ingest_cubins_cli_is_deterministic_and_keeps_foreign_files(tmp_path):
    wheel = make_wheel(tmp_path / "flashinfer_cubin-0.6.13-py3-none-any.whl")
    out = tmp_path / "shipped.jsonl"
    runner = CliRunner()
    r1 = runner.invoke(main, ["ingest-cubins", str(wheel), "-o", str(out)])
    assert r1.exit_code == 0, r1.output
    assert "flashinfer-cubin 0.6.13 (13 kernels" in r1.output and "wrote" in r1.output
    first = out.read_bytes()
    r2 = runner.invoke(main, ["ingest-cubins", str(wheel), "-o", str(out)])
    assert r2.exit_code == 0 and "unchanged" in r2.output and out.read_bytes() == first
    recs = [r for _, r in read_records(out)]
    assert {r.case.arch for r in recs} == {"sm_100", "sm_103"} and all(r.tier == "shipped" for r in recs)
    js = runner.invoke(main, ["ingest-cubins", str(wheel), "-o", str(out), "--json"])
    summary = json.loads(js.output)
    assert summary["kernels"] == 13 and "sm_100" in summary["by_arch"]
    foreign = tmp_path / "other.jsonl"
    foreign.write_text(dump_record(Record(Case("sm_90", "fa2", "prefill", "bfloat16", 64, 64), "compiled", "compiled",
                                          {"kernel_version": "1", "date": "2026-01-01"})) + "\n")
    before = foreign.read_bytes()
    r3 = runner.invoke(main, ["ingest-cubins", str(wheel), "-o", str(foreign)])
    assert r3.exit_code == 2 and "not overwriting" in r3.output and foreign.read_bytes() == before


def test_ingest_cubins_refuses_what_is_not_a_cubin_wheel(tmp_path):
    bad = tmp_path / "x.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("flashinfer_cubin/_build_meta.py", '__version__ = "1"\n')
    r = CliRunner().invoke(main, ["ingest-cubins", str(bad), "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "found 0" in r.output and not (tmp_path / "o.jsonl").exists()
    notzip = tmp_path / "y.whl"
    notzip.write_text("hello")
    r = CliRunner().invoke(main, ["ingest-cubins", str(notzip), "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "cannot open as a wheel" in r.output


def test_mla_prefill_lookup_uses_the_case_mask():
    base = ("sm_100", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128)
    assert tc.query_for(Case(*base, ("qk_rope:64",))).mask_type == tc.MASK_TYPES.index("Dense")
    assert tc.query_for(Case(*base, ("causal", "qk_rope:64"))).mask_type == tc.MASK_TYPES.index("Causal")
