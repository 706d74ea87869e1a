"""`attnmatrix vllm-patch`: the change a vLLM maintainer would review, replacing vLLM's hand-written FlashAttention
version rules, its MLA prefill priority lists and its FA4 head-size-256 block-size rule with calls into the generated
vLLM-shaped module (`attnmatrix/engines/vllm/selection.py`), vendored into vLLM as `vllm/attnmatrix/`.

The patch is a unified diff against a vLLM source checkout (git-style `a/` and `b/` paths, so `git apply` takes
it). It touches three functions, found by name in the checkout's syntax tree (no vLLM text is stored here):

- `get_flash_attn_version` (vllm/v1/attention/backends/fa_utils.py): after the platform checks, the version
  comes from `selection.get_flash_attn_version`, given the call's arguments and what vLLM reads from its
  configuration (multimodal prefix, R-SWA window, decode context parallelism, the model's softcap, the KV cache
  dtype). The user's `flash_attn_version` and VLLM_BATCH_INVARIANT stay vLLM's own choices: they narrow the
  versions the module may answer, as the installed builds (`is_fa_version_supported`) do.
- `Platform.get_mla_prefill_backend_cls` (vllm/platforms/interface.py): the priority list it walks is
  `selection.get_mla_prefill_backend_priorities`; vLLM's own validation walk is kept.
- `FlashAttentionBackend._get_fa4_hd256_block_size` (vllm/v1/attention/backends/flash_attn.py): the fixed kernel
  block size comes from `selection.get_supported_kernel_block_sizes`.

A checkout whose functions do not have the shape this patch expects is refused (PatchError names the file and
function): the patch is written for the release the call profile describes.
"""

from __future__ import annotations

import ast
import difflib
import importlib
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.generator.render import SELECTOR_MODULES

from . import selection

VENDOR_DIR = "vllm/attnmatrix"
FA_UTILS = "vllm/v1/attention/backends/fa_utils.py"
INTERFACE = "vllm/platforms/interface.py"
FLASH_ATTN = "vllm/v1/attention/backends/flash_attn.py"


class PatchError(ValueError):
    """The checkout is not one this patch is written for; the message names the file and function."""


@dataclass(frozen=True)
class Edit:
    """Replace lines `start`..`end` (1-based, inclusive) of a file with `text`."""

    start: int
    end: int
    text: str


VENDOR_INIT = '''"""attnmatrix's answers for vLLM's attention selection, vendored (https://pypi.org/project/attnmatrix/).

`selection.py` is generated from attnmatrix's evidence matrix (`attnmatrix generate`); `selector.py` holds the
matrix's capability data, `selector_engine.py` the query engine, `selector_vllm.py` vLLM's questions to it,
`vocabulary.py` the names they share. Regenerate rather than edit: `attnmatrix vllm-patch --source .` writes the
update.
"""
'''

# What vLLM's get_flash_attn_version reads from its configuration, as the module's keyword arguments.
FA_CONFIG_HELPER = '''

def _attnmatrix_config(vllm_config: Any) -> dict[str, Any]:
    """What vLLM's configuration says about a model's attention, as attnmatrix's keyword arguments."""
    model_config = vllm_config.model_config if vllm_config is not None else None
    available = [v for v in (2, 3, 4) if is_fa_version_supported(v)]
    requested = (
        vllm_config.attention_config.flash_attn_version
        if vllm_config is not None
        else None
    )
    if requested is not None:
        available = [v for v in available if v == requested]
    if envs.VLLM_BATCH_INVARIANT:
        # FA4 uses batch-shape-dependent scheduling heuristics on SM100+.
        available = [v for v in available if v != 4]
    return dict(
        is_mm_prefix_lm=bool(model_config is not None and model_config.is_mm_prefix_lm),
        rswa_window=model_config.rswa_window if model_config is not None else None,
        decode_context_parallel_size=(
            vllm_config.parallel_config.decode_context_parallel_size
            if vllm_config is not None
            else 1
        ),
        model_softcap=(
            getattr(model_config.hf_text_config, "attn_logit_softcapping", None)
            if model_config is not None
            else None
        ),
        kv_cache_dtype=(
            vllm_config.cache_config.cache_dtype if vllm_config is not None else "auto"
        ),
        available_versions=available,
    )


def get_fa_kernel_page_size(
    head_size: int | None, head_size_v: int | None = None
) -> int | None:
    """The fixed KV cache block size the FlashAttention kernel chosen for these head
    sizes needs, or None when any multiple of its block size will do."""
    from vllm.attnmatrix import selection
    from vllm.config import get_current_vllm_config_or_none

    capability = current_platform.get_device_capability()
    if head_size is None or capability is None:
        return None
    sizes = selection.get_supported_kernel_block_sizes(
        head_size,
        head_size_v,
        capability=(capability.major, capability.minor),
        **_attnmatrix_config(get_current_vllm_config_or_none()),
    )
    return sizes[0] if len(sizes) == 1 and isinstance(sizes[0], int) else None
'''

FA_VERSION_BODY = '''        # The version comes from attnmatrix's evidence for this call and configuration
        # (vllm/attnmatrix/selection.py); the user's flash_attn_version and
        # VLLM_BATCH_INVARIANT narrow the versions it may answer.
        from vllm.attnmatrix import selection
        from vllm.config import get_current_vllm_config_or_none

        fa_version = selection.get_flash_attn_version(
            requires_alibi,
            head_size,
            head_size_v,
            has_sinks,
            requires_softcap,
            kv_cache_block_size,
            supports_fa4_hd256,
            capability=(device_capability.major, device_capability.minor),
            **_attnmatrix_config(get_current_vllm_config_or_none()),
        )
        if fa_version is None:
            logger.warning_once(
                "No FlashAttention version supports this configuration "
                "(attnmatrix: `attnmatrix explain` lists the evidence)."
            )
        return fa_version
'''

MLA_PRIORITIES_BODY = '''        from vllm.attnmatrix import selection
        from vllm.v1.attention.backends.mla.prefill.registry import (
            MLAPrefillBackendEnum,
        )

        device_capability = cls.get_device_capability()
        dims = mla_selector_config.mla_dimensions
        # The order comes from attnmatrix's evidence (vllm/attnmatrix/selection.py).
        priorities = [
            MLAPrefillBackendEnum[name]
            for name in selection.get_mla_prefill_backend_priorities(
                None
                if device_capability is None
                else (device_capability.major, device_capability.minor),
                dims.qk_nope_head_dim,
                dims.qk_rope_head_dim,
                dims.v_head_dim,
            )
        ]
'''

HD256_BLOCK_BODY = '''        # The kernel's fixed block size comes from attnmatrix's evidence
        # (vllm/attnmatrix/selection.py).
        return get_fa_kernel_page_size(head_size, head_size_v)
'''


def _function(tree: ast.Module, path: str, name: str, cls: str | None = None) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise PatchError(f"{path}: no class {cls}")
        scope = found[0].body
    found_fn = [n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found_fn:
        raise PatchError(f"{path}: no function {f'{cls}.' if cls else ''}{name}")
    return found_fn[0]


def _end(node: ast.stmt) -> int:
    assert node.end_lineno is not None
    return node.end_lineno


def _is_assign_to(node: ast.stmt, name: str) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def fa_utils_edits(source: str) -> list[Edit]:
    tree = ast.parse(source)
    fn = _function(tree, FA_UTILS, "get_flash_attn_version")
    tries = [n for n in fn.body if isinstance(n, ast.Try)]
    if len(tries) != 1:
        raise PatchError(f"{FA_UTILS}: get_flash_attn_version: expected one try block, found {len(tries)}")
    body = tries[0].body
    asserts = [i for i, n in enumerate(body) if isinstance(n, ast.Assert)]
    if not asserts or not isinstance(body[-1], ast.Return):
        raise PatchError(f"{FA_UTILS}: get_flash_attn_version: expected the capability assert and a final return")
    first = body[asserts[0] + 1]
    # The helpers go after the function (before the next top-level statement).
    after = tree.body[tree.body.index(fn) + 1]
    defined = {(a.asname or a.name).split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names} | {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    lacking = sorted({"Any", "envs", "current_platform", "is_fa_version_supported"} - defined)
    if lacking:
        raise PatchError(f"{FA_UTILS}: the helpers need {', '.join(lacking)} defined at module level")
    return [Edit(first.lineno, _end(body[-1]), FA_VERSION_BODY),
            Edit(after.lineno, after.lineno - 1, FA_CONFIG_HELPER.lstrip("\n") + "\n\n")]


def interface_edits(source: str) -> list[Edit]:
    tree = ast.parse(source)
    fn = _function(tree, INTERFACE, "get_mla_prefill_backend_cls", cls="Platform")
    body = fn.body
    start = 1 if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    stop = next((i for i, n in enumerate(body) if _is_assign_to(n, "all_invalid_reasons")), None)
    if stop is None or stop <= start:
        raise PatchError(f"{INTERFACE}: Platform.get_mla_prefill_backend_cls: no all_invalid_reasons walk")
    return [Edit(body[start].lineno, _end(body[stop - 1]), MLA_PRIORITIES_BODY + "\n")]


def flash_attn_edits(source: str) -> list[Edit]:
    tree = ast.parse(source)
    fn = _function(tree, FLASH_ATTN, "_get_fa4_hd256_block_size", cls="FlashAttentionBackend")
    body = fn.body
    if len(body) < 2 or not isinstance(body[-1], ast.Return) or not isinstance(body[-2], ast.If):
        raise PatchError(f"{FLASH_ATTN}: FlashAttentionBackend._get_fa4_hd256_block_size: expected the head-size "
                         "lookup, the kernel check and a final return")
    fa_module = FA_UTILS.removesuffix(".py").replace("/", ".")
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == fa_module]
    if not imports:
        raise PatchError(f"{FLASH_ATTN}: no import from {fa_module}")
    imp = imports[0]
    names = sorted({a.name for a in imp.names} | {"get_fa_kernel_page_size"})
    import_text = ("from vllm.v1.attention.backends.fa_utils import (\n"
                   + "".join(f"    {n},\n" for n in names) + ")\n")
    return [Edit(imp.lineno, _end(imp), import_text), Edit(body[-2].lineno, _end(body[-1]), HD256_BLOCK_BODY)]


def apply_edits(source: str, edits: list[Edit]) -> str:
    lines = source.splitlines(keepends=True)
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        lines[e.start - 1:e.end] = e.text.splitlines(keepends=True)
    return "".join(lines)


def vendored_files() -> dict[str, str]:
    """The files the patch adds under vllm/attnmatrix/: the generated module and the vendored selector's
    modules (generator.render.SELECTOR_MODULES: this installation's, which `attnmatrix check` keeps current)."""
    out = {f"{VENDOR_DIR}/__init__.py": VENDOR_INIT}
    mods = [selection, *(importlib.import_module(f"attnmatrix.{name}") for name in SELECTOR_MODULES)]
    for mod in mods:
        out[f"{VENDOR_DIR}/{Path(mod.__file__).name}"] = Path(mod.__file__).read_text(encoding="utf-8")
    return out


def patched_files(source: Path) -> dict[str, tuple[str | None, str]]:
    """{path: (text in the checkout or None for a new file, patched text)}."""
    source = Path(source)
    out: dict[str, tuple[str | None, str]] = {}
    for path, edits in ((FA_UTILS, fa_utils_edits), (INTERFACE, interface_edits), (FLASH_ATTN, flash_attn_edits)):
        f = source / path
        if not f.is_file():
            raise PatchError(f"{source}: no {path} (expected a vLLM source checkout)")
        text = f.read_text(encoding="utf-8")
        try:
            out[path] = (text, apply_edits(text, edits(text)))
        except SyntaxError as e:
            raise PatchError(f"{f}: not Python: {e}") from e
    for path, text in vendored_files().items():
        if (source / path).exists():
            out[path] = ((source / path).read_text(encoding="utf-8"), text)
        else:
            out[path] = (None, text)
    return dict(sorted(out.items()))


def unified_diff(files: dict[str, tuple[str | None, str]]) -> str:
    """A git-style unified diff of the changed files."""
    parts: list[str] = []
    for path, (old, new) in files.items():
        if old == new:
            continue
        a = [] if old is None else old.splitlines(keepends=True)
        b = new.splitlines(keepends=True)
        header = [f"diff --git a/{path} b/{path}\n"]
        if old is None:
            header.append("new file mode 100644\n")
        body = list(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{path}", f"b/{path}", n=3))
        for i, line in enumerate(body):
            if not line.endswith("\n"):
                body[i] = line + "\n\\ No newline at end of file\n"
        parts += header + body
    return "".join(parts)


def is_our_patch(path: str | Path) -> bool:
    """Whether `path` holds a patch this module wrote (its first file is the vendored package's __init__)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline() == f"diff --git a/{VENDOR_DIR}/__init__.py b/{VENDOR_DIR}/__init__.py\n"
    except (OSError, UnicodeDecodeError):
        return False


def make_patch(source: str | Path) -> str:
    """The unified diff that makes the vLLM checkout at `source` call the generated module."""
    return unified_diff(patched_files(Path(source)))
