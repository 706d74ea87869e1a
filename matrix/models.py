"""Model presets: real models' attention layers, each cited to its published config (matrix/data/models.json).

A preset is a model's attention layer types (Gemma's local and global layers, gpt-oss's banded and full
layers, DeepSeek's MLA layers ...), each with its head counts, head dims, window, softcap, sinks and MLA
dims, and the model's published Hugging Face config it was read from (`repo`, `file`, `config`: the
attention fields with their published names and values). Loading checks every layer type against that
config (heads, head dims, window, softcap, MLA dims, how many layers of each type), so a preset that
disagrees with its citation is refused, not used.

A layer type answers the query the selector is asked for it (`ops`, `query_params`): the vocabulary's query
parameters, so `attnmatrix explain --model` and the workload buckets ask the one query engine exactly what a
hand-written query would. `per_rank(tp)` gives the heads one GPU runs under a tensor-parallel split.
Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnmatrix.vocabulary import MAX_HEAD_DIM

MODELS_FILE = Path(__file__).parent / "data" / "models.json"
SCHEMA = 1
MLA_TYPE = "mla"


class ModelError(ValueError):
    """A models file, model or layer that cannot be used; the message names the file, the model and the field."""


def layer_ops(qk_rope: int | None) -> tuple[str, ...]:
    """The ops of the matrix a layer runs: MLA layers' prefill attention (the matrix has no latent-space MLA
    decode op), every other layer's prefill and decode."""
    return ("mla_prefill",) if qk_rope is not None else ("prefill", "decode")


def call_params(op: str, heads_q: int, heads_kv: int, *, sliding_window: int | None, softcap: float | None,
                sinks: bool, qk_rope: int | None) -> dict[str, Any]:
    """The vocabulary's query parameters of one layer's `op` call on one GPU (its heads there): causal like every
    decoder, plus the layer's window, softcap and sinks, grouped-query attention where the KV heads are fewer
    than the query heads, and the MLA rope split. The one rule for a model layer's query: `LayerType.query_params`
    (explain --model, the docs' model queries) and `workloads.Layer.features` (the workload sweep's cases)."""
    if op not in layer_ops(qk_rope):
        raise ModelError(f"a layer {'with' if qk_rope is not None else 'without'} MLA dims runs "
                         f"{' and '.join(layer_ops(qk_rope))}, not {op}")
    params: dict[str, Any] = {"causal": True}
    if sliding_window:
        params["sliding_window"] = True
    if softcap:
        params["softcap"] = True
    if sinks:
        params["sinks"] = True
    if qk_rope is not None:
        params["qk_rope"] = qk_rope
    elif heads_kv < heads_q:
        params["gqa"] = True
    return params


@dataclass(frozen=True)
class LayerType:
    """One attention layer type of a model: what every layer of that type computes (whole model, before any
    tensor-parallel split)."""

    type: str  # "full", "local", "global", "sliding", "mla"
    count: int  # layers of this type
    num_heads: int
    num_kv_heads: int
    head_dim: int  # query/key head size (MLA: qk_nope + qk_rope)
    head_dim_v: int
    sliding_window: int | None = None  # tokens; local layers only
    softcap: float | None = None  # attention-logit soft cap
    sinks: bool = False  # learned attention sinks
    qk_nope_head_dim: int | None = None  # MLA
    qk_rope_head_dim: int | None = None  # MLA
    kv_lora_rank: int | None = None  # MLA

    @property
    def is_mla(self) -> bool:
        return self.qk_rope_head_dim is not None

    def ops(self) -> tuple[str, ...]:
        return layer_ops(self.qk_rope_head_dim)

    def per_rank(self, tp: int) -> tuple[int, int]:
        """(query heads, KV heads) on one GPU under a tensor-parallel split of `tp`: query heads divide, KV heads
        divide or, when there are fewer than `tp`, are replicated (one per GPU)."""
        return self.num_heads // tp, max(1, self.num_kv_heads // tp)

    def query_params(self, op: str, tp: int = 1) -> dict[str, Any]:
        """The vocabulary's query parameters for this layer's `op` call on one GPU under a tensor-parallel split of
        `tp` (`generator.tables.make_query(...)`, `select_backends(...)`): `call_params`."""
        if op not in self.ops():
            raise ModelError(f"layer type {self.type!r} runs {' and '.join(self.ops())}, not {op}")
        return call_params(op, *self.per_rank(tp), sliding_window=self.sliding_window, softcap=self.softcap,
                           sinks=self.sinks, qk_rope=self.qk_rope_head_dim)

    def describe(self, tp: int = 1) -> str:
        q, kv = self.per_rank(tp)
        dims = str(self.head_dim) if self.head_dim == self.head_dim_v else f"{self.head_dim}x{self.head_dim_v}"
        bits = [f"{self.count} layer(s)", f"{q} query / {kv} KV heads" + (f" per GPU at tp={tp}" if tp > 1 else ""),
                f"head dim {dims}"]
        if self.sliding_window:
            bits.append(f"window {self.sliding_window}")
        if self.softcap:
            bits.append(f"softcap {self.softcap:g}")
        if self.sinks:
            bits.append("sinks")
        if self.is_mla:
            bits.append(f"MLA qk_nope {self.qk_nope_head_dim} + qk_rope {self.qk_rope_head_dim}, v {self.head_dim_v}, "
                        f"kv_lora_rank {self.kv_lora_rank}")
        return ", ".join(bits)


@dataclass(frozen=True)
class Model:
    """A model preset and the published config it was read from."""

    name: str
    family: str
    repo: str  # the Hugging Face repository id
    file: str  # config.json
    source: str  # the file's address
    config: dict[str, Any]  # the attention fields of the file, as published
    tp: int  # a typical tensor-parallel split
    layers: tuple[LayerType, ...]
    section: str | None = None  # the nested object of the file holding the values (text_config)
    class_defaults: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def citation(self) -> str:
        where = f"{self.file} ({self.section})" if self.section else self.file
        return f"{self.repo} {where}"

    def check_tp(self, tp: int) -> int:
        """`tp` if every layer type splits over it (query heads divide; KV heads divide or are replicated)."""
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ModelError(f"model {self.name!r}: tp {tp!r} is not a positive integer")
        for ly in self.layers:
            if ly.num_heads % tp or (ly.num_kv_heads % tp and tp % ly.num_kv_heads):
                raise ModelError(f"model {self.name!r}: layer type {ly.type!r} has {ly.num_heads} query / "
                                 f"{ly.num_kv_heads} KV heads, which do not split over tp={tp}")
        return tp


# --- reading and checking -----------------------------------------------------------------------------------

LAYER_FIELDS = {"type", "count", "num_heads", "num_kv_heads", "head_dim", "head_dim_v", "sliding_window", "softcap",
                "sinks", "qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank"}
MODEL_FIELDS = {"family", "repo", "file", "source", "section", "config", "class_defaults", "tp", "layers", "note"}
MLA_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")


def _positive(v: object, where: str, *, upper: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1 or (upper is not None and v > upper):
        bound = f" (at most {upper})" if upper else ""
        raise ModelError(f"{where}: expected a positive integer{bound}, got {v!r}")
    return v


def _check_fields(d: object, known: set[str], where: str) -> None:
    """`d` is an object whose every field is one of `known`."""
    if not isinstance(d, dict):
        raise ModelError(f"{where}: expected an object, got {d!r}")
    unknown = set(d) - known
    if unknown:
        raise ModelError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (known: "
                         f"{', '.join(sorted(known))})")


def _layer(d: object, where: str) -> LayerType:
    _check_fields(d, LAYER_FIELDS, where)
    if not isinstance(d.get("type"), str) or not d["type"]:
        raise ModelError(f"{where}.type: expected a name, got {d.get('type')!r}")
    ints = {k: _positive(d.get(k), f"{where}.{k}", upper=MAX_HEAD_DIM if k == "head_dim" else None)
            for k in ("count", "num_heads", "num_kv_heads", "head_dim")}
    hdv = _positive(d.get("head_dim_v", ints["head_dim"]), f"{where}.head_dim_v", upper=MAX_HEAD_DIM)
    window = d.get("sliding_window")
    if window is not None:
        window = _positive(window, f"{where}.sliding_window")
    softcap = d.get("softcap")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise ModelError(f"{where}.softcap: expected a positive number, got {softcap!r}")
    if not isinstance(d.get("sinks", False), bool):
        raise ModelError(f"{where}.sinks: expected true or false, got {d['sinks']!r}")
    mla = {k: d.get(k) for k in MLA_FIELDS}
    is_mla = d["type"] == MLA_TYPE
    if is_mla:
        for k in MLA_FIELDS:
            _positive(mla[k], f"{where}.{k}")
        if mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] != ints["head_dim"]:
            raise ModelError(f"{where}.head_dim: {ints['head_dim']} is not qk_nope_head_dim + qk_rope_head_dim "
                             f"({mla['qk_nope_head_dim']} + {mla['qk_rope_head_dim']})")
    elif any(v is not None for v in mla.values()):
        raise ModelError(f"{where}: MLA dims on a layer whose type is not {MLA_TYPE!r}")
    if ints["num_heads"] % ints["num_kv_heads"]:
        raise ModelError(f"{where}: {ints['num_heads']} query heads are not a multiple of {ints['num_kv_heads']} "
                         "KV heads")
    return LayerType(d["type"], ints["count"], ints["num_heads"], ints["num_kv_heads"], ints["head_dim"], hdv,
                     window, float(softcap) if softcap is not None else None, bool(d.get("sinks", False)),
                     mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["kv_lora_rank"])


def _check_against_config(m: Model, where: str) -> None:
    """Every layer type's values must be the cited config's (or its class defaults')."""
    cfg = {**{k: v for k, v in m.class_defaults.items() if k != "from"}, **m.config}

    def need(key: str) -> Any:
        if key not in cfg:
            raise ModelError(f"{where}.config: no {key!r}, which the layer types need to be checked against")
        return cfg[key]

    def same(ly: LayerType, what: str, have: object, key: str, want: object) -> None:
        if have != want:
            raise ModelError(f"{where}: layer type {ly.type!r} {what} {have!r} disagrees with {m.citation} "
                             f"{key} = {want!r}")

    total = need("num_hidden_layers")
    if sum(ly.count for ly in m.layers) != total:
        raise ModelError(f"{where}: layer counts add up to {sum(ly.count for ly in m.layers)}, {m.citation} has "
                         f"num_hidden_layers = {total}")
    heads = need("num_attention_heads")
    for ly in m.layers:
        same(ly, "num_heads", ly.num_heads, "num_attention_heads", heads)
        if ly.is_mla:
            for k in MLA_FIELDS:
                same(ly, k, getattr(ly, k), k, need(k))
            same(ly, "head_dim_v", ly.head_dim_v, "v_head_dim", need("v_head_dim"))
            continue
        same(ly, "num_kv_heads", ly.num_kv_heads, "num_key_value_heads", need("num_key_value_heads"))
        head_dim = cfg["head_dim"] if cfg.get("head_dim") else need("hidden_size") // heads
        same(ly, "head_dim", ly.head_dim, "head_dim" if cfg.get("head_dim") else "hidden_size / heads", head_dim)
        same(ly, "head_dim_v", ly.head_dim_v, "head_dim", head_dim)
        if ly.sliding_window is not None:
            same(ly, "sliding_window", ly.sliding_window, "sliding_window", need("sliding_window"))
        if ly.softcap is not None or cfg.get("attn_logit_softcapping"):
            same(ly, "softcap", ly.softcap, "attn_logit_softcapping", cfg.get("attn_logit_softcapping"))
    windowed = sum(ly.count for ly in m.layers if ly.sliding_window)
    if "layer_types" in cfg:
        want = sum(1 for t in cfg["layer_types"] if t == "sliding_attention")
        if windowed != want:
            raise ModelError(f"{where}: {windowed} windowed layers, {m.citation} layer_types lists {want} "
                             "sliding_attention layers")
    elif "sliding_window_pattern" in cfg:
        want = total - total // need("sliding_window_pattern")
        if windowed != want:
            raise ModelError(f"{where}: {windowed} windowed layers, {m.citation} sliding_window_pattern "
                             f"{cfg['sliding_window_pattern']} over {total} layers gives {want}")
    elif windowed and cfg.get("use_sliding_window") is False:
        raise ModelError(f"{where}: windowed layers, but {m.citation} has use_sliding_window = false")


def _model(name: str, d: object, where: str) -> Model:
    _check_fields(d, MODEL_FIELDS, where)
    for k in ("family", "repo", "file", "source"):
        if not isinstance(d.get(k), str) or not d[k]:
            raise ModelError(f"{where}.{k}: expected a non-empty string, got {d.get(k)!r}")
    if d["repo"].count("/") != 1 or not d["source"].startswith(f"https://huggingface.co/{d['repo']}/"):
        raise ModelError(f"{where}.source: {d['source']!r} is not a file of the Hugging Face repository "
                         f"{d['repo']!r}")
    for k in ("config", "class_defaults"):
        if not isinstance(d.get(k, {}), dict):
            raise ModelError(f"{where}.{k}: expected an object")
    if d.get("class_defaults") and not isinstance(d["class_defaults"].get("from"), str):
        raise ModelError(f"{where}.class_defaults.from: say which config class the defaults come from")
    if not isinstance(d.get("layers"), list) or not d["layers"]:
        raise ModelError(f"{where}.layers: expected a non-empty list of layer types")
    layers = tuple(_layer(ly, f"{where}.layers[{i}]") for i, ly in enumerate(d["layers"]))
    types = [ly.type for ly in layers]
    if len(set(types)) != len(types):
        raise ModelError(f"{where}.layers: a layer type is listed twice ({', '.join(types)})")
    m = Model(name, d["family"], d["repo"], d["file"], d["source"], dict(d.get("config") or {}),
              _positive(d.get("tp", 1), f"{where}.tp"), layers, d.get("section"), dict(d.get("class_defaults") or {}),
              str(d.get("note") or ""))
    _check_against_config(m, where)
    m.check_tp(m.tp)
    return m


def parse_models(doc: object, path: str = "models") -> dict[str, Model]:
    """Models from a models document (see the file's own comment); ModelError names the file, model and field."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ModelError(f"{path}: expected a models document with schema {SCHEMA}")
    models = doc.get("models")
    if not isinstance(models, dict) or not models:
        raise ModelError(f"{path}: models: expected a non-empty object of model presets")
    return {name: _model(name, models[name], f"{path}: models.{name}") for name in sorted(models)}


def load_models(path: str | Path | None = None) -> dict[str, Model]:
    """The presets of a models file (default: the package's matrix/data/models.json), by name."""
    p = Path(path) if path is not None else MODELS_FILE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{p}: unreadable models file: {e}") from e
    return parse_models(doc, str(p))


def get_model(name: str, path: str | Path | None = None) -> Model:
    """One preset by name; ModelError lists the known names when there is none."""
    models = load_models(path)
    if name not in models:
        raise ModelError(f"model {name!r}: no such preset (known: {', '.join(models)})")
    return models[name]
