"""`attnmatrix vllm-answers`: vLLM's own selection answers, from a pinned vLLM wheel (engines/vllm/oracle.py)."""

from __future__ import annotations

import sys

import click

from attnmatrix.engines.vllm import answers as A
from attnmatrix.engines.vllm import oracle as O
from attnmatrix.engines.vllm import release as R

from . import main
from .common import EXIT_USAGE, locate


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
