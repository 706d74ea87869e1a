"""The generated vLLM-shaped module (`attnmatrix/engines/vllm/selection.py`): vLLM's own function names and
parameters, answered by the one query engine over the selector's data and vLLM's call profile.

The call profile (`matrix/data/vllm/vllm-<version>-profile.json`) holds the declared facts, each cited to the
release's source, for what the matrix has no axis for: configuration inputs a kernel refuses, the page size vLLM
feeds a kernel, the block-size multiple it advertises, and its MLA prefill names with the archs each accepts.
The query logic is `attnmatrix.selector_vllm.EngineProfile`; the template only binds vLLM's signatures to it.
"""

from __future__ import annotations

import pprint
from pathlib import Path

from attnmatrix.generator import render as R
from attnmatrix.matrix.policy import ResolvedMatrix

from .answers import read_schema_doc
from .names import DATA_DIR, PINNED_VLLM

MODULE_PATH = "attnmatrix/engines/vllm/selection.py"
TEMPLATES = Path(__file__).parent / "templates"
PROFILE_SCHEMA = "attnmatrix-engine-profile/1"
# The keys of a profile and of each of its records, as EngineProfile reads them.
PROFILE_FIELDS = ("schema", "engine", "version", "config_inputs", "config_refusals", "kernel_pages",
                  "block_size_multiple", "mla_prefill_names")
RECORD_FIELDS = {
    "config_refusals": ("id", "backend", "archs", "head_dims", "inputs", "statement", "sources"),
    "kernel_pages": ("id", "backend", "archs", "head_dims", "page_size", "statement", "sources"),
    "mla_prefill_names": ("name", "archs", "sources"),
}
# vLLM's KV cache dtypes that are not quantized (vllm/v1/kv_cache_interface.py get_kv_quant_mode: "auto" and
# the model dtypes); any other cache dtype is a quantized KV cache.
UNQUANTIZED_KV_CACHE_DTYPES = (None, "auto", "bfloat16", "float16", "half")


class ProfileError(ValueError):
    """A call-profile file that cannot be used; the message names the file, record and field."""


def profile_file(data_dir: str | Path) -> Path:
    return Path(data_dir) / "vllm" / f"vllm-{PINNED_VLLM}-profile.json"


def load_profile(path: str | Path) -> dict:
    """Read and check a call profile (ProfileError names the file, record and field that is wrong)."""
    p = Path(path)
    doc = read_schema_doc(p, PROFILE_SCHEMA, "call profile", ProfileError)
    missing = [k for k in PROFILE_FIELDS if k not in doc]
    if missing:
        raise ProfileError(f"{p}: missing fields {', '.join(missing)}")
    for kind, fields in RECORD_FIELDS.items():
        if not isinstance(doc[kind], list):
            raise ProfileError(f"{p}: {kind}: not a list")
        for i, r in enumerate(doc[kind]):
            lack = [f for f in fields if not isinstance(r, dict) or f not in r]
            if lack:
                raise ProfileError(f"{p}: {kind}[{i}]: missing {', '.join(lack)}")
            if not r["sources"]:
                raise ProfileError(f"{p}: {kind}[{i}] ({r.get('id', r.get('name'))}): sources: empty (cite one)")
    if not isinstance(doc["config_inputs"], dict):
        raise ProfileError(f"{p}: config_inputs: not an object (input name -> what it means)")
    for i, r in enumerate(doc["config_refusals"]):
        unknown = [x for x in r["inputs"] if x not in doc["config_inputs"]]
        if unknown:
            raise ProfileError(f"{p}: config_refusals[{i}] ({r['id']}): inputs: {', '.join(map(str, unknown))} "
                               "not in config_inputs")
    for i, r in enumerate(doc["kernel_pages"]):
        if not isinstance(r["page_size"], int) or isinstance(r["page_size"], bool) or r["page_size"] < 1:
            raise ProfileError(f"{p}: kernel_pages[{i}] ({r['id']}): page_size: {r['page_size']!r} is not a size")
    block = doc["block_size_multiple"]
    if not isinstance(block, dict) or not isinstance(block.get("value"), int) or block["value"] < 1:
        raise ProfileError(f"{p}: block_size_multiple: value: not a positive int")
    return doc


def default_profile() -> dict:
    return load_profile(profile_file(DATA_DIR))


def _data(doc: dict) -> dict:
    """The profile as the generated module's PROFILE: what EngineProfile reads, sources kept beside each fact."""
    return {k: doc[k] for k in PROFILE_FIELDS if k != "schema"}


def render_module(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """{MODULE_PATH: text}. The profile: meta["vllm_profile"] (a path; the checkout's own) or the package's."""
    path = meta.get("vllm_profile")
    doc = load_profile(path) if path else default_profile()
    data = _data(doc)
    text = R.python_env(TEMPLATES).get_template("selection.py.j2").render(
        h=R.header(m, meta), version=data["version"], unquantized=UNQUANTIZED_KV_CACHE_DTYPES,
        profile=R.Raw(pprint.pformat(data, width=116, sort_dicts=False)),
        profile_path=f"matrix/data/vllm/{profile_file('.').name}")
    return {MODULE_PATH: text}
