"""Workload hints on `attnmatrix explain`: the options, their checks, and what the engine says about each backend.

The hints are the selector's (`selector_workloads.WORKLOAD_HINTS`: the layer's head counts and the batch's shape).
With them the query engine orders the supported backends by the timings of the nearest timed layer at that
shape: a timed bucket's own, or interpolated from the buckets around it (`Engine.workload_order`,
`selector_workloads.place`, `Engine.query`); without them, or where no workload was timed for the queried cell,
the order is the matrix's. Nothing here chooses a bucket: the fast path (the selector's data) and `--full` (the
resolved matrix) hand the hints to the same engine and print its words (`Engine.explain_query`).
"""

from __future__ import annotations

from collections.abc import Callable

import click

from attnmatrix.selector_engine import Engine
from attnmatrix.selector_workloads import LENGTH_HINT, WORKLOAD_HINTS

from .common import UsageError, count_callback, refuse_conflicts

# What each hint is, as the explain options say it. Prefill's workload point is (batch, tokens per sequence),
# decode's (batch, context length); num_tokens stands for the batch where --batch-size is not given.
HINT_HELP: dict[str, str] = {
    "num_heads": "query heads of the layer (on one GPU)",
    "num_kv_heads": "KV heads of the layer (on one GPU); fewer than --num-heads is grouped-query attention (--gqa)",
    "num_tokens": "tokens in the batch, standing for the batch where --batch-size is not given (decode: one per "
                  "sequence; prefill: with --seq-len)",
    "batch_size": "sequences in the batch",
    "seq_len": "tokens per sequence (prefill, mla_prefill)",
    "context_len": "tokens in each sequence's KV cache (decode)",
}
assert set(HINT_HELP) == set(WORKLOAD_HINTS), "every workload hint of the engine has an explain option"
# The hints a model preset does not supply: its layers give the head counts.
SHAPE_HINTS: tuple[str, ...] = tuple(h for h in WORKLOAD_HINTS if h not in ("num_heads", "num_kv_heads"))
# The ops each length hint belongs to (the engine's LENGTH_HINT): the other length would be silently ignored.
LENGTH_HINT_OPS: dict[str, tuple[str, ...]] = {
    hint: tuple(op for op, h in LENGTH_HINT.items() if h == hint) for hint in sorted(set(LENGTH_HINT.values()))}


def flag(hint: str) -> str:
    return "--" + hint.replace("_", "-")


def hint_options(names: tuple[str, ...] = WORKLOAD_HINTS) -> Callable:
    """Decorator: one positive-int option per workload hint (a bad value exits 2 naming the option)."""

    def decorate(f):
        for name in reversed(names):
            f = click.option(flag(name), name, type=int, default=None, callback=count_callback,
                             help=f"Workload hint: {HINT_HELP[name]}.")(f)
        return f

    return decorate


def take_hints(params: dict) -> dict[str, int]:
    """The workload hints given, taken out of a command's keyword arguments (None is not given)."""
    hints = {name: params.pop(name, None) for name in WORKLOAD_HINTS}
    return {name: v for name, v in hints.items() if v is not None}


def hints_for_op(hints: dict[str, int], op: str) -> dict[str, int]:
    """`hints` without the length that is not `op`'s (a model preset's layers run prefill and decode)."""
    return {h: v for h, v in hints.items() if op in LENGTH_HINT_OPS.get(h, (op,))}


def check_hints(hints: dict[str, int], op: str | None, feats: tuple[str, ...] | None) -> None:
    """Hints that contradict each other or the query are refused (exit 2), never one of them silently ignored.

    `op` None: any op (a model preset's layers run prefill and decode). `feats` None: the heads are not the
    user's (a preset supplies them)."""
    refuse_conflicts(click.get_current_context(), needs={"num_kv_heads": "num_heads"},
                     excludes=(("num_tokens", "batch_size"),))
    for hint, ops in LENGTH_HINT_OPS.items():
        if hint in hints and op is not None and op not in ops:
            other = next(h for h, o in LENGTH_HINT_OPS.items() if op in o)
            raise UsageError(f"{flag(hint)} is the length of {' and '.join(ops)}; {op}'s is {flag(other)}")
    if feats is None or "num_heads" not in hints:
        return
    hq, hkv = hints["num_heads"], hints.get("num_kv_heads", hints["num_heads"])
    if hkv > hq or hq % hkv:
        raise UsageError(f"--num-heads {hq} must be a multiple of --num-kv-heads {hkv}")
    if hkv < hq and "gqa" not in feats:
        raise UsageError(f"--num-kv-heads {hkv} with --num-heads {hq} is grouped-query attention: add --gqa")
    if hkv == hq and "gqa" in feats:
        raise UsageError("--gqa needs --num-kv-heads fewer than --num-heads")


def bucket_notes(eng: Engine, arch: str, op: str, dtype: str, head_dim: int, head_dim_v: int,
                 feats: tuple[str, ...], hints: dict[str, int]) -> dict[str, str] | None:
    """Supported backend -> the engine's words on the workload bucket that placed it; None where no bucket
    applies (no hints, no workload timed for the cell, or hints with neither a batch nor a length).

    `Engine.explain_query` with hints is its answer without them plus what the bucket says; the note is
    that addition (the whole explanation, should the engine ever word it otherwise)."""
    if not hints or eng.workload_order(arch, op, dtype, head_dim, head_dim_v, feats, hints) is None:
        return None
    ordered, _, ranking = eng.query(arch, op, dtype, head_dim, head_dim_v, feats, hints=hints)
    told = eng.explain_query(arch, op, dtype, head_dim, head_dim_v, feats, hints=hints)
    notes = {}
    for i, a in enumerate(ordered):
        plain, text = eng.explain_answer(arch, a, i + 1, len(ordered), ranking), told[a.backend]
        notes[a.backend] = text[len(plain):].lstrip("; ") if text.startswith(plain) else text
    return notes


def hints_line(hints: dict[str, int], placed: bool) -> str:
    """What the hints did to the order, said once per answer."""
    if not hints:
        return "no workload hint given applies to this op: the order is the one without hints"
    given = ", ".join(f"{flag(h)} {v}" for h, v in hints.items())
    if placed:
        return (f"workload hints {given}: the supported backends are ordered by their timings at that shape (a timed "
                "bucket's, or interpolated from the buckets around it); each says its time there")
    return (f"workload hints {given}: no workload bucket applies (none was timed for this cell, or the hints give "
            "neither a batch nor a length; prefill's --num-tokens counts sequences only beside --seq-len): the order "
            "is the one without hints")


def add_hints(result: dict, hints: dict[str, int], notes: dict[str, str] | None) -> None:
    """The workload hints of a JSON answer and, per supported backend, the bucket that placed it (the engine's
    words); an answer without hints is left as it was."""
    if not hints:
        return
    result["workload_hints"] = {"given": dict(hints), "bucket_applies": notes is not None}
    for b, note in (notes or {}).items():
        result["backends"][b]["bucket"] = note
