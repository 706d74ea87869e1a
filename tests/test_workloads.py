"""Workload buckets (matrix/workloads.py) and benchmarks/regret.py's sweep and report, on the CPU."""

from __future__ import annotations

import json
import math

import pytest
from attnmatrix.matrix import workloads as W
from conftest import load_script


def _regret():
    return load_script("benchmarks/regret.py")


def test_every_point_has_a_bucket_and_held_out_points_are_not_buckets():
    for op, points in W.BUCKETS.items():
        for p in points:
            assert W.bucket_of(op, *p) == p
        for p in W.HELD_OUT[op]:
            assert p not in points
            assert W.bucket_of(op, *p) in points
    assert W.bucket_of("decode", 230, 600) == (224, 512)
    assert W.bucket_of("prefill", 5, 5000) == (6, 4096)
    assert W.bucket_of("prefill", 4, 300) == (4, 296) and W.bucket_of("prefill", 4, 320) == (4, 384)  # its kind
    # every held-out point is within a factor of sqrt(2) (and a little) of its bucket on both axes, and on the grid
    # it was chosen on (a draw's: GRID_OF_DRAW; the fixed shapes: the factor-1.5 axis) strictly between grid values
    # on every axis but the batch of 1 and 2 (the grid's first values), with the four grid points around it, among
    # the lengths of its kind, buckets (its placement interpolates between them)
    drawn_on = {(op, p): W.GRID_OF_DRAW[seed] for seed, draw in W.FRESH_DRAWS.items() for op in draw for p in draw[op]}
    for op, points in W.HELD_OUT.items():
        assert set(W.FRESH[op]) <= set(points)  # every draw of fresh shapes is held out
        for b, n in points:
            bb, bn = W.bucket_of(op, b, n)
            assert max(b / bb, bb / b) <= 1.5 and max(n / bn, bn / n) <= 1.5, (op, b, n)
            grid = drawn_on.get((op, (b, n)), W.GRID_BY_1_5)
            kind = W.series(grid[op], n)
            batches, lengths = sorted({p[0] for p in kind}), sorted({p[1] for p in kind})
            assert n not in lengths and (b not in batches or b <= 2), (op, b, n)
            around = {(x, y) for x in (max(v for v in batches if v <= b), min(v for v in batches if v >= b))
                      for y in (max(v for v in lengths if v <= n), min(v for v in lengths if v >= n))}
            assert around <= set(grid[op]) and set(W.around(op, b, n, grid)) == around, (op, b, n)
    with pytest.raises(ValueError, match="no workload buckets"):
        W.bucket_of("encode", 1, 1)


def test_each_fresh_draw_is_draw_shapes_of_its_seed_given_the_shapes_held_out_before_it(monkeypatch):
    fixed = {"prefill": W.HELD_OUT["prefill"][:8], "decode": W.HELD_OUT["decode"][:8]}
    taken = {op: fixed[op.replace("mla_", "")] for op in W.BUCKETS}
    for seed, shapes in W.FRESH_DRAWS.items():
        counts = {op: len(v) for op, v in shapes.items() if op != "mla_prefill"}
        drawn = W.draw_shapes(int(seed), counts, taken, W.GRID_OF_DRAW[seed])
        assert drawn == {op: shapes[op] for op in counts}, seed
        assert shapes.get("mla_prefill", shapes.get("prefill")) == shapes.get("prefill")
        taken = {op: taken[op] + shapes.get(op, ()) for op in taken}
    assert W.HELD_OUT == taken  # the held-out shapes are the fixed ones and the draws, and nothing else
    # a draw is never on a grid batch or length, at a multiple of 64, over the token cap or already held out
    drawn = W.draw_shapes(7, {"decode": 30})["decode"]
    assert len(set(drawn)) == 30 and not set(drawn) & set(W.HELD_OUT["decode"])
    assert all(b * n <= 2**20 and n % 64 and b not in W.DECODE_BATCHES and n not in W.DECODE_LENGTHS
               for b, n in drawn)
    monkeypatch.setattr(W, "_DRAW_TRIES", 3)  # a count the draws cannot reach fails instead of drawing forever
    with pytest.raises(ValueError, match=r"decode: \d of 4 shapes after 3 draws \(seed 7\)"):
        W.draw_shapes(7, {"decode": 4})


def test_presets_are_the_models_files_layers_per_gpu_and_say_what_is_wrong(tmp_path):
    layers = {ly.name: ly for ly in W.load_presets()}
    g = layers["gemma-2-9b:local"]
    assert (g.head_dim, g.window, g.softcap) == (256, 4096, 50.0) and g.heads_q % g.heads_kv == 0
    assert g.features("prefill") == ("causal", "gqa", "sliding_window", "softcap")
    assert g.features("decode") == ("gqa", "sliding_window", "softcap")
    bad = tmp_path / "models.json"
    bad.write_text('{"schema": 1, "models": {"m": {"layers": []}}}')
    with pytest.raises(W.PresetError, match="m"):
        W.load_presets(bad)


def test_a_layer_knows_whether_its_model_has_one_window_size_and_the_vllm_fa3_profile_says_so():
    layers = {ly.name: ly for ly in W.load_presets()}
    # Gemma 2 and gpt-oss mix windowed and full layers; Mistral 7B v0.1 windows every layer, Llama none
    assert not layers["gemma-2-9b:global"].one_window_size and not layers["gpt-oss-20b:sliding"].one_window_size
    assert layers["mistral-7b-v0.1:sliding"].one_window_size and layers["llama-3.1-8b:full"].one_window_size
    T = load_script("benchmarks/workload_timing.py")
    assert T.profile_of("vllm_fa3", "decode", layers["llama-3.1-8b:full"]).endswith("scheduler_metadata planned ahead")
    assert "no scheduler_metadata" in T.profile_of("vllm_fa3", "decode", layers["gemma-2-9b:global"])
    fa4 = T.profile_of("vllm_fa4", "decode", layers["gemma-2-9b:global"])
    assert fa4.startswith("vllm: varlen q, block_table (block 16)") and "padded to vLLM's captured batch" in fa4
    # only a decode step is padded to a captured graph: prefill's call, and so its text, is the one it always was
    assert T.profile_of("vllm_fa4", "prefill") == "vllm: varlen q, block_table (block 16) + seqused_k"
    assert "padded" not in T.profile_of("vllm_fa3", "mla_prefill", layers["deepseek-v3:mla"])
    assert T.profile_of("fa4", "decode") == "library API, contiguous KV"


@pytest.mark.slow
def test_the_sweeps_call_keyed_as_the_selector_looks_it_up_is_the_models_query():
    # One rule for a model layer's query (models.call_params): the workload sweep's case (Layer.features: decode
    # without its causal mask) keyed as the engine looks timings up (workload_features) is explain --model's query.
    from attnmatrix.matrix.models import ModelError, load_models

    from attnmatrix.selector_workloads import workload_features
    from attnmatrix.vocabulary import features_of

    models = load_models()
    layers = W.load_presets()
    assert layers
    for ly in layers:
        model = models[ly.model]
        lt = next(t for t in model.layers if t.type == ly.layer)
        for op in ly.ops():
            query = features_of(**lt.query_params(op, model.tp))
            assert workload_features(op, ly.features(op)) == query, (ly.name, op)
            assert ("causal" in ly.features(op)) == (op != "decode"), (ly.name, op)
        with pytest.raises(ModelError, match="not decode" if ly.qk_rope else "not mla_prefill"):
            ly.features("decode" if ly.qk_rope else "mla_prefill")
    assert {op for ly in layers for op in ly.ops()} == {"prefill", "decode", "mla_prefill"}


def test_sweep_and_report_on_the_cpu(tmp_path, monkeypatch):
    R = _regret()
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64), (2, 128)), "decode": ((2, 64), (4, 128))})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((3, 100),)})
    presets = tmp_path / "models.json"

    def model(kv: int, layer: dict) -> dict:
        config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": kv, "num_hidden_layers": 1,
                  "attn_logit_softcapping": layer.get("softcap")}
        return {"family": "test", "repo": "test/tiny", "file": "config.json", "source": "https://huggingface.co/test/tiny/blob/main/config.json",
                "config": config,
                "tp": 1, "layers": [{"count": 1, "num_heads": 4, "num_kv_heads": kv, "head_dim": 32, **layer}]}

    presets.write_text(json.dumps({"schema": 1, "models": {
        "tiny": model(2, {"type": "global"}), "tiny-capped": model(4, {"type": "capped", "softcap": 30.0})}}))
    out = tmp_path / "run.jsonl"
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets),
                   "--rounds", "4"]) == 0
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    # a timed row does not repeat what its check row says; reading the file gives every row its fields back
    assert all("case" not in r for r in raw if r["set"] in ("bucket", "held_out"))
    rows = W.load_rows([out])
    assert all(r["case"].startswith("cpu/sdpa_cpu/") for r in rows if r["set"] in ("bucket", "held_out"))
    checks = {(r["layer"], r["op"]): r["outcome"] for r in rows if r["set"] == "check"}
    assert checks[("tiny:global", "prefill")] == "pass"
    assert checks[("tiny-capped:capped", "decode")] == "rejected"  # SDPA has no softcap parameter
    timed = [r for r in rows if r["set"] in ("bucket", "held_out")]
    assert len(timed) == 2 * (2 + 1)  # the global layer's two ops, two buckets and one held-out point each
    assert all(r["outcome"] == "pass" and r["ms"] > 0 and len(r["rounds"]) == 4 for r in timed)
    assert sum(r["set"] == "done" for r in rows) == 4  # every workload finished, the refused ones too
    assert all(r["seconds"] >= 0 for r in rows if r["set"] == "done")  # what each layer call took
    # a second run over the same file resumes: nothing is timed again
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets)]) == 0
    assert len(out.read_text().splitlines()) == len(raw)
    result = R.analyse(rows)
    assert result["noise"]["points"] == 6 and result["noise"]["p90"] >= 1.0
    # the fresh shapes are scored apart too: a second backend, 1.2x slower at decode's held-out point, is the pick
    slow = [{**r, "backend": "slow", "ms": r["ms"] * 1.2} for r in rows
            if r["set"] == "held_out" and r["op"] == "decode"]
    slow += [{**r, "backend": "slow"} for r in rows if r["set"] == "check" and r["layer"] == "tiny:global"]
    monkeypatch.setattr(W, "FRESH_DRAWS", {"d0": {"decode": ((9, 900),)}, "d1": {"decode": ((3, 100),)},
                                          "d2": {"decode": ((5, 500),)}})
    scored = R.analyse(rows + slow, order=lambda *a, **k: ["slow", "sdpa_cpu"])["regret"]
    fresh = scored["fresh"]
    assert fresh["queries"] == 1 and fresh["max"] == 1.2 and fresh["over_1.10"] == 1
    assert scored["fresh_draws"] == {"d1": {"queries": 1, "geomean": 1.2, "max": 1.2, "over_1.10": 1}}
    # a draw committed after the newest timed one is a judge still to come; an older one not timed here is not
    assert scored["pending_draws"] == ["d2"] and R.pending_draws({"a": [], "b": []}) == ["a", "b"]
    assert result["regret"]["queries"] == 2 and result["regret"]["max"] == 1.0  # one backend: its own best
    assert result["rankings"]["tiny:global prefill b2_s128"]["order"][0][0] == "sdpa_cpu"
    assert result["nearby_winners_best"]["queries"] == 2 and result["nearby_winners_best"]["max"] == 1.0
    # float16 is timed into a file of its own, and ranked apart from bfloat16
    with pytest.raises(SystemExit, match="holds bfloat16 timings; a float16 sweep needs its own file"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets), "--dtype", "float16"])
    half = tmp_path / "run-fp16.jsonl"
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(half), "--presets", str(presets),
                   "--dtype", "float16", "--rounds", "2"]) == 0
    both = R.analyse(W.load_rows([out, half]))
    assert {q["dtype"] for q in both["queries"]} == {"bfloat16", "float16"} and both["regret"]["queries"] == 4
    assert {"tiny:global prefill float16 b2_s128", "tiny:global prefill b2_s128"} <= set(both["rankings"])
    noise, orders = W.bucket_orders(rows)
    assert noise["points"] == 6 and len(orders) == 4  # the capped layer's check was refused: not ranked
    # --held-out-only: a second reading of the held-out points alone, resumed as its own kind of sweep
    again = tmp_path / "held-out.jsonl"
    for _ in range(2):
        assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(again), "--presets", str(presets),
                       "--held-out-only", "--rounds", "2"]) == 0
    second = W.load_rows([again])
    assert {r["set"] for r in second} == {"check", "held_out", "done"}
    assert sum(r["set"] == "held_out" for r in second) == 2 and sum(r["set"] == "done" for r in second) == 4
    assert all(r["sets"] == ["held_out"] for r in second if r["set"] == "done")
    alone = R.analyse(second)  # no rankings of its own: `report` asks the selector, whose data are committed
    assert len(alone["queries"]) == 2 and alone["rankings"] == {}
    # a full sweep's `done` lines do not stand for a held-out-only run: into the same file, the points are timed again
    held = sum(r["set"] == "held_out" for r in W.load_rows([out]))
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets), "--held-out-only",
                   "--rounds", "2"]) == 0
    assert sum(r["set"] == "held_out" for r in W.load_rows([out])) == held + 2
    # --ops: one op's calls alone; an op with no buckets is refused before anything runs
    decode = tmp_path / "decode.jsonl"
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(decode), "--presets", str(presets), "--ops", "decode",
                   "--rounds", "2"]) == 0
    assert {r["op"] for r in W.load_rows([decode]) if r["set"] != "done"} == {"decode"}
    with pytest.raises(SystemExit, match="unknown op"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(decode), "--presets", str(presets), "--ops", "decoding"])
    # --points: the named points alone (a new draw of fresh shapes, without the committed files at hand)
    named = tmp_path / "named.jsonl"
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--ops", "decode",
                   "--points", "4x128,3x100", "--rounds", "2"]) == 0
    assert {(r["set"], r["batch"], r["length"]) for r in W.load_rows([named]) if r["set"] in ("bucket", "held_out")} \
        == {("bucket", 4, 128), ("held_out", 3, 100)}
    assert all(r["points"] == "3x100,4x128" for r in W.load_rows([named]) if r["set"] == "done")
    lines = len(named.read_text().splitlines())  # resumed with the points in another order: nothing timed again
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--ops", "decode",
                   "--points", "4x128, 3x100", "--rounds", "2"]) == 0
    assert len(named.read_text().splitlines()) == lines
    with pytest.raises(SystemExit, match="'4:128' is not BATCHxLENGTH"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--points", "4:128"])
    with pytest.raises(SystemExit, match="is not BATCHxLENGTH"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--points", ""])
    # a point the sweep would not time (not a bucket or held-out point of the op) is refused, not skipped
    with pytest.raises(SystemExit, match="5x100 is no bucket or held_out point of decode"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--ops", "decode",
                "--points", "5x100"])
    with pytest.raises(SystemExit, match="4x128 is no held_out point"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(named), "--presets", str(presets), "--ops", "decode",
                "--held-out-only", "--points", "4x128"])


def test_new_points_only_times_what_the_committed_files_do_not_hold(tmp_path, monkeypatch):
    R = _regret()
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64),), "decode": ((2, 64),)})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((3, 100),)})
    presets = tmp_path / "models.json"
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1}
    presets.write_text(json.dumps({"schema": 1, "models": {"tiny": {
        "family": "test", "repo": "test/tiny", "file": "config.json", "config": config, "tp": 1,
        "source": "https://huggingface.co/test/tiny/blob/main/config.json",
        "layers": [{"count": 1, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "type": "global"}]}}}))
    committed = tmp_path / "workloads"
    committed.mkdir()
    monkeypatch.setattr(W, "WORKLOADS_DIR", committed)
    args = ["--backends", "sdpa_cpu", "--presets", str(presets), "--rounds", "2"]
    assert R.main(["sweep", *args, "-o", str(committed / "first.jsonl")]) == 0
    # the grid grows on decode's length axis and decode's held-out shape is drawn again
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64),), "decode": ((2, 64), (2, 96))})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((3, 80),)})
    new = tmp_path / "new.jsonl"
    for _ in range(2):  # the second run resumes: nothing is timed again
        assert R.main(["sweep", *args, "-o", str(new), "--new-points-only"]) == 0
    rows = W.load_rows([new])
    timed = sorted((r["op"], r["set"], r["batch"], r["length"]) for r in rows if r["set"] in ("bucket", "held_out"))
    assert timed == [("decode", "bucket", 2, 96), ("decode", "held_out", 3, 80)]
    assert [r["op"] for r in rows if r["set"] == "done"] == ["decode"]  # prefill had nothing new: not even checked
    assert all(r["new_points_only"] for r in rows if r["set"] == "done")


def test_decode_times_the_first_batch_past_each_wave_of_the_sms():
    # one thread block per KV head of a sequence, one per SM of 132: 8 KV heads fill a wave with 16 sequences
    assert W.wave_ends(8, 40) == (16, 33, 49) and W.wave_ends(1, 256) == (132, 264)
    assert W.wave_ends(32, 20) == (4, 8, 12, 16, 20)
    # the first six waves of 8 and 4 KV heads: one more wave costs a sixth of the step or more
    assert W.WAVE_BATCHES == [17, 34, 50, 67, 83, 100, 133, 166, 199] and set(W.WAVE_BATCHES) <= set(W.DECODE_BATCHES)
    # and each wave's end: the factor-1.2 batch within 5% below it moves to it, so a step lies between two timed batches
    assert W.WAVE_ENDS == [16, 33, 49, 66, 82, 99, 132, 165, 198] and set(W.WAVE_ENDS) <= set(W.DECODE_BATCHES)
    assert not {32, 48, 64, 80, 96, 128, 160, 192} & set(W.DECODE_BATCHES) and len(W.DECODE_BATCHES) == 38
    # both sides of each of cuDNN's steps past 1, 2, 4, 8, 16 and 33 sequences
    assert {1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 34} <= set(W.DECODE_BATCHES) and W.STEP_BATCHES == [9]
    assert len(W.GRID_OF_DRAW["2026120304"]["decode"]) == 375 and len(W.GRID_OF_DRAW["2026120401"]["decode"]) == 474
    assert len(W.GRID_OF_DRAW["2026120402"]["decode"]) == 407 and len(W.BUCKETS["decode"]) == 417
    # the eighth draw's grid holds the grid's batches and those the ends replaced (timed before): off every timed batch
    drawn_on = {b for b, _ in W.GRID_OF_DRAW["2026120403"]["decode"]}
    assert drawn_on == {*range(1, 9), 10, 12, 14, 16, 17, 20, 24, 28, 32, 33, 34, 40, 48, 49, 50, 56, 64, 66, 67, 80,
                        82, 83, 96, 99, 100, 112, 128, 132, 133, 160, 165, 166, 192, 198, 199, 224, 256}


def test_decode_times_each_sliding_window_just_past_it():
    assert all(n % 64 == 0 for _, n in W.BUCKETS["decode"]) and (1, 4160) not in W.BUCKETS["decode"]
    # the first multiple of 64 past the window, where the grid's contexts straddle it and do not hold it already
    assert W.past_window(4096) == 4160 and W.past_window(1024) == 1088 and W.past_window(512) == 576
    assert W.past_window(2047) is None  # 2048, a grid context, is past it already
    assert W.past_window(128) is None and W.past_window(None) is None  # every timed context is past it
    layers = {ly.name: ly for ly in W.load_presets()}
    assert W.layer_buckets(layers["llama-3.1-8b:full"], "decode") == W.BUCKETS["decode"]
    assert W.layer_buckets(layers["mistral-7b-v0.1:sliding"], "prefill") == W.BUCKETS["prefill"]
    local = W.layer_buckets(layers["mistral-7b-v0.1:sliding"], "decode")
    added = sorted(set(local) - set(W.BUCKETS["decode"]))
    assert set(local) >= set(W.BUCKETS["decode"]) and list(local) == sorted(local)
    # every grid batch within the cache cap: 252 sequences of 4160 tokens fill it
    assert added == [(b, 4160) for b in W.DECODE_BATCHES if b <= 252]


def test_around_is_the_grid_cell_of_a_point():
    assert W.around("decode", 11, 896) == ((10, 768), (10, 1024), (12, 768), (12, 1024))
    assert W.around("decode", 5, 896, W.GRID_BY_1_5) == ((4, 768), (4, 1024), (6, 768), (6, 1024))  # another grid
    assert W.around("decode", 4, 1024) == ((4, 1024),)
    assert W.around("decode", 4, 896) == ((4, 768), (4, 1024))  # on a grid line: its two points
    assert W.around("prefill", 40, 1536) == ((32, 1024), (32, 2048), (48, 1024))  # (48, 2048): over 64k tokens
    # a length past a multiple of 64 is placed among the timed lengths past one, up to the longest of them
    assert W.around("prefill", 5, 600) == ((4, 552), (4, 808), (6, 552), (6, 808))
    assert W.around("prefill", 5, 1500) == ((4, 1064), (4, 2048), (6, 1064), (6, 2048))
    # at batch 64 the token cap ends the lengths past a multiple at 808: 1000 tokens are placed up to 1024
    assert W.around("prefill", 64, 1000) == ((64, 808), (64, 1024)) and W.bucket_of("prefill", 64, 1000) == (64, 1024)
    assert W.around("prefill", 1, 128) == ((1, 256),)  # beyond the grid: the edge
    assert W.around("prefill", 128, 20000) == (W.bucket_of("prefill", 128, 20000),)  # every corner left out


def _timed(backend: str, batch: int, length: int, ms: float, kind: str = "bucket") -> dict:
    return {"backend": backend, "layer": "m:l", "op": "decode", "set": kind, "batch": batch, "length": length,
            "outcome": "pass", "ms": ms, "rounds": [ms, ms]}


def test_the_nearby_winners_best_is_the_best_backend_that_wins_at_a_point_around_the_query(monkeypatch):
    R = _regret()
    monkeypatch.setattr(W, "BUCKETS", {"decode": ((2, 64), (2, 128), (4, 64), (4, 128))})
    monkeypatch.setattr(W, "HELD_OUT", {"decode": ((3, 100),)})
    checks = [{"backend": b, "layer": "m:l", "op": "decode", "set": "check", "outcome": "pass"}
              for b in ("a", "b", "c")]
    # a wins at three corners (the nearest, (4, 128), among them), b at the far one; c wins at none but is the
    # fastest at the held-out point; d, whose check failed, is fastest everywhere and counts nowhere
    checks.append({"backend": "d", "layer": "m:l", "op": "decode", "set": "check", "outcome": "wrong"})
    grid = [_timed("a", 2, 64, 2.0), _timed("b", 2, 64, 1.0), _timed("c", 2, 64, 3.0),
            _timed("a", 2, 128, 1.0), _timed("b", 2, 128, 2.0), _timed("c", 2, 128, 3.0),
            _timed("a", 4, 64, 1.0), _timed("b", 4, 64, 2.0), _timed("c", 4, 64, 3.0),
            _timed("a", 4, 128, 1.0), _timed("b", 4, 128, 2.0), _timed("c", 4, 128, 3.0)]
    grid += [_timed("d", b, n, 0.1) for b, n in W.BUCKETS["decode"]] + [_timed("d", 3, 100, 0.1, "held_out")]
    held = [_timed("a", 3, 100, 1.5, "held_out"), _timed("b", 3, 100, 1.2, "held_out"),
            _timed("c", 3, 100, 1.0, "held_out")]
    result = R.analyse(checks + grid + held)
    (q,) = result["queries"]
    assert q["fastest"] == "c" and q["nearby_winners_best"] == 1.2  # b, the far corner's winner, not a (1.5)
    assert result["nearby_winners_best"] == {**result["nearby_winners_best"], "queries": 1, "max": 1.2, "over_1.10": 1}
    # with the selector's placement: its order a guess between a and b (both within its interpolation band)
    from attnmatrix.selector_workloads import Placement

    guessed = Placement((8, 8), 3, 100, (), False, (("a", 1.1), ("b", 1.2), ("c", 2.0)), 1, 2)
    result = R.analyse(checks + grid + held, placement=lambda *query: guessed)
    (q,) = result["queries"]
    assert q["uncertain"] == ["a", "b"] and q["pick"] == "a" and q["regret"] == 1.5
    assert result["regret"]["guess"] == {"queries": 1, "geomean": 1.5, "max": 1.5}
    assert result["regret"]["sure"]["queries"] == 0 and result["regret"]["over_1.10_marked_uncertain"] == 0


def _engine_with_workloads():
    from attnmatrix import selector

    data = dict(selector.DATA)
    data["workload_band"] = 1.02
    data["workloads"] = {"sm_90": {("decode", "bfloat16", 128, 128, ("causal", "gqa")): (
        (32, 8, 8, 1024, 1, (("fa2", 0.01), ("vllm_fa3", 0.02))),
        (32, 8, 8, 8192, 1, (("vllm_fa3", 0.04), ("fa2", 0.08))),
        (32, 8, 128, 1024, 1, (("fa2", 0.10), ("vllm_fa3", 0.12))),
        (32, 8, 128, 8192, 2, (("vllm_fa3", 0.50), ("fa4", 0.505), ("fa2", 0.90))),
        (8, 1, 8, 1024, 1, (("fa4", 0.01), ("fa2", 0.03))),
    )}}
    from attnmatrix.selector_engine import Engine

    return Engine(data)


def test_workload_hints_rank_by_the_timings_at_the_hinted_shape_and_leave_the_plain_answer_alone():
    eng = _engine_with_workloads()
    plain = eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True)
    assert eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=None) == plain

    def hinted(**hints):
        return eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, **hints)

    # at a timed point, that point's order
    small = hinted(num_heads=32, num_kv_heads=8, batch_size=8, context_len=1024)
    assert small[:2] == ["fa2", "vllm_fa3"] and sorted(small) == sorted(plain)
    # a tie within the noise band keeps the order without hints between the tied backends
    big = hinted(num_heads=32, num_kv_heads=8, num_tokens=128, context_len=8192)
    tied = [b for b in plain if b in ("vllm_fa3", "fa4")]
    assert big[:2] == tied and big[2] == "fa2"
    # between timed points, each backend's time is interpolated from the points around: near (8, 8192) the long
    # context wins for vllm_fa3 although (8, 1024), the nearest point on the batch axis, says fa2
    between = hinted(num_heads=32, num_kv_heads=8, batch_size=10, context_len=6000)
    assert between[:2] == ["vllm_fa3", "fa2"]
    # fa4 was timed at one of the four corners only: it is placed from that one (0.505 ms), after the others
    placed = eng.workload_order("sm_90", "decode", "bfloat16", 128, 128, ("causal", "gqa"),
                                {"num_heads": 32, "num_kv_heads": 8, "batch_size": 10, "context_len": 6000})
    assert [b for b, _ in placed.order] == ["vllm_fa3", "fa2", "fa4"] and dict(placed.order)["fa4"] == 0.505
    assert not placed.exact and placed.points == ((8, 1024), (8, 8192), (128, 1024), (128, 8192))
    # head counts pick the layer: 8 query heads over 1 KV head is the other timed layer
    tp8 = hinted(num_heads=8, num_kv_heads=1, batch_size=8, context_len=1024)
    assert tp8[:2] == ["fa4", "fa2"]
    with pytest.raises(ValueError, match="batch_size"):
        eng.select_backends((9, 0), 128, op="decode", gqa=True, batch_size=0, context_len=10)


def test_a_placement_between_points_interpolates_in_log_space():
    from attnmatrix.selector_workloads import place

    rows = ((4, 4, 1, 100, 1, (("a", 1.0), ("b", 2.0))), (4, 4, 1, 10000, 1, (("b", 4.0), ("a", 16.0))))
    p = place(rows, "prefill", {"batch_size": 1, "seq_len": 1000}, band=1.0)
    assert not p.exact and p.points == ((1, 100), (1, 10000))
    # halfway in log space: the geometric means, a 4.0 and b sqrt(8)
    assert dict(p.order) == {"a": 4.0, "b": pytest.approx(2.82843, abs=1e-5)} and p.order[0][0] == "b"
    assert "interpolated from the timed points (batch x length) 1x100, 1x10000" in p.basis()
    assert place(rows, "prefill", {"batch_size": 1, "seq_len": 100}).exact
    assert place(rows, "prefill", {"num_heads": 4}) is None  # no shape hinted
    # prefill's num_tokens says nothing about the batch without seq_len: 8192 tokens may be one sequence or 64
    assert place(rows, "prefill", {"num_tokens": 8192}) is None
    assert place(rows, "prefill", {"num_tokens": 2000, "seq_len": 1000}).batch == 2
    one_axis = place(rows, "prefill", {"seq_len": 9000})
    assert (one_axis.batch, one_axis.length, one_axis.exact) == (1, 10000, False)
    assert "the timed point nearest on the hinted axis" in one_axis.basis()


def test_between_grid_values_the_bracketing_points_are_interpolated_and_on_a_grid_line_its_two_points():
    from attnmatrix.selector_workloads import place

    grid = [(b, n) for b in (1, 4, 16, 64) for n in (512, 2048)]
    rows = tuple((8, 1, b, n, 1, (("x", float(b * n)),)) for b, n in grid)
    # batch 16 is a grid value: only (16, 512) and (16, 2048) place it, not the nearer-looking batch-4 points
    on_line = place(rows, "decode", {"batch_size": 16, "context_len": 1024})
    assert on_line.points == ((16, 512), (16, 2048)) and dict(on_line.order)["x"] == pytest.approx(16 * 1024)
    inside = place(rows, "decode", {"batch_size": 8, "context_len": 1024})
    assert inside.points == ((4, 512), (4, 2048), (16, 512), (16, 2048))
    assert dict(inside.order)["x"] == pytest.approx(8 * 1024)  # log-bilinear is exact for a product of powers


def test_a_length_past_a_multiple_of_64_is_placed_from_the_timed_lengths_of_its_kind():
    from attnmatrix.selector_workloads import place, series

    # a kernel fast at multiples of 64 (x) and one that is not (y): at 520 tokens x pays for its partial tile
    lengths = {256: (1.0, 1.5), 296: (2.0, 1.6), 512: (2.0, 3.0), 552: (4.0, 3.1), 2048: (8.0, 12.0)}
    rows = tuple((8, 8, 1, n, 1, tuple(sorted((("x", a), ("y", b)), key=lambda t: t[1]))) for n, (a, b) in
                 lengths.items())
    points = [(1, n) for n in lengths]
    assert series(points, 520) == [(1, 296), (1, 552), (1, 2048)]  # past the longest: the multiples beyond it
    assert series(points, 512) == series(points, 640) == [(1, 256), (1, 512), (1, 2048)]
    assert series(points, None) == points and series([(1, 512), (1, 1024)], 700) == [(1, 512), (1, 1024)]
    past = place(rows, "prefill", {"batch_size": 1, "seq_len": 520})
    assert past.points == ((1, 296), (1, 552)) and past.order[0][0] == "y"
    at = place(rows, "prefill", {"batch_size": 1, "seq_len": 384})
    assert at.points == ((1, 256), (1, 512)) and at.order[0][0] == "x"
    assert place(rows, "prefill", {"batch_size": 1, "seq_len": 1500}).points == ((1, 552), (1, 2048))


def test_a_backend_flat_over_the_querys_tile_is_read_off_its_tile():
    from attnmatrix.selector_workloads import place, tile_readings

    # `step` takes the same time over a whole 128-token tile (cuDNN's prefill); `grow` grows with the length
    times = {256: (0.5, 0.7), 296: (1.0, 0.9), 384: (1.02, 1.2), 424: (2.0, 1.3), 512: (2.03, 1.6)}
    rows = tuple((8, 8, b, n, 1, tuple(sorted((("step", x * b), ("grow", y * b)), key=lambda t: t[1])))
                 for b in (1, 2) for n, (x, y) in times.items())
    by_point = {(r[2], r[3]): r for r in rows}
    # 360 tokens, in the tile (256, 384]: step's time at 296 and at 384 within the band, grow's 1.33x apart
    assert tile_readings(by_point, 1, 360, 1.1) == {"step": 1.0}
    assert tile_readings(by_point, 1, 360, 1.01) == {}  # not flat within a tighter band
    assert tile_readings(by_point, 1, 384, 1.1) == {}  # a multiple of 64: among the multiples
    assert tile_readings(by_point, 1, 600, 1.1) == {}  # no timed length in the tile (512, 640]
    assert math.isclose(tile_readings(by_point, 2 ** 0.5, 360, 1.1)["step"], 2 ** 0.5)  # between batches
    # a backend not timed at one of the batches around is not read off the tile (it is interpolated as before)
    gap = {**by_point, (2, 384): (8, 8, 2, 384, 1, (("grow", 2.4),))}
    assert tile_readings(gap, 2 ** 0.5, 360, 1.1) == {}
    # read between 296 and 424 the step is smeared over the gap and grow looks faster; read off its tile, step is
    assert place(rows, "prefill", {"batch_size": 1, "seq_len": 360}, spread=1.1, tiles=False).order[0][0] == "grow"
    placed = place(rows, "prefill", {"batch_size": 1, "seq_len": 360}, spread=1.1)
    assert placed.order[0] == ("step", 1.0) and placed.order[1][0] == "grow" and placed.tiled == ("step",)
    assert placed.basis().endswith("; step read off the 128-token tile it is flat over")


def test_the_interpolation_error_reads_each_point_off_its_neighbours_of_the_same_kind():
    # x is proportional to the length (read exactly in log space) among multiples of 64 and among the lengths past
    # one, although 2x slower past one; y is 4x at 384 what its neighbours 256 and 512 say
    orders = {}
    for n, x in {256: 1.0, 384: 1.5, 512: 2.0, 296: 2.0, 424: 424 / 148, 552: 552 / 148}.items():
        y = {384: 9.0, 296: 1.0, 424: 4.0 ** (math.log(424 / 296) / math.log(552 / 296)), 552: 4.0}.get(n, x * x)
        order = tuple(sorted((("x", x), ("y", y)), key=lambda t: t[1]))
        orders[("sm_90", "prefill", "bfloat16", 128, 128, ("causal",), 8, 8, 1, n)] = (order, 1)
    err = W.interpolation_error(orders)
    assert err["points"] == 4 and err["max"] == 4.0 and err["median"] == pytest.approx(1.0)


def test_explain_says_composed_and_which_timings_placed_a_backend():
    eng = _engine_with_workloads()
    why = eng.explain((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8, batch_size=8,
                      context_len=1024)
    placed = "placed by the workload hints' timings instead (heads 32/8, batch 8, length 1024): 0.01 ms"
    assert placed in why["fa2"] and "tied" not in why["fa2"]  # the fastest alone is tied with nobody
    plain = eng.explain((9, 0), 128, op="decode", causal=True, gqa=True, sinks=True)
    assert any("composed from" in v for v in plain.values() if v.startswith("supported"))
    assert not any("workload" in v for v in plain.values())
    # between timed points, backends within the interpolation error of the fastest are said to be a guess
    eng.data["workload_interpolation_band"] = 3.0
    between = eng.explain((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8,
                          batch_size=10, context_len=6000)
    assert "within the interpolation error (3x) of the fastest" in between["fa2"]
    assert "cannot tell vllm_fa3, fa2 apart (timing them at the shape settles it" in between["fa2"]
    assert "interpolation error" not in why["fa2"]  # at a timed point the timings are the answer
    # tied within the noise and a guess too: both said
    eng.data["workload_band"] = 3.0
    both = eng.explain((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8,
                       batch_size=10, context_len=6000)
    assert "tied with the fastest within the measurement noise, within the interpolation error" in both["fa2"]


def test_placements_between_points_mark_the_backends_the_interpolation_error_cannot_tell_apart():
    from attnmatrix.selector_workloads import place

    rows = ((4, 4, 1, 100, 1, (("a", 1.0), ("b", 1.2), ("c", 3.0))),
            (4, 4, 1, 10000, 1, (("a", 4.0), ("b", 4.4), ("c", 9.0))))
    between = place(rows, "prefill", {"batch_size": 1, "seq_len": 1000}, band=1.01, spread=1.15)
    assert (between.ties, between.uncertain) == (1, 2)  # a and b: 2.0 vs about 2.3 ms, c far behind
    assert place(rows, "prefill", {"batch_size": 1, "seq_len": 1000}, band=1.01).uncertain == 1
    at_point = place(rows, "prefill", {"batch_size": 1, "seq_len": 100}, band=1.01, spread=1.5)
    assert at_point.exact and at_point.uncertain == at_point.ties == 1  # measured there: no guess
    one_axis = place(rows, "prefill", {"seq_len": 100}, band=1.01, spread=1.5)
    assert not one_axis.exact and one_axis.uncertain == 2  # the batch is unknown: as sure as an interpolation


def test_interpolation_error_is_how_far_a_point_is_from_its_neighbours_midpoint():
    key = ("sm_90", "decode", "bfloat16", 128, 128, ("causal",), 8, 8)
    # "x" doubles with the length (midpoint exact); "y" is 2x too slow at the middle point
    orders = {(*key, 1, n): (((("x", n / 100), ("y", (2 if n == 200 else 1) * n / 100))), 1) for n in (100, 200, 400)}
    err = W.interpolation_error(orders)
    assert err["points"] == 2 and err["max"] == 2.0 and err["median"] in (1.0, 2.0)
    assert W.interpolation_error({})["p90"] is None


def test_interleaved_timing_takes_turns_and_tells_a_slower_kernel_apart():
    import time

    from attnmatrix.kernels.interleaved_timing import measure_interleaved
    from attnmatrix.kernels.timing import WALL

    calls = []

    def kernel(name: str, ms: float):
        def fn():
            calls.append(name)
            time.sleep(ms / 1e3)
        return fn

    got = measure_interleaved({"fast": kernel("fast", 1.0), "slow": kernel("slow", 4.0)}, device="cpu", rounds=4)
    assert got["fast"].method == WALL and len(got["fast"].rounds_ms) == 4
    assert got["slow"].ms > 2 * got["fast"].ms
    # after one warm-up call each, the rounds alternate which backend goes first
    assert calls[2:] == ["fast", "slow", "slow", "fast", "fast", "slow", "slow", "fast"]
    assert W.point_noise({"rounds": got["slow"].rounds_ms}) < 2  # the even and odd rounds agree within 2x


def test_point_noise_is_the_spread_of_the_even_and_odd_rounds():
    assert W.point_noise({"rounds": [1.0, 1.1, 1.0, 1.1]}) == pytest.approx(1.1)
    assert W.point_noise({"rounds": [1.0]}) is None
    rows = [{"set": "bucket", "outcome": "pass", "rounds": [1.0, 1.0 + i / 100, 1.0, 1.0 + i / 100]} for i in range(10)]
    assert W.noise(rows) == {"points": 10, "median": 1.05, "p90": 1.09, "max": 1.09}


@pytest.mark.parametrize("args", [["--warm-only", "-o", "run.jsonl"], [], ["-o", "run.jsonl", "--rounds", "1"]])
def test_sweep_refuses_an_output_with_warm_only_none_without_it_and_fewer_than_two_rounds(args, tmp_path, capsys):
    args = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    with pytest.raises(SystemExit) as e:
        _regret().main(["sweep", "--backends", "sdpa_cpu", *args])
    assert e.value.code == 2 and "sweep:" in capsys.readouterr().err
    assert not (tmp_path / "run.jsonl").exists()


def test_a_backend_re_timed_in_another_call_ranks_by_its_latest_call_alone():
    call = {"backend": "x", "case": "sm_90/x/decode/bfloat16/64x64/none", "heads_q": 4, "heads_kv": 4}
    old = [{**call, "set": "check", "profile": "a"}, {**call, "set": "bucket", "profile": "a", "batch": 1, "ms": 2.0},
           {**call, "set": "bucket", "profile": "a", "batch": 2, "ms": 3.0}]
    new = [{**call, "set": "check", "profile": "b"}, {**call, "set": "bucket", "profile": "b", "batch": 1, "ms": 1.0}]
    other = [{**call, "backend": "y", "set": "bucket", "profile": "a", "batch": 1, "ms": 5.0}]
    kept = W.latest_calls(old + other + new)
    # x's call "a" at batch 2 is not mixed into call "b"'s timings; y (no later call) and the check rows stay
    assert [(r["backend"], r["set"], r.get("batch")) for r in kept] == [
        ("x", "check", None), ("y", "bucket", 1), ("x", "check", None), ("x", "bucket", 1)]
    assert W.latest_calls(old) == old
    # a later call that timed held-out shapes alone would leave x without a ranking: refused, naming the call
    held_out = [{**call, "set": "check", "profile": "c"}, {**call, "set": "held_out", "profile": "c", "batch": 3}]
    with pytest.raises(W.PresetError, match=r"x on sm_90/x/decode/bfloat16/64x64/none \(4/4 heads\).*'c'.*'a'"):
        W.latest_calls(old + held_out)


def test_a_backend_whose_split_follows_vllms_graph_is_read_in_the_querys_graph():
    from attnmatrix.matrix.vllm_graphs import capture_sizes

    from attnmatrix.selector_workloads import graph_reading_batch, place

    sizes = tuple(capture_sizes())
    timed = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}
    # batch 5 runs in the graph of 8, with 6 and 8 timed: read at 6 (never at 4, the graph of 4 below)
    assert graph_reading_batch(5, sizes, timed) == 6
    assert graph_reading_batch(7, sizes, timed) == 7  # between 6 and 8, both in its graph: interpolated
    assert graph_reading_batch(10, sizes, timed) == 12 and graph_reading_batch(14, sizes, timed) == 14
    assert graph_reading_batch(20, sizes, timed) == 24
    assert graph_reading_batch(20, sizes, {16, 32}) == 20  # no timed batch of its graph (17..24): as it is
    assert graph_reading_batch(10, sizes, {8, 9, 16}) == 10  # 9 is of its graph, below it: 9 and 16 bracket it
    assert graph_reading_batch(600, sizes, {512, 768}) == 600  # past the largest captured size: not padded
    # `step` steps with the captured batch (the same time over 5..8), `grow` grows with the batch; at batch 5,
    # interpolated between 4 and 6, step looks faster than grow; read in its graph, it is not
    rows = tuple((8, 1, b, n, 1, tuple(sorted((("step", s), ("grow", g)), key=lambda t: t[1])))
                 for b, s, g in ((4, 1.0, 1.2), (6, 2.0, 1.8), (8, 2.0, 2.4)) for n in (1024, 2048))
    hints = {"batch_size": 5, "context_len": 1500}
    assert place(rows, "decode", hints).order[0][0] == "step"
    placed = place(rows, "decode", hints, graphs={"step": sizes})
    assert placed.order[0][0] == "grow" and dict(placed.order)["step"] == pytest.approx(2.0)
    assert placed.graphed == (("step", 6),)
    assert placed.basis().endswith("; step read at batch 6, timed in the CUDA graph vLLM runs batch 5 in")
    assert place(rows, "prefill", {"batch_size": 5, "seq_len": 1500}, graphs={"step": sizes}).graphed == ()
    assert place(rows, "decode", {"batch_size": 6, "context_len": 1024}, graphs={"step": sizes}).exact
    # read only between its timed lengths at the batch it is read at: past them (the grid's token cap) the nearest
    # points would be at other batches, some below the query, so it is interpolated as the others are
    capped = tuple(r for r in rows if (r[2], r[3]) != (6, 2048))
    past = place(capped, "decode", {"batch_size": 5, "context_len": 1500}, graphs={"step": sizes})
    assert past.graphed == () and past.order[0][0] == "step"


def test_a_backend_with_a_fast_path_at_a_power_of_two_is_read_without_it_at_other_lengths():
    from attnmatrix.selector_workloads import fast_path_lengths, place

    band = 1.1
    # 1024 below the reading between 768 and 1536 by more than the band: a fast path; 2048 within it: the trend's
    assert fast_path_lengths({768: 12.0, 1024: 9.0, 1536: 13.0, 2048: 13.8, 3072: 14.5}, band) == [1024]
    assert fast_path_lengths({512: 9.0, 768: 14.0, 1536: 20.0}, band) == [512]  # none below: from the two above
    assert fast_path_lengths({512: 9.0, 1024: 9.5}, band) == []  # no other kind of length to read it from
    # `fast` takes its path at 1024 at batch 1 alone; `even` grows evenly; at 1 x 880 interpolated through 1024,
    # fast looks faster than even; read from 768 and 1536, it is not
    times = {(1, 768): (12.0, 11.0), (1, 1024): (9.0, 11.3), (1, 1536): (13.0, 12.0),
             (2, 768): (13.0, 12.0), (2, 1024): (13.4, 12.4), (2, 1536): (14.0, 13.0)}
    rows = tuple((4, 1, b, n, 1, tuple(sorted((("fast", f), ("even", e)), key=lambda t: t[1])))
                 for (b, n), (f, e) in times.items())
    hints = {"batch_size": 1, "context_len": 880}
    assert place(rows, "decode", hints, 1.0, band).order[0][0] == "fast"
    placed = place(rows, "decode", hints, 1.0, band, paths=("fast",))
    assert placed.order[0][0] == "even"
    assert dict(placed.order)["fast"] == pytest.approx(12 * (13 / 12) ** math.log2(880 / 768), abs=1e-5)
    assert placed.unpathed == (("fast", (1024,)),)
    assert placed.basis().endswith("; fast read without its timings at 1024 tokens, a power of two where it ran a "
                                   "faster path than at the lengths around")
    # at batch 2 no fast path is among the points the query is read from: as it was; the path's own length is exact,
    # an untimed power of two may take the path itself, and prefill is not read so
    assert place(rows, "decode", {"batch_size": 2, "context_len": 880}, 1.0, band, paths=("fast",)).unpathed == ()
    assert place(rows, "decode", {"batch_size": 1, "context_len": 1024}, 1.0, band, paths=("fast",)).exact
    assert place(rows, "decode", {"batch_size": 1, "context_len": 512}, 1.0, band, paths=("fast",)).unpathed == ()
    # a fast path at the shortest length (512): a query below the other lengths is read at the shortest of them, as
    # past a power of two cuDNN's time steps up to its next stair
    low = tuple((4, 1, b, n, 1, tuple(sorted((("fast", f), ("even", e)), key=lambda t: t[1])))
                for b in (1, 2) for n, (f, e) in {512: (9.0, 10.0), 768: (14.0, 11.0), 1536: (20.0, 12.0)}.items())
    below = place(low, "decode", {"batch_size": 1, "context_len": 600}, 1.0, band, paths=("fast",))
    assert below.unpathed == (("fast", (512,)),) and dict(below.order)["fast"] == pytest.approx(14.0)
    assert place(rows, "prefill", {"batch_size": 1, "seq_len": 880}, 1.0, band, paths=("fast",)).unpathed == ()


def test_the_power_of_two_paths_are_declared_in_the_backend_registry(tmp_path):
    from attnmatrix.matrix import backends as B

    from attnmatrix import selector

    declared = B.power_of_two_paths({n: i.meta for n, i in B.backends().items()})
    assert declared == ("sdpa_cudnn",) and tuple(selector.DATA["power_of_two_paths"]) == declared
    f = tmp_path / "backends.json"
    f.write_text(json.dumps({"backends": {"x": {"fast_path_at_powers_of_two": 1}}}), encoding="utf-8")
    assert B.read(f)[1] == [("backends.x.fast_path_at_powers_of_two", "expected true or false, got 1")]


def test_a_backend_computing_whole_tiles_is_read_at_its_tiles_end_times_its_partial_tile():
    from attnmatrix.selector_workloads import partial_tile, place, tile_end

    assert [tile_end(n) for n in (1, 128, 129, 619, 640, 641)] == [128, 128, 256, 640, 640, 768]
    # `tiles` takes 1.0 per 128-token tile at a tile's end and 2% more within it at 32 sequences, 4% at 48;
    # `smooth` grows with the length. The grid times 424 with its tile's end (512), and 552 and 808 without theirs.
    def tiles(b, n):
        return b * -(-n // 128) * (1.0 if n % 128 == 0 else {32: 1.02, 48: 1.04}[b])

    lengths = (384, 424, 512, 552, 768, 808, 1024)
    rows = tuple((8, 8, b, n, 1, tuple(sorted((("tiles", tiles(b, n)), ("smooth", b * n / 118)),
                                              key=lambda t: t[1])))
                 for b in (32, 48) for n in lengths)
    times = {(r[2], r[3]): dict(r[5])["tiles"] for r in rows}
    # the partial tile of the batches around the query: one batch, its own; between two, the median of their pairs
    assert partial_tile(times, 32) == pytest.approx(1.02) and partial_tile(times, 48) == pytest.approx(1.04)
    assert partial_tile(times, 40) == pytest.approx((1.02 * 1.04) ** 0.5)
    assert partial_tile({(1, 512): 1.0}, 1) == 1.0
    # 619 is in the tile that ends at 640: five tiles. Interpolated between 552 and 808 (five and seven) `tiles`
    # reads slower than `smooth`; at its tile's end, between 512 and 768 at 640, times its partial tile, the faster
    hints = {"batch_size": 32, "seq_len": 619}
    assert place(rows, "prefill", hints).order[0][0] == "smooth"
    placed = place(rows, "prefill", hints, whole_tiles=("tiles",))
    assert placed.order[0][0] == "tiles" and placed.tile_ends == (("tiles", 640, pytest.approx(1.02)),)
    assert dict(placed.order)["tiles"] == pytest.approx(32 * 5 * 1.02, rel=1e-3)
    assert placed.basis().endswith("; tiles read at 640 tokens, the end of the 128-token tile it computes whole, "
                                   "times 1.020 for its partial tile")
    # decode and MLA prefill are not read so; a tile the grid times a length of past a multiple of 64 and its end
    # (424 and 512) is read off those two (`tile_readings`)
    assert place(rows, "mla_prefill", hints, whole_tiles=("tiles",)).tile_ends == ()
    decode = tuple((8, 8, b, n, 1, order) for _, _, b, n, _, order in rows if n % 64 == 0)
    assert place(decode, "decode", {"batch_size": 32, "context_len": 619}, whole_tiles=("tiles",)).tile_ends == ()
    within = place(rows, "prefill", {"batch_size": 32, "seq_len": 460}, 1.0, 1.05, whole_tiles=("tiles",))
    assert within.tile_ends == () and within.tiled == ("tiles",)
    # a tile's end is its own reading (640, untimed, interpolated as every backend is), and a tile's end no timed
    # points bracket is not read so: below the grid's lengths, past them, or where the token cap leaves out a corner
    at_end = place(rows, "prefill", {"batch_size": 32, "seq_len": 640}, whole_tiles=("tiles",))
    assert at_end.tile_ends == () and not at_end.exact
    assert place(rows, "prefill", {"batch_size": 32, "seq_len": 200}, whole_tiles=("tiles",)).tile_ends == ()
    assert place(rows, "prefill", {"batch_size": 32, "seq_len": 300}, whole_tiles=("tiles",)).tile_ends[0][1] == 384
    assert place(rows, "prefill", {"batch_size": 32, "seq_len": 1100}, whole_tiles=("tiles",)).tile_ends == ()
    capped = tuple(r for r in rows if (r[2], r[3]) != (48, 768))
    assert place(capped, "prefill", {"batch_size": 40, "seq_len": 619}, whole_tiles=("tiles",)).tile_ends == ()
    assert place(rows, "prefill", {"batch_size": 40, "seq_len": 619}, whole_tiles=("tiles",)).tile_ends != ()


def test_the_whole_tile_backends_are_declared_in_the_backend_registry(tmp_path):
    from attnmatrix.matrix import backends as B

    from attnmatrix import selector

    declared = B.whole_tile_backends({n: i.meta for n, i in B.backends().items()})
    assert declared == ("sdpa_cudnn",) and tuple(selector.DATA["whole_tiles"]) == declared
    f = tmp_path / "backends.json"
    f.write_text(json.dumps({"backends": {"x": {"prefill_in_whole_tiles": "yes"}}}), encoding="utf-8")
    assert B.read(f)[1] == [("backends.x.prefill_in_whole_tiles", "expected true or false, got 'yes'")]


def test_the_graph_batches_are_declared_in_the_backend_registry():
    from attnmatrix.matrix.vllm_graphs import capture_sizes, declared_graph_batches, graph_batches

    from attnmatrix import selector

    assert declared_graph_batches() == {"vllm_fa4": tuple(capture_sizes())}
    assert selector.DATA["graph_batches"] == declared_graph_batches()
    assert graph_batches({"x": {"splits_see_graph_batch": False}, "y": {}}) == {}
    assert capture_sizes()[:5] == [1, 2, 4, 8, 16] and capture_sizes()[-2:] == [496, 512]
    assert capture_sizes(24) == [1, 2, 4, 8, 16, 24]


def test_a_graph_batch_flag_that_is_not_a_boolean_is_named(tmp_path):
    from attnmatrix.matrix import backends as B

    f = tmp_path / "backends.json"
    f.write_text(json.dumps({"backends": {"x": {"splits_see_graph_batch": "yes"}}}), encoding="utf-8")
    _, problems = B.read(f)
    assert problems == [("backends.x.splits_see_graph_batch", "expected true or false, got 'yes'")]


def test_a_sliding_window_layer_is_timed_and_ranked_just_past_its_window(tmp_path, monkeypatch):
    R = _regret()
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64),), "decode": ((2, 64), (2, 256))})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((2, 100),)})
    presets = tmp_path / "models.json"
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "sliding_window": 100}
    presets.write_text(json.dumps({"schema": 1, "models": {"tiny": {
        "family": "test", "repo": "test/tiny", "file": "config.json", "config": config, "tp": 1,
        "source": "https://huggingface.co/test/tiny/blob/main/config.json",
        "layers": [{"count": 1, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "type": "global"},
                   {"count": 1, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "type": "local",
                    "sliding_window": 100}]}}}))
    layers = {ly.name: ly for ly in W.load_presets(presets)}
    assert W.layer_buckets(layers["tiny:local"], "decode") == ((2, 64), (2, 128), (2, 256))
    assert W.layer_buckets(layers["tiny:global"], "decode") == W.BUCKETS["decode"]
    out = tmp_path / "run.jsonl"
    # the point past the window is a point of the local layer alone: named, it is timed there and nowhere else
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets), "--ops", "decode",
                   "--points", "2x128,2x64", "--rounds", "2"]) == 0
    rows = W.load_rows([out])
    timed = {(r["layer"], r["batch"], r["length"]) for r in rows if r["set"] == "bucket"}
    assert timed == {("tiny:local", 2, 128), ("tiny:local", 2, 64), ("tiny:global", 2, 64)}
    # and ranked there (`report` ranks every timed bucket point of a layer, not the shared grid's alone)
    assert "tiny:local decode b2_kv128" in R.analyse(rows)["rankings"]
    with pytest.raises(SystemExit, match="2x192 is no bucket or held_out point of decode"):
        R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets), "--ops", "decode",
                "--points", "2x192"])
