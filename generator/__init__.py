"""The generator: a resolved matrix -> plain tables -> Jinja2 templates -> the selector module and docs pages.

No probing, no policy of its own (support comes from `attnmatrix.matrix.policy`'s resolution, every query answer from
the query engine `attnmatrix.selector_engine`), no kernel imports.
"""

from .render import (
    ARCH_PAGE_DIR,
    FA_VERSION_PATH,
    MLA_PREFILL_PATH,
    SELECTOR_PATH,
    SUPPORT_MATRIX_PATH,
    md_escape,
    pylit,
    render_all,
    render_docs,
    render_selector,
)
from .tables import explain_query, flash_attn_version, make_query, mla_prefill_priorities, query

__all__ = [
    "ARCH_PAGE_DIR",
    "FA_VERSION_PATH",
    "MLA_PREFILL_PATH",
    "SELECTOR_PATH",
    "SUPPORT_MATRIX_PATH",
    "explain_query",
    "flash_attn_version",
    "make_query",
    "md_escape",
    "mla_prefill_priorities",
    "pylit",
    "query",
    "render_all",
    "render_docs",
    "render_selector",
]
