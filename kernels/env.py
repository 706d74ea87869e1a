"""Provenance: the facts that make a measurement reproducible, collected where it was made."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import subprocess

import torch

from attnmatrix.vocabulary import arch_of


def package_version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def tool_version() -> str:
    return package_version("attnmatrix") or "0+unknown"


def today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def local_arch(device: str = "cuda") -> str:
    """The matrix arch of this process's device: `sm_90` for an H200, `cpu` without a GPU."""
    if device == "cuda" and torch.cuda.is_available():
        return arch_of(torch.cuda.get_device_capability())
    return "cpu"


def device_provenance(device: str = "cuda") -> dict:
    """Everything about the machine and software stack, except the kernel's own version."""
    prov = {
        "date": today(), "torch": torch.__version__, "python": platform.python_version(),
        "tool": tool_version(), "platform": platform.platform(terse=True),
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        prov.update({
            "device": props.name, "sm_count": str(props.multi_processor_count),
            "capability": f"{props.major}.{props.minor}", "cuda": str(torch.version.cuda),
            "memory_gib": f"{props.total_memory / 2**30:.0f}",
        })
        drv = _driver_version()
        if drv:
            prov["driver"] = drv
        # Measured once per sweep by the parent (kernels.timing.peak_env) and handed down,
        # so every TFLOP/s figure can be read as a fraction of this GPU's measured bf16 matmul rate.
        peak = os.environ.get("ATTNMATRIX_MATMUL_PEAK_TFLOPS")
        if peak:
            prov["matmul_peak_tflops"] = peak
            how = os.environ.get("ATTNMATRIX_MATMUL_PEAK_METHOD")
            if how:  # which size, operands and timer reached it; what the other sizes and random data reached
                prov["matmul_peak_method"] = how
    else:
        prov.update({"device": _cpu_name(), "cpu_threads": str(torch.get_num_threads())})
    return prov
