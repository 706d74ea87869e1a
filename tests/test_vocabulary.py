"""The vocabulary (attnmatrix/vocabulary.py): one definition of features, ops, dtypes, tiers and archs, which
the case space, the query engine, the selector, the pages and the CLI derive from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from attnmatrix.matrix.cases import Case, CaseError
from click.testing import CliRunner

from attnmatrix import vocabulary as V
from attnmatrix.cli import main
from attnmatrix.selector_engine import features_of

ROOT = Path(__file__).resolve().parent.parent


def test_the_vocabulary_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "attnmatrix" / "vocabulary.py").read_text(encoding="utf-8"))
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"__future__", "re", "dataclasses"}, mods


@pytest.mark.parametrize("spelling,arch", [("sm_90a", "sm_90"), ("sm90", "sm_90"), ("9.0", "sm_90"),
                                           ("compute_100f", "sm_100"), ("SM_120", "sm_120"), ("cpu", "cpu")])
def test_arch_spellings(spelling: str, arch: str) -> None:
    assert V.normalize_arch(spelling) == arch


def test_arch_capability_family_and_products_round_trip() -> None:
    for a in V.ARCH_INFO:
        assert V.arch_of(a.capability) == a.name
        assert V.capability_of(a.name) == a.capability
        assert V.arch_family(a.name) == a.family
        assert V.capability_label(a.name) == f"{a.capability[0]}.{a.capability[1]}"
    assert V.products("sm_100") == ("B200", "GB200") and "H200" in V.products("sm_90")
    assert V.arch_family("cpu") is None and V.capability_label("cpu") == "cpu"
    assert sorted(["cpu", "sm_120", "sm_90", "sm_100", "sm_80"], key=V.arch_sort_key) == [
        "sm_80", "sm_90", "sm_100", "sm_120", "cpu"]
    for bad in ("gfx942", "sm_9", ""):
        with pytest.raises(ValueError):
            V.normalize_arch(bad)
    for bad in ((9,), "9.0", (9.5, 0), (True, 0)):
        with pytest.raises(ValueError):
            V.arch_of(bad)


def test_feature_tokens_by_kind() -> None:
    assert V.check_feature_token("paged_kv:16") == "paged_kv:16"
    assert V.check_feature_token("qk_rope:0") == "qk_rope:0"
    for bad, why in (("paged_kv", "block size"), ("paged_kv:0", "block size"), ("paged_kv:016", "block size"),
                     ("qk_rope:-1", "rope head dim"), ("causal:1", "no argument"), ("bogus", "unknown feature")):
        with pytest.raises(V.VocabularyError, match=why):
            V.check_feature_token(bad)


def test_query_parameters_come_from_the_features() -> None:
    assert list(V.QUERY_PARAMS) == [f.param for f in V.FEATURE_INFO if f.param]
    assert V.QUERY_PARAMS["causal"] is True and V.QUERY_PARAMS["page_size"] is None
    assert features_of() == ("causal",)
    assert features_of(causal=False, softcap=True, page_size=32) == ("paged_kv:32", "softcap")
    with pytest.raises(TypeError, match="unknown query parameter"):
        features_of(sofcap=True)


def test_query_params_of_is_the_inverse_of_features_of() -> None:
    from attnmatrix import selector

    sets = {f for per_arch in selector.DATA["measured"].values() for (*_, f) in per_arch}
    sets |= {("causal", "qk_rope:64"), ("fp8_kv", "gqa", "paged_kv:16"), ()}
    for feats in sets:
        assert V.features_of(**V.query_params_of(feats)) == tuple(sorted(feats)), feats
    assert V.query_params_of(["softcap", "paged_kv:32"]) == {**{p: False for p in V.QUERY_PARAMS if p != "page_size"},
                                                              "softcap": True, "page_size": 32}
    with pytest.raises(V.VocabularyError, match="sofcap"):
        V.query_params_of(["sofcap"])


def test_the_fp8_kv_cache_axis_reaches_every_layer_from_one_definition() -> None:
    """vLLM's kv_cache_dtype="fp8": one Feature entry; the case space, the engine's query parameters, the
    selector and the CLI's explain take it from there."""
    f = V.FEATURE_BY_NAME["fp8_kv"]
    assert (f.kind, f.param, f.vllm) == (V.FLAG, "fp8_kv", "kv_cache_dtype")
    assert Case("sm_90", "vllm_fa3", "decode", "bfloat16", 128, 128, ("causal", "fp8_kv")).features == (
        "causal", "fp8_kv")
    assert features_of(fp8_kv=True) == ("causal", "fp8_kv")
    import attnmatrix.selector as sel

    assert isinstance(sel.select_backends((9, 0), 128, op="decode", fp8_kv=True), list)
    got = CliRunner().invoke(main, ["explain", "--arch", "sm_90", "--head-size", "128", "--fp8-kv", "--json"])
    assert got.exit_code == 0, got.output
    assert '"fp8_kv"' in got.output
    with pytest.raises(CaseError):
        Case("sm_90", "fa3", "decode", "bfloat16", 128, 128, ("fp8_kv:8",))
