"""`attnmatrix explain --names ENGINE`: the answer also in an inference engine's own backend names.

The names are the query engine's data (`engine_names`, derived from matrix/data/backends.json by the generator)
and the rule that applies them is the engine's (`Engine.names_of`, `Engine.in_engine_names`: each name once,
where its best-placed backend stands; a backend the engine does not run has no name and is left out). The fast
path (the selector's engine), `--full` (the engine over the resolved matrix) and `--model` hand their answer to
the same functions here, so every form of explain says the same names.
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from attnmatrix.selector_engine import Engine

from .common import UsageError

names_option = click.option(
    "--names", "engine", default=None, metavar="ENGINE",
    help="Also answer in an inference engine's backend names (vllm: FLASH_ATTN, FLASHINFER, TORCH_SDPA; for "
         "mla_prefill its MLA prefill names), derived from backends.json: each name once, where its best-placed "
         "backend stands; backends the engine does not run are left out.")


def _unknown(engine: str, known) -> UsageError:
    return UsageError(f"--names: unknown engine {engine!r} (known: {', '.join(sorted(known))}; without --names the "
                      "answer is in attnmatrix's backend names)")


def check_engine(engine: str | None) -> None:
    """Before the matrix is resolved (seconds): an engine backends.json declares no names for is a usage error.
    The engine data built from the matrix has exactly these engines (`matrix.backends.engine_names`)."""
    from attnmatrix.matrix.backends import ENGINE_NAME_FIELDS

    if engine is not None and engine not in ENGINE_NAME_FIELDS:
        raise _unknown(engine, ENGINE_NAME_FIELDS)


def engine_table(eng: Engine, engine: str, op: str) -> dict[str, str]:
    """backend -> `engine`'s name for `op`; a usage error naming --names and the engines the data knows."""
    try:
        return eng.names_of(engine, op)
    except ValueError:
        raise _unknown(engine, eng.data["engine_names"]) from None


def names_answer(eng: Engine, engine: str, op: str, order: list[str], backends: Iterable[str]) -> dict:
    """The JSON part of an answer in `engine`'s names: the order (supported backends) and each backend's name."""
    table = engine_table(eng, engine, op)
    return {"engine": engine, "order": eng.in_engine_names(engine, op, order),
            "backends": {b: table[b] for b in backends if b in table}}


def add_names(result: dict, eng: Engine, engine: str | None, op: str) -> None:
    """`result["names"]` for an explain answer (`order`, `backends` as the engine answered); none without --names."""
    if engine is not None:
        result["names"] = names_answer(eng, engine, op, result["order"], result["backends"])


def order_line(names: dict) -> str:
    engine = names["engine"]
    return (f"order in {engine}'s names: {', '.join(names['order']) or f'(no supported backend {engine} runs)'} "
            f"(each name where its best-placed backend stands; backends {engine} does not run are left out)")


def backend_label(names: dict | None, backend: str) -> str:
    """`backend`, followed by its engine name under --names (or that the engine does not run it)."""
    if names is None:
        return backend
    name = names["backends"].get(backend)
    return f"{backend} ({names['engine']}: {name})" if name else f"{backend} (not run by {names['engine']})"
