"""Model presets (matrix/data/models.json, matrix/models.py): every preset loads and agrees with the config it
cites; a value that disagrees with its citation, a bad field or a tensor-parallel split that does not divide is
refused with the file, model and field named; a layer type's query is the vocabulary's."""

from __future__ import annotations

import copy
import json

import pytest
from attnmatrix.matrix.models import MODELS_FILE, ModelError, get_model, load_models, parse_models

from attnmatrix.vocabulary import features_of

DOC = json.loads(MODELS_FILE.read_text(encoding="utf-8"))
REQUIRED_FAMILIES = ("Llama 3", "Qwen 2.5", "Qwen 3", "Mistral", "Mixtral", "Gemma 2", "Gemma 3", "gpt-oss", "Phi-3",
                     "DeepSeek V3", "Kimi K2", "GLM")


def test_presets_load_and_cover_the_families():
    models = load_models()
    families = {m.family for m in models.values()}
    for fam in REQUIRED_FAMILIES:
        assert any(f.startswith(fam) for f in families), fam
    for m in models.values():
        assert m.source == f"https://huggingface.co/{m.repo}/blob/main/{m.file}"
        assert sum(ly.count for ly in m.layers) == (m.config.get("num_hidden_layers"))


def test_layer_types_say_what_the_models_run():
    g2 = get_model("gemma-2-9b")
    assert [(ly.type, ly.count, ly.sliding_window, ly.softcap) for ly in g2.layers] == [
        ("local", 21, 4096, 50.0), ("global", 21, None, 50.0)]
    g3 = get_model("gemma-3-27b")
    assert [(ly.type, ly.count, ly.softcap) for ly in g3.layers] == [("local", 52, None), ("global", 10, None)]
    oss = get_model("gpt-oss-120b")
    assert all(ly.sinks and ly.head_dim == 64 for ly in oss.layers)
    assert {ly.type: ly.sliding_window for ly in oss.layers} == {"sliding": 128, "full": None}
    ds = get_model("deepseek-v3").layers[0]
    assert (ds.head_dim, ds.head_dim_v, ds.qk_rope_head_dim, ds.ops()) == (192, 128, 64, ("mla_prefill",))
    glm = get_model("glm-4.7-flash").layers[0]
    assert (glm.qk_nope_head_dim, glm.qk_rope_head_dim, glm.head_dim_v) == (192, 64, 256)


def test_queries_are_the_vocabularys():
    local, glob = get_model("gemma-2-9b").layers
    assert features_of(**local.query_params("prefill")) == ("causal", "gqa", "sliding_window", "softcap")
    assert features_of(**glob.query_params("decode")) == ("causal", "gqa", "softcap")
    ds = get_model("deepseek-v3").layers[0]
    assert features_of(**ds.query_params("mla_prefill", tp=8)) == ("causal", "qk_rope:64")
    with pytest.raises(ModelError, match="runs mla_prefill, not decode"):
        ds.query_params("decode")
    # one KV head per GPU for every query head group: MHA at tp=8 has no GQA left; Qwen3-235B's 4 KV heads replicate
    phi = get_model("phi-3-mini-4k").layers[0]
    assert "gqa" not in phi.query_params("prefill")
    assert get_model("qwen3-235b-a22b").layers[0].per_rank(8) == (8, 1)


def test_tp_that_does_not_split_is_refused():
    m = get_model("gemma-2-9b")
    assert m.check_tp(2) == 2
    with pytest.raises(ModelError, match="16 query / 8 KV heads, which do not split over tp=3"):
        m.check_tp(3)
    with pytest.raises(ModelError, match="tp 0"):
        m.check_tp(0)


def _edited(edit) -> dict:
    doc = copy.deepcopy(DOC)
    edit(doc["models"])
    return doc


@pytest.mark.parametrize("edit, match", [
    (lambda ms: ms["gemma-2-9b"]["layers"][0].update(num_heads=32),
     r"models.gemma-2-9b: layer type 'local' num_heads 32 disagrees with google/gemma-2-9b-it config.json "
     r"num_attention_heads = 16"),
    (lambda ms: ms["gemma-2-9b"]["layers"][0].update(sliding_window=2048), "sliding_window 2048 disagrees"),
    (lambda ms: ms["gemma-2-9b"]["layers"][1].pop("softcap"), "softcap None disagrees"),
    (lambda ms: ms["gemma-3-27b"]["layers"][0].update(count=50), "layer counts add up to 60"),
    (lambda ms: ms["gpt-oss-20b"]["layers"][0].pop("sliding_window"), "0 windowed layers"),
    (lambda ms: ms["deepseek-v3"]["layers"][0].update(qk_rope_head_dim=32, head_dim=160),
     "qk_rope_head_dim 32 disagrees"),
    (lambda ms: ms["deepseek-v3"]["layers"][0].update(head_dim=200), "200 is not qk_nope_head_dim"),
    (lambda ms: ms["llama-3.1-8b"]["layers"][0].update(head_dim=64), "hidden_size / heads"),
    (lambda ms: ms["llama-3.1-8b"].update(tp=3), "do not split over tp=3"),
    (lambda ms: ms["llama-3.1-8b"].update(source="https://example.com/config.json"), "llama-3.1-8b.source"),
    (lambda ms: ms["llama-3.1-8b"]["layers"][0].update(window=4), r"layers\[0\]: unknown field\(s\) window"),
    (lambda ms: ms["llama-3.1-8b"]["layers"][0].update(num_kv_heads=0), r"layers\[0\].num_kv_heads: expected a pos"),
    (lambda ms: ms["qwen2.5-7b"]["layers"][0].update(sliding_window=131072), "use_sliding_window = false"),
    (lambda ms: ms["llama-3.1-8b"]["config"].pop("num_attention_heads"), "no 'num_attention_heads'"),
])
def test_a_preset_that_disagrees_with_its_citation_is_refused(edit, match):
    with pytest.raises(ModelError, match=match):
        parse_models(_edited(edit), "models.json")


def test_unreadable_and_unknown(tmp_path):
    p = tmp_path / "models.json"
    p.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match="models.json: unreadable models file"):
        load_models(p)
    with pytest.raises(ModelError, match=r"model 'gemma-9': no such preset \(known: deepseek-v3, "):
        get_model("gemma-9")


# --- `attnmatrix explain --model`: per layer type, through the one query engine ---------------------------------

def _explain(*args: str):
    from click.testing import CliRunner

    from attnmatrix.cli import main

    return CliRunner().invoke(main, ["explain", *args])


@pytest.mark.slow
def test_explain_model_answers_each_layer_type_through_the_engine():
    from attnmatrix.generator import tables as T
    from attnmatrix.matrix.evidence import load_evidence
    from attnmatrix.matrix.policy import resolve

    r = _explain("--arch", "sm_90", "--model", "gemma-2-9b", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert (j["model"], j["tp"], j["config"]) == ("gemma-2-9b", 1, "google/gemma-2-9b-it config.json")
    assert [ly["type"] for ly in j["layers"]] == ["local", "global"]
    m = resolve(load_evidence())
    for ly, preset in zip(j["layers"], get_model("gemma-2-9b").layers, strict=True):
        assert [q["op"] for q in ly["queries"]] == ["prefill", "decode"]
        for q in ly["queries"]:
            assert ("sliding_window" in q["features"]) == (ly["type"] == "local")
            assert "softcap" in q["features"] and "gqa" in q["features"]
            expect = T.make_query("sm_90", 256, 256, op=q["op"], **preset.query_params(q["op"]))
            assert q["order"] == [a.backend for a in T.query(m, expect)[0]]  # the engine's answer, not a copy
            refused = [b for b, a in q["backends"].items() if a["status"] != "supported"]
            assert refused and all(q["backends"][b]["reasons"] for b in refused)
    text = _explain("--arch", "sm_90", "--model", "deepseek-v3", "--tp", "8")
    assert text.exit_code == 0, text.output
    assert "16 query / 16 KV heads per GPU at tp=8" in text.stdout
    assert "mla_prefill bfloat16 head 192x128 features causal+qk_rope:64" in text.stdout


def test_explain_model_usage_errors():
    assert "no preset 'gemma-9'" in _explain("--arch", "sm_90", "--model", "gemma-9").output
    r = _explain("--arch", "sm_90", "--model", "gemma-2-9b", "--tp", "3")
    assert r.exit_code == 2 and "do not split over tp=3" in r.output
    r = _explain("--arch", "sm_90", "--model", "gemma-2-9b", "--head-size", "128", "--softcap")
    assert r.exit_code == 2 and "leave out --head-size, --softcap" in r.output
    assert _explain("--arch", "sm_90", "--tp", "2", "--head-size", "128").exit_code == 2
    assert _explain("--arch", "sm_90").exit_code == 2  # neither --head-size nor --model
