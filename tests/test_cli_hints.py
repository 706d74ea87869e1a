"""`attnmatrix explain` with workload hints: the selector's order by the timings at that shape, the same
from the selector's data and from the matrix (`--full`), the engine's words on the bucket that placed each
backend, the old answer without hints, and bad values refused naming the option.

Nothing here names a bucket point: the queried cell and its hints are found by asking the generated selector
(`select_backends` with and without hints) over its timed workload cells, so a change to the workload grid or to
how the engine picks a bucket changes which cell is used, not what is asserted.
"""

from __future__ import annotations

import functools
import itertools
import json

import pytest
from click.testing import CliRunner, Result

from attnmatrix import selector
from attnmatrix.cli import main
from attnmatrix.cli.workload_hints import LENGTH_HINT_OPS
from attnmatrix.vocabulary import FEATURE_BY_NAME, FLAG, capability_of, features_of


def run(*args) -> Result:
    return CliRunner().invoke(main, ["explain", *[str(a) for a in args]])


def flat(text: str) -> str:
    """Terminal output with its wrapping undone."""
    return " ".join(text.split())


def query_params(feats: tuple[str, ...]) -> dict | None:
    """The selector's keyword arguments for a feature set; None where the command line has no option for one."""
    params: dict = {"causal": "causal" in feats}
    for tok in feats:
        name, _, arg = tok.partition(":")
        f = FEATURE_BY_NAME[name]
        if f.param is None:
            return None
        params[f.param] = True if f.kind == FLAG else int(arg)
    assert features_of(**params) == feats
    return params


def cli_args(params: dict) -> list[str]:
    out = []
    for p, v in params.items():
        opt = "--" + p.replace("_", "-")
        out += [opt] if v is True else [f"--no-{opt[2:]}"] if v is False else [opt, str(v)]
    return out


def hint_args(hints: dict) -> list[str]:
    return [a for h, v in hints.items() for a in ("--" + h.replace("_", "-"), str(v))]


@functools.cache
def hinted_query() -> tuple[str, str, str, int, int, tuple, tuple]:
    """(arch, op, dtype, head size, head size v, params, hints) of a timed cell where the hints' bucket orders
    the supported backends otherwise than the matrix does: found by asking the selector."""
    for arch, cells in sorted(selector.DATA["workloads"].items()):
        for op, dtype, hd, hdv, feats in sorted(cells):
            params = query_params(feats)
            if params is None:
                continue
            length = next(h for h, ops in LENGTH_HINT_OPS.items() if op in ops)
            heads = {"num_heads": 32, "num_kv_heads": 8} if "gqa" in feats else {"num_heads": 32}
            plain = selector.select_backends(capability_of(arch), hd, hdv, op=op, dtype=dtype, **params)
            for batch, n in itertools.product((1, 8, 64, 512), (256, 2048, 16384)):
                hints = {**heads, "batch_size": batch, length: n}
                hinted = selector.select_backends(capability_of(arch), hd, hdv, op=op, dtype=dtype, **params, **hints)
                if hinted != plain and sorted(hinted) == sorted(plain):
                    return arch, op, dtype, hd, hdv, tuple(params.items()), tuple(hints.items())
    pytest.fail("no timed workload cell whose bucket order differs from the matrix's order")


def ask(*extra: str, hints: dict | None = None) -> tuple[list, dict]:
    arch, op, dtype, hd, hdv, params, found = hinted_query()
    hints = dict(found) if hints is None else hints
    args = ["--arch", arch, "--op", op, "--dtype", dtype, "--head-size", hd, "--head-size-v", hdv,
            *cli_args(dict(params)), *hint_args(hints), *extra]
    return args, hints


def select(hints: dict) -> list[str]:
    arch, op, dtype, hd, hdv, params, _ = hinted_query()
    return selector.select_backends(capability_of(arch), hd, hdv, op=op, dtype=dtype, **dict(params), **hints)


def test_hints_order_by_the_bucket_and_each_backend_says_which() -> None:
    args, hints = ask("--json")
    r = run(*args)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["order"] == select(hints) != select({})  # the engine's hinted answer, and not the plain one
    assert j["workload_hints"] == {"given": hints, "bucket_applies": True}
    arch, op, dtype, hd, hdv, params, _ = hinted_query()
    told = selector.explain(capability_of(arch), hd, hdv, op=op, dtype=dtype, **dict(params), **hints)
    for b in j["order"]:
        note = j["backends"][b]["bucket"]
        assert note and told[b].endswith(note) and j["backends"][b]["explanation"] == told[b], b
    assert not any("bucket" in a for b, a in j["backends"].items() if b not in j["order"])
    text = run(*args[:-1])  # the terminal answer: the same order, the hints said once, each backend's bucket
    assert text.exit_code == 0, text.output
    out = flat(text.stdout)
    assert f"order: {', '.join(j['order'])}" in out
    assert "workload hints --num-heads" in out and "ordered by their timings at that shape" in out
    assert all(flat(j["backends"][b]["bucket"]) in out for b in j["order"])


@pytest.mark.slow
def test_the_selector_and_the_matrix_order_the_same_for_the_same_hints() -> None:
    args, _ = ask("--json")
    fast, full = run(*args), run(*args, "--full")
    assert fast.exit_code == 0 and full.exit_code == 0, fast.output + full.output
    f, m = json.loads(fast.stdout), json.loads(full.stdout)
    assert "from" in f and "from" not in m
    assert f["order"] == m["order"] and f["workload_hints"] == m["workload_hints"]
    def buckets(j: dict) -> dict:
        return {b: a.get("bucket") for b, a in j["backends"].items()}

    assert buckets(f) == buckets(m) and any(buckets(f).values())


def test_without_hints_the_answer_is_unchanged() -> None:
    args, _ = ask("--json", hints={})
    j = json.loads(run(*args).stdout)
    assert j["order"] == select({}) and "workload_hints" not in j
    assert not any("bucket" in a for a in j["backends"].values())
    # heads alone give neither a batch nor a length: no bucket, the same order, and the answer says so
    heads = {h: v for h, v in hinted_query()[6] if h in ("num_heads", "num_kv_heads")}
    args, hints = ask("--json", hints=heads)
    heads_only = json.loads(run(*args).stdout)
    assert heads_only["order"] == j["order"] and heads_only["workload_hints"] == {"given": hints,
                                                                                  "bucket_applies": False}
    assert "no workload bucket applies" in flat(run(*args[:-1]).stdout)


def test_hints_on_a_cell_nobody_timed_keep_the_order() -> None:
    timed = selector.DATA["workloads"]
    arch = next((a for a in selector.ARCHS if not timed.get(a, {}).get(("prefill", "bfloat16", 128, 128, ("causal",)))),
                None)
    if arch is None:
        pytest.skip("every arch has a timed workload for causal bf16 prefill at head size 128")
    base = ["--arch", arch, "--head-size", "128", "--json"]
    plain = json.loads(run(*base).stdout)
    hinted = json.loads(run(*base, "--num-heads", "16", "--batch-size", "4", "--seq-len", "1024").stdout)
    assert hinted["order"] == plain["order"] and hinted["workload_hints"]["bucket_applies"] is False


@pytest.mark.parametrize(("args", "message"), [
    (["--num-heads", "0"], "Invalid value for '--num-heads': 0 is not a count"),
    (["--num-kv-heads", "-2"], "Invalid value for '--num-kv-heads'"),
    (["--batch-size", "many"], "Invalid value for '--batch-size': 'many' is not a valid integer"),
    (["--num-tokens", "1.5"], "Invalid value for '--num-tokens'"),
    (["--seq-len", "0"], "Invalid value for '--seq-len'"),
    (["--op", "decode", "--context-len", "-1"], "Invalid value for '--context-len'"),
    (["--num-kv-heads", "8"], "--num-kv-heads applies only with --num-heads"),
    (["--num-tokens", "4096", "--batch-size", "4"], "--num-tokens and --batch-size cannot be given together"),
    (["--op", "decode", "--seq-len", "4096"], "--seq-len is the length of prefill and mla_prefill; decode's is "
                                              "--context-len"),
    (["--context-len", "4096"], "--context-len is the length of decode; prefill's is --seq-len"),
    (["--num-heads", "32", "--num-kv-heads", "8"], "is grouped-query attention: add --gqa"),
    (["--gqa", "--num-heads", "32", "--num-kv-heads", "12"], "--num-heads 32 must be a multiple of --num-kv-heads 12"),
    (["--gqa", "--num-heads", "8", "--num-kv-heads", "16"], "must be a multiple of --num-kv-heads 16"),
    (["--gqa", "--num-heads", "32"], "--gqa needs --num-kv-heads fewer than --num-heads"),
])
def test_bad_hints_exit_2_naming_the_option(args: list[str], message: str) -> None:
    r = run("--arch", "sm_90", "--head-size", "128", *args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_help_says_what_the_hints_do() -> None:
    r = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["explain", "--help"])
    assert r.exit_code == 0
    out = flat(r.output)
    assert "timings at that shape" in out and "the answer is unchanged" in out
    for opt in ("--num-heads", "--num-kv-heads", "--num-tokens", "--batch-size", "--seq-len", "--context-len"):
        assert f"{opt} INTEGER Workload hint:" in out, opt


# --- `explain --model`: the batch and length hints, each layer type with its own head counts ---------------------

@pytest.mark.slow
def test_model_hints_carry_each_layer_types_own_heads() -> None:
    from attnmatrix.matrix.models import get_model

    preset = get_model("gemma-2-9b")
    r = run("--arch", "sm_90", "--model", preset.name, "--tp", "2", "--batch-size", "8", "--seq-len", "2048",
            "--context-len", "4096", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    for ly, layer in zip(j["layers"], preset.layers, strict=True):
        q_heads, kv_heads = layer.per_rank(2)
        for q in ly["queries"]:
            length = {"prefill": {"seq_len": 2048}, "decode": {"context_len": 4096}}[q["op"]]
            given = {"num_heads": q_heads, "num_kv_heads": kv_heads, "batch_size": 8, **length}
            assert q["workload_hints"]["given"] == given, (ly["type"], q["op"])
            expect = selector.select_backends(capability_of("sm_90"), layer.head_dim, layer.head_dim_v, op=q["op"],
                                              **layer.query_params(q["op"], 2), **given)
            assert q["order"] == expect, (ly["type"], q["op"])
            if q["workload_hints"]["bucket_applies"]:
                assert all(q["backends"][b]["bucket"] for b in q["order"])
    plain = json.loads(run("--arch", "sm_90", "--model", preset.name, "--tp", "2", "--json").stdout)
    assert not any("workload_hints" in q for ly in plain["layers"] for q in ly["queries"])


def test_model_hints_usage_errors() -> None:
    r = run("--arch", "sm_90", "--model", "gemma-2-9b", "--num-heads", "16")
    assert r.exit_code == 2 and "leave out --num-heads" in r.output
    r = run("--arch", "sm_90", "--model", "gemma-2-9b", "--op", "decode", "--seq-len", "512")
    assert r.exit_code == 2 and "--seq-len is the length of prefill" in r.output
    r = run("--arch", "sm_90", "--model", "gemma-2-9b", "--batch-size", "0")
    assert r.exit_code == 2 and "Invalid value for '--batch-size'" in r.output
