"""One new declared fact changes a few lines of the generated selector, not the whole file."""

from __future__ import annotations

import difflib

import pytest
from attnmatrix.generator import render_selector
from attnmatrix.matrix.evidence import expand_fact, load_evidence
from attnmatrix.matrix.policy import resolve

META = {"matrix_id": "one-fact-test"}
FEW_DOZEN = 36

FACTS = {
    # a backend gains evidence on an arch it had none for: a new block, and the arch's backend list
    "new block": {
        "id": "test-sdpa-flash-sm120", "backend": "sdpa_flash", "archs": ["sm_120"], "ops": ["prefill"],
        "dtypes": ["bfloat16", "float16"], "head_dims": [[64, 64], [128, 128]], "feature_sets": [[], ["causal"]],
        "outcome": "pass", "sources": ["example/repo@0123abc path/to/file.py:10"], "date": "2026-12-01",
    },
    # a refusal that overrules a compile on cells that already have evidence: rules inside one block move
    "overruling refusal": {
        "id": "test-fa4-sm100-no-paged-16", "backend": "fa4", "archs": ["sm_100"], "ops": ["prefill", "decode"],
        "dtypes": ["bfloat16"], "head_dims": [[128, 128]], "feature_sets": [["causal", "paged_kv:16"]],
        "outcome": "rejected", "reason": "block size 16 is not supported", "sources": ["example PR #1"],
        "date": "2026-12-01",
    },
}


@pytest.fixture(scope="module")
def embedded():
    return load_evidence()


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FACTS))
def test_one_declared_fact_changes_a_few_lines(embedded, kind):
    before = render_selector(resolve(embedded), META)
    records = list(embedded.records) + expand_fact(FACTS[kind])
    changed = resolve(type(embedded)(records=records, where=["t"] * len(records), rankings=list(embedded.rankings),
                                     backends=embedded.backends, files=list(embedded.files)))
    after = render_selector(changed, META)
    diff = _changed_lines(before, after)
    assert diff, "the fact must show in the selector"
    assert len(diff) <= FEW_DOZEN, "\n".join(diff)
    assert any(FACTS[kind]["id"] in line for line in diff)
