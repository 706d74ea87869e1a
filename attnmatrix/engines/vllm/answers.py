"""The committed answers of a pinned vLLM release (`matrix/data/vllm/vllm-<version>-answers.json`).

`attnmatrix vllm-answers` writes them (the oracle, `oracle.py`, runs the release's own selection code);
everything else reads them here: `load_answers` checks the file and indexes it, `write_answers` writes it
atomically as stable text. Nothing here executes vLLM code.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANSWERS_SCHEMA = "attnmatrix-vllm-answers/1"
ANSWERS_DIR = "matrix/data/vllm"


def answers_path(version: str) -> str:
    return f"{ANSWERS_DIR}/vllm-{version}-answers.json"


class OracleError(RuntimeError):
    """vLLM's code asked for something the oracle does not provide, or the release/answers file is unusable."""


def cap_text(c: tuple[int, int]) -> str:
    """(9, 0) -> "9.0", as the answers file writes a capability."""
    return f"{c[0]}.{c[1]}"


def parse_capability(s: str) -> tuple[int, int]:
    """"9.0" -> (9, 0)."""
    major, _, minor = s.partition(".")
    return int(major), int(minor)


def fa_params(features: Iterable[str]) -> dict:
    """The get_flash_attn_version arguments a matrix feature set stands for (the others do not enter it)."""
    from attnmatrix.matrix.cases import feature_name

    names = {feature_name(f): f for f in features}
    block = names.get("paged_kv")
    return {"requires_alibi": "alibi" in names, "has_sinks": "sinks" in names,
            "requires_softcap": "softcap" in names,
            "kv_cache_block_size": int(block.partition(":")[2]) if block else None}


def backend_params(features: Iterable[str]) -> dict:
    """The inputs of vLLM's attention backend choice a matrix feature set stands for: sinks, a sliding window,
    a paged-KV block size (as if given with --block-size), and an fp8 KV cache for an fp8 cell (vLLM's fp8 is a
    KV-cache dtype; the matrix's fp8 cells are fp8 Q, K and V). ALiBi and softcap do not enter the choice (they
    enter get_flash_attn_version)."""
    from attnmatrix.matrix.cases import feature_name

    names = {feature_name(f): f for f in features}
    block = names.get("paged_kv")
    return {"has_sink": "sinks" in names, "has_sliding_window": "sliding_window" in names,
            "block_size": int(block.partition(":")[2]) if block else None,
            "kv_cache_dtype": "fp8" if "fp8" in names else "auto"}


# --- the answers file ---------------------------------------------------------------------------------------

def dumps_answers(doc: dict) -> str:
    """Stable text: sorted keys, one answer per line, so one changed answer changes one line."""
    keys = sorted(doc)
    lines = ["{"]
    for i, k in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        v = doc[k]
        if isinstance(v, list):
            lines.append(f"  {json.dumps(k)}: [")
            lines += [f"    {json.dumps(r, sort_keys=True, ensure_ascii=False)}" + ("," if j < len(v) - 1 else "")
                      for j, r in enumerate(v)]
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def is_answers_file(path: str | os.PathLike) -> bool:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("schema") == ANSWERS_SCHEMA


def write_answers(doc: dict, path: str | os.PathLike) -> bool:
    """Atomic write. Refuses (OracleError) to replace a file that is not an answers file. True if changed."""
    from attnmatrix.matrix.storage import atomic_write_text

    p = Path(path)
    if p.exists() and not is_answers_file(p):
        raise OracleError(f"{p}: exists and is not a vLLM answers file (schema {ANSWERS_SCHEMA}); not replacing it")
    return atomic_write_text(p, dumps_answers(doc))


@dataclass(frozen=True)
class Answers:
    """A committed answers file, indexed for lookups."""

    path: str
    doc: dict

    @property
    def version(self) -> str:
        return self.doc["vllm"]["version"]

    def fa(self, capability: tuple[int, int], head_size: int, head_size_v: int, **params: Any) -> dict | None:
        return self._fa.get((cap_text(capability), head_size, head_size_v, params.get("requires_alibi", False),
                             params.get("has_sinks", False), params.get("requires_softcap", False),
                             params.get("kv_cache_block_size")))

    def mla(self, capability: tuple[int, int], dims: tuple[int, int, int], dtype: str) -> dict | None:
        return self._mla.get((cap_text(capability), tuple(dims), dtype))

    def backend(self, capability: tuple[int, int], head_size: int, dtype: str, **params: Any) -> dict | None:
        """The recorded attention backend choice (None where the file has none: an older answers file, or a
        question outside the recorded space)."""
        return self._backend.get((cap_text(capability), head_size, dtype, params.get("has_sink", False),
                                  params.get("has_sliding_window", False), params.get("block_size"),
                                  params.get("kv_cache_dtype", "auto")))

    # The indexes are built on first use and kept: the comparison pages look up thousands of questions.
    @functools.cached_property
    def _backend(self) -> dict:
        return {(r["capability"], r["head_size"], r["dtype"], r["has_sink"], r["has_sliding_window"], r["block_size"],
                 r["kv_cache_dtype"]): r for r in self.doc.get("attention_backend", [])}

    @functools.cached_property
    def _fa(self) -> dict:
        return {(r["capability"], r["head_size"], r["head_size_v"], r["requires_alibi"], r["has_sinks"],
                 r["requires_softcap"], r["kv_cache_block_size"]): r for r in self.doc["flash_attn_version"]}

    @functools.cached_property
    def _mla(self) -> dict:
        return {(r["capability"], tuple(r["dims"]), r["dtype"]): r for r in self.doc["mla_prefill"]}


REQUIRED = {"schema", "vllm", "executed_files", "flash_attn_version", "mla_prefill"}
FA_FIELDS = {"capability", "head_size", "head_size_v", "requires_alibi", "has_sinks", "requires_softcap",
             "kv_cache_block_size", "version", "log"}
MLA_FIELDS = {"capability", "dims", "dtype", "priorities", "refused", "backend", "fa_version", "pads_v", "log"}
BACKEND_FIELDS = {"capability", "head_size", "dtype", "has_sink", "has_sliding_window", "block_size", "kv_cache_dtype",
                  "priorities", "refused", "backend", "log"}


def read_schema_doc(path: str | os.PathLike, schema: object, what: str, error: type[Exception]) -> dict:
    """A JSON document of ours at `path` whose "schema" is `schema`; `error` names the file and what is wrong."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise error(f"{p}: unreadable {what}: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise error(f"{p}: schema is not {schema}")
    return doc


def load_answers(path: str | os.PathLike) -> Answers:
    """Read and check an answers file; OracleError names the file, record and field that is wrong."""
    p = Path(path)
    doc = read_schema_doc(p, ANSWERS_SCHEMA, "vLLM answers file", OracleError)
    missing = REQUIRED - set(doc)
    if missing:
        raise OracleError(f"{p}: missing fields {', '.join(sorted(missing))}")
    if not isinstance(doc.get("attention_backend", []), list):
        raise OracleError(f"{p}: attention_backend: expected a list")
    for kind, fields in (("flash_attn_version", FA_FIELDS), ("mla_prefill", MLA_FIELDS),
                         ("attention_backend", BACKEND_FIELDS)):
        for i, r in enumerate(doc.get(kind, [])):
            if not isinstance(r, dict) or fields - set(r):
                lack = sorted(fields - set(r)) if isinstance(r, dict) else ["(not an object)"]
                raise OracleError(f"{p}: {kind}[{i}]: missing {', '.join(lack)}")
    return Answers(str(p), doc)
