"""`attnmatrix explain --model NAME [--tp N]`: the query answer for each attention layer type of a model preset.

Each layer type of the preset (matrix/models.py, matrix/data/models.json) becomes the vocabulary's query for each
op it runs, at the heads one GPU runs under the tensor-parallel split; every answer comes from the query engine
through the generator's query seam (`generator.tables.query`), exactly as `explain --head-size ...` asks it. With
batch or length hints, each layer type's query carries them with that layer's own head counts per GPU as the
engine's workload hints (cli/workload_hints.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from attnmatrix.matrix.models import MODELS_FILE, Model, ModelError, load_models
from attnmatrix.matrix.policy import ResolvedMatrix
from attnmatrix.vocabulary import SUPPORTED

from .common import UsageError
from .engine_names import add_names, order_line
from .workload_hints import add_hints, bucket_notes, hints_for_op, hints_line


def models_file(data_dir: Path) -> Path:
    """The checkout's models file, else the package's."""
    p = data_dir / MODELS_FILE.name
    return p if p.exists() else MODELS_FILE


def load_model(name: str, data_dir: Path) -> Model:
    try:
        models = load_models(models_file(data_dir))
    except ModelError as e:
        raise click.ClickException(str(e)) from None
    if name not in models:
        raise UsageError(f"--model: no preset {name!r} (known: {', '.join(models)})")
    return models[name]


def _answer_json(a) -> dict:
    return {"status": a.status, "tier": a.tier, "latency_ms": a.latency_ms, "basis": a.basis,
            "reasons": list(a.reasons), "composed_of": [c.case.key for c in a.cells] if len(a.cells) > 1 else [],
            "ranked_on_fewer_shapes": a.marked}


def model_answers(m: ResolvedMatrix, model: Model, tp: int, arch: str, dtype: str, op: str | None,
                  hints: dict[str, int] | None = None, engine: str | None = None) -> dict:
    """Per layer type and op: the query, the engine's order and every backend's answer with its reasons.
    `hints`: batch and length workload hints; each layer adds its own head counts per GPU to them. `engine`:
    each answer also in that inference engine's names (cli/engine_names.py)."""
    from attnmatrix.generator import tables as T
    from attnmatrix.generator.capabilities import engine_for

    layers = []
    for ly in model.layers:
        q_heads, kv_heads = ly.per_rank(tp)
        queries = []
        for layer_op in ly.ops():
            if op is not None and layer_op != op:
                continue
            q = T.make_query(arch, ly.head_dim, ly.head_dim_v, op=layer_op, dtype=dtype,
                             **ly.query_params(layer_op, tp))
            layer_hints = hints_for_op(hints or {}, layer_op)
            if layer_hints:
                layer_hints = {"num_heads": q_heads, "num_kv_heads": kv_heads, **layer_hints}
            ordered, answers = T.query(m, q, layer_hints)
            answer = {"op": layer_op, "dtype": dtype, "head_size": q.head_dim, "head_size_v": q.head_dim_v,
                      "features": list(q.features), "order": [a.backend for a in ordered],
                      "backends": {a.backend: _answer_json(a) for a in answers}}
            add_hints(answer, layer_hints, bucket_notes(engine_for(m), arch, layer_op, dtype, q.head_dim,
                                                        q.head_dim_v, q.features, layer_hints))
            add_names(answer, engine_for(m), engine, layer_op)
            if hints and not layer_hints:  # the hints given are another op's (a length of decode, here prefill)
                answer["workload_hints"] = {"given": {}, "bucket_applies": False}
            queries.append(answer)
        layers.append({"type": ly.type, "count": ly.count, "heads_per_gpu": [q_heads, kv_heads],
                       "describe": ly.describe(tp), "queries": queries})
    return {"model": model.name, "family": model.family, "config": model.citation, "source": model.source,
            "tp": tp, "typical_tp": model.tp, "arch": arch, "note": model.note, "layers": layers}


def echo_model_answers(result: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False))
        return
    click.echo(f"model {result['model']} ({result['family']}): {result['config']}, {result['source']}")
    tp_note = "its typical split" if result["tp"] == result["typical_tp"] else f"typical {result['typical_tp']}"
    click.echo(f"arch {result['arch']}, tensor parallel {result['tp']} ({tp_note})")
    if result["note"]:
        click.echo(f"note: {result['note']}")
    for ly in result["layers"]:
        click.echo(f"\nlayer type {ly['type']}: {ly['describe']}")
        if not ly["queries"]:
            click.echo("  (runs none of the asked ops)")
        for q in ly["queries"]:
            dims = str(q["head_size"]) if q["head_size"] == q["head_size_v"] else f"{q['head_size']}x{q['head_size_v']}"
            click.echo(f"  {q['op']} {q['dtype']} head {dims} features {'+'.join(q['features']) or 'none'}")
            backends = q["backends"]
            if not backends:
                click.echo(f"    no evidence at all for {result['arch']}: nothing can be recommended")
                continue
            click.echo("    order: " + (", ".join(q["order"]) or "(no supported backend)"))
            if "names" in q:
                click.echo("    " + order_line(q["names"]))
            if "workload_hints" in q:
                hints = q["workload_hints"]
                click.echo("    " + hints_line(hints["given"], hints["bucket_applies"]))
            for b in q["order"]:
                a = backends[b]
                composed = f"; composed of {len(a['composed_of'])} cells" if a["composed_of"] else ""
                click.echo(f"    {b} [{a['tier']}]: {a['basis']}{composed}")
                if "bucket" in a:
                    click.echo(f"      {a['bucket']}")
            for b in sorted(b for b, a in backends.items() if a["status"] != SUPPORTED):
                a = backends[b]
                click.echo(f"    not {b} [{a['status']}, {a['tier'] or 'no evidence'}]: "
                           + ("; ".join(a["reasons"]) or a["status"]))
