"""`attnmatrix vllm-answers`: vLLM's own selection answers, from a pinned vLLM wheel (engines/vllm/oracle.py)."""

from __future__ import annotations

import sys

import click

from attnmatrix.engines.vllm import answers as A
from attnmatrix.engines.vllm import oracle as O
from attnmatrix.engines.vllm import release as R

from .common import EXIT_USAGE, locate
from .group import main


@main.command("vllm-answers")
@click.option("--wheel", "wheel", required=True, type=click.Path(exists=True),
              help="A vLLM wheel (.whl) or a folder holding its extracted vllm/ and vllm-<version>.dist-info/.")
@click.option("-o", "--output", default=None,
              help="Answers file to write (default: matrix/data/vllm/vllm-<version>-answers.json in the checkout). "
                   "An existing file is replaced only if it is a vLLM answers file.")
@click.option("--root", default=None, help="The checkout to write into (default: the one around the working folder).")
def vllm_answers(wheel: str, output: str | None, root: str | None) -> None:
    """Run a vLLM release's own selection code and write its answers as committed data.

    \b
    Loads the release's attention backend choice (platforms/cuda.py's priority list and walk, each backend's
    validate_configuration), its get_flash_attn_version (fa_utils.py, with vllm_flash_attn's
    is_fa_version_supported) and its MLA prefill choice (platforms/interface.py, mla/prefill/*.py) into a
    private namespace, with small stand-ins for the GPU platform (the queried compute capability), the logger,
    vllm.envs and the config (vLLM's defaults). No vLLM install, no GPU. It asks every question the comparison
    page (site/vllm-comparison.md) asks: the matrix's GPU archs x head dims x the backend-choice inputs (dtype,
    sinks, sliding window, KV block size, fp8 KV cache) and get_flash_attn_version arguments (ALiBi, sinks,
    softcap, KV block size) of the probed feature sets, and the MLA triples x dtypes.

    \b
    The file records the vLLM version, the wheel's name and sha256, and the path and sha256 of every vLLM
    file executed (checked against the wheel's RECORD). `attnmatrix generate` reads it; it never needs the wheel.
    Example:
      pip download --no-deps vllm==0.33.0 --only-binary=:all: --python-version 3.12 \\
          --platform manylinux_2_28_x86_64 -d dl/
      attnmatrix vllm-answers --wheel dl/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
      attnmatrix generate
    """
    try:
        with R.open_release(wheel) as release:
            click.echo(f"vLLM {release.version} from {release.wheel_name or wheel}", err=True)
            doc = O.run_answers(release, progress=lambda s: click.echo(s, err=True))
    except A.OracleError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    if output is None:
        proj = locate(root, need_checkout=True)
        output = str(proj.root / A.answers_path(doc["vllm"]["version"]))
    try:
        changed = A.write_answers(doc, output)
    except A.OracleError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    n_fa, n_mla = len(doc["flash_attn_version"]), len(doc["mla_prefill"])
    click.echo(f"{'wrote' if changed else 'unchanged'} {output}: {n_fa} get_flash_attn_version answers, "
               f"{n_mla} MLA prefill answers, {len(doc['executed_files'])} vLLM files executed", err=True)


@main.command("vllm-patch")
@click.option("--source", "source", required=True, type=click.Path(exists=True, file_okay=False),
              help="A vLLM source checkout (the release's sdist or a git clone at its tag).")
@click.option("-o", "--output", default=None,
              help="Write the diff to this file (default: standard output). An existing file is replaced only if it "
                   "is a patch this command wrote.")
def vllm_patch(source: str, output: str | None) -> None:
    """Write the unified diff that makes vLLM take its attention choices from attnmatrix's evidence.

    \b
    The diff vendors the generated vLLM-shaped module (attnmatrix/engines/vllm/selection.py, with the selector,
    the query engine and the vocabulary) into vLLM as vllm/attnmatrix/, and replaces vLLM's hand-written rules
    with calls into it: get_flash_attn_version (fa_utils.py), the MLA prefill priority list
    (Platform.get_mla_prefill_backend_cls, platforms/interface.py) and FA4's head-size-256 block size
    (FlashAttentionBackend._get_fa4_hd256_block_size, flash_attn.py). The vendored files are this
    installation's; `attnmatrix check` says whether they are current. Example:
      attnmatrix vllm-patch --source vllm-0.33.0 -o attnmatrix-vllm.diff
      cd vllm-0.33.0 && git apply --check ../attnmatrix-vllm.diff && git apply ../attnmatrix-vllm.diff
    """
    from pathlib import Path

    from attnmatrix.engines.vllm import patch as P
    from attnmatrix.matrix.storage import atomic_write_text

    try:
        diff = P.make_patch(source)
    except P.PatchError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    if output is None:
        click.echo(diff, nl=False)
        return
    out = Path(output)
    if out.exists() and not P.is_our_patch(out):
        click.echo(f"error: {out} exists and is not a patch written by attnmatrix vllm-patch; not replacing it",
                   err=True)
        sys.exit(EXIT_USAGE)
    atomic_write_text(out, diff)
    n_files = sum(line.startswith("diff --git ") for line in diff.splitlines())
    click.echo(f"wrote {out}: {n_files} files", err=True)
