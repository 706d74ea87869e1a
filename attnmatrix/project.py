"""Where the project's generated files live, and the identity of the evidence they came from."""

from __future__ import annotations

import hashlib
from pathlib import Path

from attnmatrix.matrix.evidence import BACKENDS_FILE, DECLARED_FILE, Evidence
from attnmatrix.matrix.storage import dump_record


class ProjectNotFound(Exception):
    pass


def find_root(start: Path | None = None) -> Path:
    """The attnmatrix checkout to generate into: the nearest folder up from `start` (default: the
    current directory) with `mkdocs.yml` and `matrix/data`, else, when no `start` was given, the
    checkout this package was installed from (editable installs). An explicit `start` that is not
    inside a checkout is an error, never silently replaced by another checkout."""
    candidates = []
    here = (start or Path.cwd()).resolve()
    candidates += [here, *here.parents]
    if start is None:
        candidates.append(Path(__file__).resolve().parent.parent)
    for c in candidates:
        if (c / "mkdocs.yml").is_file() and (c / "matrix" / "data").is_dir():
            return c
    raise ProjectNotFound(
        f"no attnmatrix checkout found (a folder with mkdocs.yml and matrix/data) at or above {here}; "
        "run inside a clone or pass --root"
    )


def matrix_id(ev: Evidence) -> str:
    """A short content hash of the evidence: same records, facts and metadata -> same id.

    Order-independent over records, so the same evidence read from differently split files has
    the same identity.
    """
    h = hashlib.sha256()
    for line in sorted(dump_record(r) for r in ev.records):
        h.update(line.encode())
        h.update(b"\n")
    for extra in (DECLARED_FILE, BACKENDS_FILE):
        if extra.exists():
            h.update(extra.read_bytes())
    return h.hexdigest()[:12]


def kernel_versions(ev: Evidence) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for r in ev.records:
        if r.kernel_version and r.tier != "declared":
            out.setdefault(r.case.backend, set()).add(r.kernel_version)
    return {k: sorted(v) for k, v in sorted(out.items())}


def relative_files(ev: Evidence, root: Path) -> list[str]:
    out = []
    for f in ev.files:
        p = Path(f).resolve()
        try:
            out.append(str(p.relative_to(root)))
        except ValueError:
            try:
                out.append("attnmatrix/matrix/" + str(p.relative_to(DECLARED_FILE.parent.parent.resolve())))
            except ValueError:
                out.append(p.name)
    return sorted(set(out))
