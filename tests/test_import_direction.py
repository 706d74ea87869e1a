"""Imports run with the data flow: vocabulary -> matrix (records, resolution) -> generator -> CLI.

Every `import` of every module of the package (module level or inside a function: a deferred import is still
a dependency) is read from the source and checked against the layer table below. Run alone:
`python -m pytest -q tests/test_import_direction.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where each part of the package lives in the checkout (pyproject.toml's package-dir).
PACKAGE_DIRS = {"attnmatrix": ROOT / "attnmatrix", "attnmatrix.matrix": ROOT / "matrix",
                "attnmatrix.kernels": ROOT / "kernels", "attnmatrix.generator": ROOT / "generator"}

# layer -> the layers it may import (itself always). The order is the flow: the vocabulary, the query engine and
# vLLM's questions to it at the bottom (standard library only, vendored with the selector), the matrix (case space,
# records, backends, resolution, workload timings), the kernels that produce records, the generator that turns a
# resolved matrix into files, the engines' comparisons beside it, and the command line over the workflow layer (and
# its output formats, ci_format) at the top. The command line reaches the kernels only through the workflow layer,
# which holds the decisions between them (attnmatrix/workflow.py).
ALLOWED: dict[str, set[str]] = {
    "vocabulary": set(),
    "selector_workloads": set(),
    "selector_engine": {"vocabulary", "selector_workloads"},
    "selector_vllm": {"vocabulary", "selector_engine"},
    "selector": {"selector_engine", "selector_vllm", "vocabulary"},
    "matrix": {"vocabulary", "selector_engine", "selector_workloads"},
    "kernels": {"vocabulary", "selector_engine", "matrix"},
    "generator": {"vocabulary", "selector_engine", "selector_vllm", "matrix", "engines"},
    "engines": {"vocabulary", "selector_engine", "selector_vllm", "selector", "matrix", "generator"},
    "project": {"vocabulary", "matrix"},
    "workflow": {"vocabulary", "matrix", "kernels", "project"},
    "ci_format": set(),
    "cli": {"vocabulary", "selector_engine", "selector_vllm", "selector_workloads", "selector", "matrix", "generator",
            "engines", "project", "workflow", "ci_format"},
}


def layer_of(module: str) -> str | None:
    """`attnmatrix.matrix.cases` -> `matrix`; `attnmatrix.cli.query` -> `cli`; outside the package: None."""
    parts = module.split(".")
    if parts[0] != "attnmatrix":
        return None
    if len(parts) == 1:
        return "package"
    return parts[1]


def modules() -> list[tuple[str, Path]]:
    out = []
    for pkg, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            if pkg == "attnmatrix" and rel.parts and rel.parts[0] not in ("cli",) and len(rel.parts) > 1:
                if not (folder / rel.parts[0] / "__init__.py").exists():
                    continue
            name = ".".join((pkg, *rel.parts))
            out.append((name.removesuffix(".__init__"), path))
    return out


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement, relative ones resolved against `module`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from attnmatrix import vocabulary` imports the submodule
            if node.module in (None, "attnmatrix") or target in PACKAGE_DIRS or target == "attnmatrix.cli":
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


def violations() -> list[str]:
    bad = []
    for module, path in modules():
        src = layer_of(module)
        if src in (None, "package"):
            continue
        for line, target in imports_of(module, path):
            dst = layer_of(target)
            if dst is None or dst == src:
                if (dst == "cli" and src == "cli" and target in ("attnmatrix.cli", "attnmatrix.cli.main")
                        and module != "attnmatrix.cli.__main__"):  # `python -m attnmatrix.cli` runs the package
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target} (registration cycle)")
                continue
            if dst == "package":
                continue
            if dst not in ALLOWED.get(src, set()):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} ({src}) imports {target} ({dst})")
    return bad


def test_no_import_runs_against_the_flow() -> None:
    assert violations() == []


def test_every_layer_of_the_package_is_in_the_table() -> None:
    layers = {layer_of(m) for m, _ in modules()} - {"package"}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


@pytest.mark.parametrize("src,code,layer", [
    ("matrix/cases.py", "from attnmatrix.kernels import registry\n", "kernels"),
    ("generator/tables.py", "from attnmatrix.project import package_data_dir\n", "project"),
    ("attnmatrix/vocabulary.py", "from attnmatrix.matrix import cases\n", "matrix"),
    ("matrix/evidence.py", "def f():\n    from ..generator import render\n", "generator"),
    ("attnmatrix/cli/probing.py", "from attnmatrix.kernels.env import local_arch\n", "kernels"),
    ("attnmatrix/cli/fleet.py", "def f():\n    from ..kernels import ray_executor\n", "kernels"),
    ("attnmatrix/cli/check.py", "def f():\n    import attnmatrix.kernels.runner\n", "kernels"),
])
def test_the_check_finds_an_import_against_the_flow(tmp_path: Path, monkeypatch, src: str, code: str,
                                                    layer: str) -> None:
    """The check can say no: one added import against the flow is found, with its file and line."""
    original = (ROOT / src).read_text(encoding="utf-8")
    copy = tmp_path / src
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(original + "\n" + code, encoding="utf-8")
    folder, *inner = Path(src).with_suffix("").parts
    module = ".".join([{"matrix": "attnmatrix.matrix", "generator": "attnmatrix.generator",
                        "attnmatrix": "attnmatrix"}[folder], *inner])
    found = [f"{module}:{line}" for line, target in imports_of(module, copy)
             if layer_of(target) == layer and layer not in ALLOWED[layer_of(module)]]
    assert found, imports_of(module, copy)


def test_the_cli_registration_cycle_is_found(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("from . import main\n", encoding="utf-8")
    assert ("attnmatrix.cli.main" in [t for _, t in imports_of("attnmatrix.cli.x", path)])
