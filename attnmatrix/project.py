"""Which matrix the tool works on, where its generated files live, and the identity of the evidence.

One checkout, stated: a command reads the evidence of, and writes into, the same place. That is the
attnmatrix checkout it stands in (the nearest folder at or above the current directory with `mkdocs.yml`
and `matrix/data`), else the installed package's own data (read-only use: a command that writes generated
files then needs --root). `--root` names a checkout explicitly; a folder that is not one is an error, never
silently replaced by another checkout. `Project.describe()` is the line the CLI prints to say which.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.matrix import evidence as _evidence
from attnmatrix.matrix.evidence import Evidence
from attnmatrix.matrix.records import UNINFORMATIVE_OUTCOMES
from attnmatrix.matrix.storage import dump_record


class ProjectNotFound(Exception):
    pass


def is_checkout(path: Path) -> bool:
    return (path / "mkdocs.yml").is_file() and (path / "matrix" / "data").is_dir()


@dataclass(frozen=True)
class Project:
    """The matrix a command works on: `data_dir` (matrix/data) and, in a checkout, its `root`."""

    data_dir: Path
    root: Path | None  # the checkout generated files are written into; None: the installed package's data

    @property
    def results_dir(self) -> Path:
        return self.data_dir / "results"

    @property
    def backends_file(self) -> Path:
        return self.data_dir / "backends.json"

    @property
    def snapshot_file(self) -> Path:
        return self.data_dir / "history" / "previous.jsonl"

    def describe(self) -> str:
        if self.root is not None:
            return f"matrix: the checkout at {self.root} ({self.data_dir})"
        return f"matrix: the installed package's data at {self.data_dir} (not in a checkout)"

    def relative(self, path: Path | str) -> str:
        """A path as the generated files cite it: relative to the checkout, else inside the package."""
        p = Path(path).resolve()
        if self.root is not None:
            try:
                return str(p.relative_to(self.root.resolve()))
            except ValueError:
                pass
        try:
            return "attnmatrix/matrix/" + str(p.relative_to(self.data_dir.parent.resolve()))
        except ValueError:
            return p.name


def package_data_dir() -> Path:
    return _evidence.DATA_DIR


def find_root(start: Path | None = None) -> Path:
    """The checkout at or above `start` (default: the current directory). Raises ProjectNotFound."""
    here = (start or Path.cwd()).resolve()
    for c in (here, *here.parents):
        if is_checkout(c):
            return c
    raise ProjectNotFound(
        f"no attnmatrix checkout found (a folder with mkdocs.yml and matrix/data) at or above {here}; "
        "run inside a clone or pass --root"
    )


def locate(root: str | Path | None = None, *, need_checkout: bool = False) -> Project:
    """The project a command works on (see the module docstring). With `need_checkout` (commands that write
    generated files), a project without a checkout raises ProjectNotFound."""
    if root is not None:
        r = Path(root).resolve()
        if not is_checkout(r):
            raise ProjectNotFound(f"--root {root}: no attnmatrix checkout there (a folder with mkdocs.yml and "
                                  "matrix/data)")
        return Project(r / "matrix" / "data", r)
    try:
        r = find_root()
        return Project(r / "matrix" / "data", r)
    except ProjectNotFound:
        if need_checkout:
            raise
    return Project(package_data_dir(), None)


def matrix_id(ev: Evidence, data_dir: Path | None = None) -> str:
    """A short content hash of the evidence: same records, facts and metadata -> same id.

    Order-independent over records, so the same evidence read from differently split files has
    the same identity.
    """
    data = data_dir or package_data_dir()
    h = hashlib.sha256()
    for line in sorted(dump_record(r) for r in ev.records):
        h.update(line.encode())
        h.update(b"\n")
    for extra in (data / "declared.json", data / "backends.json"):
        if extra.exists():
            h.update(extra.read_bytes())
    return h.hexdigest()[:12]


def source_files(data_dir: Path) -> list[Path]:
    """The files a checkout's matrix is read from: its result files, declared facts and backend metadata."""
    from attnmatrix.matrix.storage import iter_result_files

    extra = [p for p in (data_dir / "declared.json", data_dir / "backends.json") if p.exists()]
    return [*iter_result_files([data_dir / "results"]), *extra] if (data_dir / "results").exists() else extra


def source_digest(files: list[str | Path]) -> str:
    """A hash of the bytes of the files a matrix was read from, independent of their names, order and repeats:
    cheap to compute (no parsing), so a reader can tell whether generated data still matches the files."""
    parts = sorted({hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files})
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def kernel_versions(ev: Evidence) -> dict[str, list[str]]:
    """The kernel versions the matrix has evidence about, per backend. A record of a backend that could not
    be imported (`unavailable`) is not evidence about any version, so its version is not listed."""
    out: dict[str, set[str]] = {}
    for r in ev.records:
        if r.kernel_version and r.tier != "declared" and r.outcome not in UNINFORMATIVE_OUTCOMES \
                and r.kernel_version != "unknown":
            out.setdefault(r.case.backend, set()).add(r.kernel_version)
    return {k: sorted(v) for k, v in sorted(out.items())}


def relative_files(ev: Evidence, project: Project) -> list[str]:
    return sorted({project.relative(f) for f in ev.files})
