"""Timing one workload: a model preset's layer in one op, every backend checked against the reference and timed at
the op's points in turns (benchmarks/regret.py `sweep`, benchmarks/shape_scan.py).

vLLM's FlashAttention builds (vllm_fa2/3/4) are timed through vLLM's call: varlen queries, the KV cache through
`block_table` + `seqused_k` with vLLM's default block size 16 (vllm-project/vllm v0.33.0 vllm/v1/attention/backends/
flash_attn.py: `get_supported_kernel_block_sizes` gives `MultipleOf(16)`; the forward passes `seqused_k` and
`block_table` to `flash_attn_varlen_func`, prefill and decode alike); the others through their own API on
contiguous tensors. Each row says which call ran (`entry`, `profile`)."""

from __future__ import annotations

import argparse

from attnmatrix.matrix.workloads import Layer, bucket_label

VLLM_BACKENDS = ("vllm_fa2", "vllm_fa3", "vllm_fa4")
VLLM_BLOCK = 16  # vLLM's default KV block size for its FlashAttention backend (MultipleOf(16))
DTYPE = "bfloat16"  # the sweep's default; `--dtype float16` times the other (one dtype per sweep file)


def case_for(layer: Layer, op: str, backend: str, arch: str, dtype: str = DTYPE):
    from attnmatrix.matrix.cases import Case

    feats = list(layer.features(op))
    if backend in VLLM_BACKENDS:
        feats.append(f"paged_kv:{VLLM_BLOCK}")
    return Case(arch=arch, backend=backend, op=op, dtype=dtype, head_dim=layer.head_dim,
                head_dim_v=layer.head_dim_v, features=tuple(feats))


def profile_of(backend: str, op: str, layer: Layer | None = None) -> str:
    """The call a backend's timed rows ran, as they record it (`profile`): vLLM's for its backends, a decode step
    padded to the captured batch it replays (kernels/vllm_fa.py `graph_batch`: decode alone), with FA3's split
    bound and planned schedule as vLLM's step sets them for the layer's model. One call, one text: a backend
    re-timed in another profile ranks by that profile's timings alone (`workloads.latest_calls`)."""
    if backend not in VLLM_BACKENDS:
        return "library API, contiguous KV"
    from attnmatrix.kernels.vllm_fa import GRAPH_TOKENS, SPLIT_BOUND

    call = f"vllm: varlen q, block_table (block {VLLM_BLOCK}) + seqused_k"
    if op == "decode":
        call += f"; a decode step of up to {GRAPH_TOKENS} sequences padded to vLLM's captured batch with empty ones"
    if backend == "vllm_fa3":
        plan = ("scheduler_metadata planned ahead" if layer is None or layer.one_window_size
                else "no scheduler_metadata (the model's layers have several windows)")
        call += f"; num_splits {SPLIT_BOUND} up to {GRAPH_TOKENS} tokens a step, {plan}"
    return call


def shape_for(layer: Layer, op: str, batch: int, length: int, name: str | None = None):
    from attnmatrix.kernels.problem import WINDOW, Shape

    sq = 1 if op == "decode" else length
    return Shape(name or bucket_label(op, batch, length), batch, sq, length, layer.heads_q, layer.heads_kv,
                 window=layer.window or WINDOW)


def _check(backend, case, layer: Layer, op: str) -> tuple[str, str | None, str | None]:
    """(outcome, reason, entry) of the backend on the matrix's validation shape of the op (its window cuts most
    of a row) with the layer's head counts, and the layer's window where that is narrower still; decode one
    sequence past it (5), a batch vLLM's step pads to its captured 8 with empty sequences (kernels/vllm_fa.py
    `graph_batch`), so the padded call is the one checked."""
    from dataclasses import replace

    import torch
    from attnmatrix.kernels.probe import _message, _raised_by_library, device_fault
    from attnmatrix.kernels.problem import Unsupported, make_problem
    from attnmatrix.kernels.reference import compare, reference_attention
    from attnmatrix.matrix.shapes import VALIDATION_SHAPES

    val = VALIDATION_SHAPES[op]
    shape = replace(val, heads_q=layer.heads_q, heads_kv=layer.heads_kv,
                    window=min(val.window, layer.window or val.window), batch=val.batch + (op == "decode"))
    p = replace(make_problem(case, shape, device=backend.device, seed=0), one_window_size=layer.one_window_size)
    entry = backend.entry(case)
    try:
        out = backend.prepare(p)()
        if backend.device == "cuda":
            torch.cuda.synchronize()
    except Unsupported as e:
        return "rejected", f"attnmatrix: the API cannot express this case: {e}", entry
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        if device_fault(e):
            raise
        return ("rejected" if _raised_by_library(e) else "crash"), _message(e, 400), entry
    err = compare(p, out, reference_attention(p))
    if not err["ok"]:
        return "wrong", f"max abs error {err['max_abs_err']} ({err['mismatched']} of {err['elements']} off)", entry
    return "pass", None, entry


def copies_of(case, shape, device: str) -> list:
    """The problem at `shape`, in as many copies (seeds 1, 2, ...) as make back-to-back calls each find their
    inputs out of the L2 cache (kernels/interleaved_timing.py `l2_copies`): an engine calls a layer's attention on that
    layer's own cache, not on what the call before left in L2."""
    from attnmatrix.kernels.interleaved_timing import l2_copies
    from attnmatrix.kernels.problem import make_problem

    first = make_problem(case, shape, device=device, seed=1, draw_on_device=True)
    n = l2_copies(sum(t.numel() * t.element_size() for t in (first.q, first.k, first.v))) if device == "cuda" else 1
    return [first] + [make_problem(case, shape, device=device, seed=1 + i, draw_on_device=True) for i in range(1, n)]


def time_workload(backends: dict, layer: Layer, op: str, same_layers: list[str], arch: str, device: str,
                  device_name: str, emit, args: argparse.Namespace,
                  points: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]) -> int:
    """Check every backend on the layer, then time those that passed at every point, in turns on one problem
    (`measure_interleaved`). `points`: ((set, ((batch, length), ...)), ...). Returns 3 after a device fault (the
    process cannot go on), else 0."""
    from attnmatrix.kernels.interleaved_timing import measure_interleaved
    from attnmatrix.kernels.probe import _message, device_fault

    passed = {}
    for name, backend in backends.items():
        case = case_for(layer, op, name, arch, getattr(args, "dtype", DTYPE))
        base = {"backend": name, "kernel_version": backend.version(), "layer": layer.name, "layers": same_layers,
                "op": op, "case": case.key, "heads_q": layer.heads_q, "heads_kv": layer.heads_kv,
                "profile": profile_of(name, op, layer), "device": device_name, "arch": arch}
        why = backend.availability()
        if why:
            emit({**base, "set": "check", "outcome": "unavailable", "reason": why})
            continue
        outcome, reason, entry = _check(backend, case, layer, op)
        emit({**base, "set": "check", "outcome": outcome, "reason": reason, "entry": entry})
        if outcome == "pass":
            passed[name] = (backend, case, {**base, "entry": entry})
    for kind, at in points:
        for batch, length in at:
            fns, rows = {}, {}
            problems: list = []
            try:
                for name, (backend, case, base) in passed.items():
                    rows[name] = {**base, "set": kind, "batch": batch, "length": length}
                    try:
                        if not problems:  # the same inputs for every backend, allocated once
                            problems = copies_of(case, shape_for(layer, op, batch, length), device)
                        fn = prepare_calls(backend, case, layer, problems)
                        first_calls(fn)
                        fns[name] = fn
                    except Exception as e:  # noqa: BLE001 - a point not timed is noted
                        emit({**rows[name], "outcome": "untimed", "reason": _message(e, 300)})
                        if device_fault(e):
                            return 3
                if args.warm_only or not fns:
                    continue
                try:
                    timed = measure_interleaved(fns, device=device, rounds=args.rounds)
                except Exception as e:  # noqa: BLE001 - the point is noted as not timed for every backend
                    for name in fns:
                        emit({**rows[name], "outcome": "untimed", "reason": _message(e, 300)})
                    if device_fault(e):
                        return 3
                    continue
                for name, m in timed.items():
                    emit({**rows[name], "outcome": "pass", "ms": round(m.ms, 5), "method": m.method,
                          "calls": m.calls, "copies": len(problems), "rounds": [round(x, 5) for x in m.rounds_ms],
                          "note": m.note})
            finally:
                del fns, problems
                release(device)
    return 0


def prepare_calls(backend, case, layer: Layer, problems: list) -> list:
    """The backend's call on each copy of a point's problem, in the layer's call (its cache's page size, its
    window)."""
    from dataclasses import replace

    return [backend.prepare(replace(p, case=case, page_size=case.page_size, one_window_size=layer.one_window_size))
            for p in problems]


def first_calls(fns: list) -> None:
    """Each call once: the first compiles (FA4's JIT), and each proves the call runs at this shape."""
    for f in fns:
        f()


def release(device: str) -> None:
    """Give a point's memory back to the device before the next: the grid's largest points need most of it."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
