"""The `attnmatrix` click group. Command modules register on it (`@main.command()`).

It lives apart from the package's `__init__` so that a command module imports the group, never the package
that imports it back. A command's module is imported when the command runs (`COMMANDS`), so a quick command
(`explain`) does not pay for the imports of the others; `--help` imports them all.
"""

from __future__ import annotations

import importlib

import click

# command -> the module of attnmatrix.cli that defines it. A command missing here still runs (every module is
# imported to find it); tests/test_cli.py checks that the table is complete.
COMMANDS = {
    "probe": "probing", "run": "probing", "xcompile": "cross_compile",
    "validate": "evidence", "merge": "evidence", "generate": "evidence", "check": "check",
    "snapshot": "evidence", "diff": "evidence", "ingest-cubins": "evidence",
    "show": "query", "explain": "query", "stats": "stats",
    "vllm-answers": "vllm", "vllm-patch": "vllm",
}
MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def load_all_commands() -> None:
    for mod in MODULES:
        importlib.import_module(f"{__package__}.{mod}")


class _Main(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        load_all_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            if cmd_name in COMMANDS:
                importlib.import_module(f"{__package__}.{COMMANDS[cmd_name]}")
            else:
                load_all_commands()
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            from .common import EXIT_INTERRUPTED

            # Not "a check failed" (1): a sweep interrupted here resumes where it stopped when run again.
            click.echo("\ninterrupted; a probe resumes where it stopped when run again", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="attnmatrix")
def main() -> None:
    """Probe attention kernels, keep an evidence-backed compatibility matrix, generate selector and docs.

    \b
    Typical flows (GPU = needs an NVIDIA GPU and the kernels installed; the rest run anywhere):
      attnmatrix run                         probe this machine's installed backends, then say how to merge
      attnmatrix probe --backends fa4,fa2    GPU: sweep kernels on the local GPU (resumable JSONL)
      attnmatrix probe --backends sdpa_cpu   CPU backends on any machine
      attnmatrix xcompile --arch sm_100a     compile-only FA4 evidence for a GPU you do not have (CPU is enough)
      attnmatrix ingest-cubins WHEEL         shipped-binary evidence from a flashinfer-cubin wheel
      attnmatrix merge attnmatrix-results/sm_90.jsonl -o matrix/data/results/sm_90-mine.jsonl
      attnmatrix generate                    rewrite the selector and the docs from the matrix
      attnmatrix explain --arch sm_90 --head-size 256 --sliding-window
      attnmatrix stats attnmatrix-results/sm_90.jsonl   a sweep's cells, records per file, time and best TFLOP/s
      attnmatrix check                       CI gate: matrix valid and generated files current
      attnmatrix check --reprobe --sample 200   GPU CI: re-check a sample of this GPU's claims

    The matrix is the checkout the command runs in (else the installed package's data); every command that
    reads or writes it says which on stderr. Exit codes: 0 ok, 1 a check failed, 2 bad usage or unreadable
    input, 130 interrupted.

    Evidence tiers, strongest first: validated (ran here, checked against a float32 reference),
    compiled (built for the arch without running), shipped (a prebuilt binary for the arch is listed
    in the library's kernel table; as strong as compiled), declared (an upstream source says so).
    """
