"""vLLM's CUDA-graph decode step: the batch sizes vLLM captures, and the backends whose time steps with them.

In its default CUDA graph mode vLLM replays a decode step of at most its largest captured batch from the graph
captured for the smallest captured batch size that holds it: 1, 2, 4, every 8th to 248, every 16th to the largest,
min(2 x max_num_seqs, 512) with the default max_num_seqs of 256 (vllm-project/vllm@4ba787ec9 (v0.33.0)
vllm/config/vllm.py:2453-2470 for the largest, :2576-2591 for the sizes; the same in v0.26.0 vllm/config/vllm.py
:1748-1749 and :1808-1836; the padded step vllm/v1/worker/gpu_model_runner.py `pad_attn`, v0.26.0 :4263). v0.33.0
raises the largest to 1024 on compute capability 10.x; the sizes here are sm_90's. The kernel then runs the
captured number of sequences, the step's and empty ones (kernels/vllm_fa.py `graph_batch`, `pad_to_graph`).

A kernel that picks its split of the KV cache from the number of sequences it is launched with sees the captured
batch, not the step's, and its decode time steps where the captured size steps (backends.json
`splits_see_graph_batch`: vLLM's FA4 copy, whose split heuristic counts the sequences of `cu_seqlens_q`,
pypi:vllm==0.33.0 vllm/vllm_flash_attn/cute/interface.py:736 and :475-487; vLLM's FA3 build is launched with a
schedule planned from the step's own lengths and does not: kernels/vllm_fa.py). The selector reads such a backend's
decode time at a timed batch of the query's graph (selector_workloads.graph_reading_batch).

Standard library only (and the backend registry, attnmatrix.matrix.backends).
"""

from __future__ import annotations

from attnmatrix.matrix.backends import GRAPH_SPLITS_FIELD, backends, declaring

# The most tokens a captured step holds with vLLM's default max_num_seqs (256).
GRAPH_TOKENS = 512


def capture_sizes(largest: int = GRAPH_TOKENS) -> list[int]:
    """vLLM's default CUDA-graph batch sizes up to `largest`."""
    return ([n for n in (1, 2, 4) if n <= largest] + list(range(8, min(largest + 1, 256), 8))
            + list(range(256, largest + 1, 16)))


def graph_batches(backends: dict[str, dict]) -> dict[str, tuple[int, ...]]:
    """backend -> vLLM's captured batch sizes, for each backend whose entry (backends.json) declares
    `splits_see_graph_batch`: what the selector's decode placement reads those backends by."""
    sizes = tuple(capture_sizes())
    return {b: sizes for b in declaring(backends, GRAPH_SPLITS_FIELD)}


def declared_graph_batches() -> dict[str, tuple[int, ...]]:
    """`graph_batches` of the backend registry's backends (backends.json and plugins)."""
    return graph_batches({name: info.meta for name, info in backends().items()})
