"""The vLLM oracle (attnmatrix/engines/vllm/oracle.py): its loader and stand-ins over a small synthetic `vllm` tree
written here with the pinned release's import shape (fa_utils imports current_platform, the interface imports its
compiled extensions relatively, the MLA backends probe kernel libraries in is_available), and `attnmatrix
vllm-answers` over it. The answers file and the committed answers: tests/test_vllm_answers.py."""

from __future__ import annotations

import base64
import hashlib
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnmatrix.cli import main
from attnmatrix.engines.vllm import answers as A
from attnmatrix.engines.vllm import namespace as N
from attnmatrix.engines.vllm import oracle as O
from attnmatrix.engines.vllm import release as R

SYNTH = {
    "vllm/platforms/interface.py": '''
        import enum
        from typing import NamedTuple

        from vllm.logger import init_logger

        logger = init_logger(__name__)

        class PlatformEnum(enum.Enum):
            CUDA = enum.auto()
            CPU = enum.auto()

        class DeviceCapability(NamedTuple):
            major: int
            minor: int

            def to_int(self):
                return self.major * 10 + self.minor

        class Platform:
            _enum = PlatformEnum.CPU

            def is_cuda(self):
                return self._enum == PlatformEnum.CUDA

            @classmethod
            def get_device_capability(cls, device_id=0):
                return None

            @classmethod
            def is_device_capability_family(cls, capability, device_id=0):
                return cls.get_device_capability().to_int() // 10 == capability // 10

            @classmethod
            def get_mla_prefill_backend_cls(cls, config):
                from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum as E

                cap = cls.get_device_capability()
                order = [E.TRTLLM_RAGGED, E.FLASH_ATTN] if cap.major == 10 else [E.FLASH_ATTN]
                reasons = {}
                for b in order:
                    c = b.get_class()
                    why = c.validate_configuration(cap, config)
                    if not why:
                        return c
                    reasons[b.name] = why
                logger.debug_once("refused: %s", reasons)
                raise ValueError(f"no MLA prefill backend: {reasons}")
    ''',
    "vllm/v1/attention/backends/fa_utils.py": '''
        import vllm.envs as envs
        from vllm.logger import init_logger
        from vllm.platforms import current_platform

        logger = init_logger(__name__)

        if current_platform.is_cuda():
            from vllm.vllm_flash_attn import flash_attn_varlen_func

        def get_flash_attn_version(requires_alibi=False, head_size=None, head_size_v=None, has_sinks=False,
                                   requires_softcap=False, kv_cache_block_size=None, supports_fa4_hd256=False):
            try:
                from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported

                cap = current_platform.get_device_capability()
                v = 3 if cap.major == 9 and is_fa_version_supported(3) else 2
                from vllm.config import get_current_vllm_config_or_none

                assert get_current_vllm_config_or_none() is None
                if requires_alibi and v == 3:
                    logger.warning_once("Cannot use FA version 3 with ALiBi, defaulting to FA version 2.")
                    v = 2
                if envs.VLLM_BATCH_INVARIANT:
                    v = 2
                assert is_fa_version_supported(v)
                return v
            except (ImportError, AssertionError):
                return None

        def is_flash_attn_varlen_func_available():
            return True
    ''',
    "vllm/vllm_flash_attn/__init__.py": '''
        from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func, is_fa_version_supported
    ''',
    "vllm/vllm_flash_attn/flash_attn_interface.py": '''
        try:
            from . import _vllm_fa2_C  # noqa: F401
            FA2_AVAILABLE = True
        except ImportError:
            FA2_AVAILABLE = False
        try:
            from . import _vllm_fa3_C  # noqa: F401
            FA3_AVAILABLE = True
        except ImportError:
            FA3_AVAILABLE = False

        def is_fa_version_supported(v):
            from vllm.platforms import current_platform

            if v == 2:
                return FA2_AVAILABLE and current_platform.get_device_capability().major >= 8
            return v == 3 and FA3_AVAILABLE and current_platform.is_device_capability_family(90)

        def flash_attn_varlen_func(*args, **kwargs):
            raise RuntimeError("a kernel")
    ''',
    "vllm/v1/attention/backends/mla/prefill/base.py": '''
        from dataclasses import dataclass
        from typing import ClassVar

        import torch

        @dataclass(frozen=True, kw_only=True)
        class MLADimensions:
            qk_nope_head_dim: int
            qk_rope_head_dim: int
            v_head_dim: int

        class MLAPrefillBackend:
            supported_dtypes: ClassVar[list] = [torch.float16, torch.bfloat16]
            supported_mla_dimensions: ClassVar[list] = []

            @classmethod
            def supports_compute_capability(cls, cap):
                return True

            @classmethod
            def is_available(cls):
                return True

            @classmethod
            def validate_configuration(cls, cap, config):
                out = []
                if not cls.supports_compute_capability(cap):
                    out.append(f"compute capability {cap.major}.{cap.minor} not supported")
                if not cls.is_available():
                    out.append("required dependencies not available")
                if cls.supported_mla_dimensions and config.mla_dimensions not in cls.supported_mla_dimensions:
                    out.append("dims")
                return out

            def __init__(self, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vllm_config, **kw):
                self.vllm_config = vllm_config
    ''',
    "vllm/v1/attention/backends/mla/prefill/selector.py": '''
        from typing import NamedTuple

        import torch

        from vllm.v1.attention.backends.mla.prefill.base import MLADimensions

        class MLAPrefillSelectorConfig(NamedTuple):
            dtype: torch.dtype
            mla_dimensions: MLADimensions
    ''',
    "vllm/v1/attention/backends/mla/prefill/registry.py": '''
        from enum import Enum

        from vllm.utils.import_utils import resolve_obj_by_qualname

        class MLAPrefillBackendEnum(Enum):
            FLASH_ATTN = "vllm.v1.attention.backends.mla.prefill.flash_attn.FlashAttnPrefillBackend"
            TRTLLM_RAGGED = "vllm.v1.attention.backends.mla.prefill.trtllm_ragged.TrtllmRaggedPrefillBackend"

            def get_class(self):
                return resolve_obj_by_qualname(self.value)
    ''',
    "vllm/v1/attention/backends/mla/prefill/flash_attn.py": '''
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
        from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

        class FlashAttnPrefillBackend(MLAPrefillBackend):
            @staticmethod
            def get_name():
                return "FLASH_ATTN"

            def __init__(self, *, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vllm_config, **kw):
                super().__init__(qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vllm_config)
                assert vllm_config.kernel_config.enable_jit_warmup is False
                self.vllm_flash_attn_version = get_flash_attn_version(
                    head_size=qk_nope_head_dim + qk_rope_head_dim, head_size_v=v_head_dim)
                cap = current_platform.get_device_capability()
                self.requires_v_padding = not (self.vllm_flash_attn_version == 3 and cap[0] == 9)
    ''',
    "vllm/v1/attention/backends/mla/prefill/trtllm_ragged.py": '''
        from vllm.v1.attention.backends.mla.prefill.base import MLADimensions, MLAPrefillBackend
        from vllm.v1.worker.workspace import current_workspace_manager  # noqa: F401

        class TrtllmRaggedPrefillBackend(MLAPrefillBackend):
            supported_mla_dimensions = [MLADimensions(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)]

            @staticmethod
            def get_name():
                return "TRTLLM_RAGGED"

            @classmethod
            def supports_compute_capability(cls, cap):
                return cap.major == 10

            @classmethod
            def is_available(cls):
                try:
                    from flashinfer.prefill import trtllm_ragged_attention_deepseek  # noqa: F401

                    return True
                except ImportError:
                    return False
    ''',
}
SYNTH_EXECUTED = ("vllm.platforms.interface", "vllm.v1.attention.backends.fa_utils", "vllm.vllm_flash_attn",
                  "vllm.vllm_flash_attn.flash_attn_interface", "vllm.v1.attention.backends.mla.prefill.base",
                  "vllm.v1.attention.backends.mla.prefill.selector", "vllm.v1.attention.backends.mla.prefill.registry",
                  "vllm.v1.attention.backends.mla.prefill.flash_attn",
                  "vllm.v1.attention.backends.mla.prefill.trtllm_ragged")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def write_tree(root: Path, *, fa3: bool = True, flashinfer: bool = True, files: dict | None = None) -> Path:
    """A synthetic extracted wheel: the files above, a dist-info with METADATA and RECORD, and the FA .so names."""
    files = dict(SYNTH if files is None else files)
    record = []
    for rel, text in files.items():
        data = textwrap.dedent(text).lstrip().encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        record.append(f"{rel},{_record_hash(data)},{len(data)}")
    for so in ["_vllm_fa2_C.abi3.so"] + (["_vllm_fa3_C.abi3.so"] if fa3 else []):
        (root / "vllm/vllm_flash_attn" / so).write_bytes(b"")
    info = root / "vllm-9.9.9.dist-info"
    info.mkdir()
    requires = ["Requires-Dist: torch==2.99.0"] + (["Requires-Dist: flashinfer-python==1.0"] if flashinfer else [])
    requires.append('Requires-Dist: tokenspeed-mla==2.0.3; platform_system == "Darwin"')
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n" + "\n".join(requires) + "\n")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return root


def synth_oracle(release: R.Release) -> O.Oracle:
    return O.Oracle(N.Namespace(release, executed=SYNTH_EXECUTED))


def test_loader_runs_the_trees_code_under_the_stand_ins(tmp_path):
    before = set(sys.modules)
    with R.open_release(write_tree(tmp_path)) as rel:
        assert rel.version == "9.9.9" and rel.wheel_name is None
        o = synth_oracle(rel)
        hopper = o.flash_attn_version(O.FaQuery((9, 0), 128, 128))
        assert hopper["version"] == 3 and hopper["log"] == []
        alibi = o.flash_attn_version(O.FaQuery((9, 0), 128, 128, requires_alibi=True))
        assert alibi["version"] == 2  # the logger stand-in keeps vLLM's own words with the answer
        assert alibi["log"] == ["warning: Cannot use FA version 3 with ALiBi, defaulting to FA version 2."]
        assert o.flash_attn_version(O.FaQuery((8, 0), 64, 64))["version"] == 2
        assert o.flash_attn_version(O.FaQuery((7, 5), 64, 64))["version"] is None  # FA2 needs major 8
        assert set(o.ns.files) == {"vllm/platforms/interface.py", "vllm/v1/attention/backends/fa_utils.py",
                                   "vllm/vllm_flash_attn/__init__.py", "vllm/vllm_flash_attn/flash_attn_interface.py"}
    assert {m for m in set(sys.modules) - before if m.startswith("vllm")} == set()  # nothing leaks


def test_compiled_extension_availability_is_what_the_release_ships(tmp_path):
    with R.open_release(write_tree(tmp_path, fa3=False)) as rel:
        assert synth_oracle(rel).flash_attn_version(O.FaQuery((9, 0), 128, 128))["version"] == 2


def test_environment_cannot_change_the_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    with R.open_release(write_tree(tmp_path)) as rel:
        assert synth_oracle(rel).flash_attn_version(O.FaQuery((9, 0), 128, 128))["version"] == 3


def test_mla_walk_refusals_and_flash_attn_constructor(tmp_path):
    with R.open_release(write_tree(tmp_path)) as rel:
        o = synth_oracle(rel)
        r = o.mla_prefill(O.MlaQuery((10, 0), (128, 64, 128), "bfloat16"))
        assert (r["priorities"], r["backend"], r["refused"]) == (["TRTLLM_RAGGED", "FLASH_ATTN"], "TRTLLM_RAGGED", [])
        r = o.mla_prefill(O.MlaQuery((10, 0), (192, 64, 256), "bfloat16"))
        assert r["backend"] == "FLASH_ATTN" and r["refused"] == [["TRTLLM_RAGGED", ["dims"]]]
        assert (r["fa_version"], r["pads_v"]) == (2, True)
        r = o.mla_prefill(O.MlaQuery((9, 0), (128, 64, 128), "float16"))
        assert (r["priorities"], r["backend"], r["fa_version"], r["pads_v"]) == (["FLASH_ATTN"], "FLASH_ATTN", 3, False)


def test_kernel_library_counts_as_installed_only_if_the_release_requires_it(tmp_path):
    with R.open_release(write_tree(tmp_path, flashinfer=False)) as rel:
        r = synth_oracle(rel).mla_prefill(O.MlaQuery((10, 0), (128, 64, 128), "bfloat16"))
        assert r["backend"] == "FLASH_ATTN"
        assert r["refused"] == [["TRTLLM_RAGGED", ["required dependencies not available"]]]
        assert not rel.requires_on_linux("tokenspeed-mla")  # a Darwin-only requirement


def fa_utils_with(old: str, new: str) -> dict:
    """The synthetic release's files with one edit to fa_utils.py."""
    path = "vllm/v1/attention/backends/fa_utils.py"
    return {**SYNTH, path: SYNTH[path].replace(old, new)}


def test_an_import_with_no_stand_in_fails_loudly(tmp_path):
    files = fa_utils_with("import vllm.envs as envs",
                          "import vllm.envs as envs\n        from vllm.engine import something  # noqa")
    with R.open_release(write_tree(tmp_path, files=files)) as rel:
        with pytest.raises(A.OracleError, match="vllm.engine"):
            synth_oracle(rel)


def test_an_env_var_without_a_default_fails_loudly(tmp_path):
    files = fa_utils_with("if envs.VLLM_BATCH_INVARIANT:", "if envs.VLLM_SOMETHING_NEW:")
    with R.open_release(write_tree(tmp_path, files=files)) as rel:
        with pytest.raises(A.OracleError, match="VLLM_SOMETHING_NEW"):
            synth_oracle(rel).flash_attn_version(O.FaQuery((9, 0), 128, 128))


def test_a_file_that_differs_from_the_record_is_refused(tmp_path):
    root = write_tree(tmp_path)
    p = root / "vllm/v1/attention/backends/fa_utils.py"
    p.write_text(p.read_text() + "\n# edited\n")
    with R.open_release(root) as rel, pytest.raises(A.OracleError, match="RECORD"):
        synth_oracle(rel)


def test_a_wheel_file_works_like_its_tree(tmp_path):
    root = write_tree(tmp_path / "tree")
    whl = tmp_path / "vllm-9.9.9-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(root).as_posix())
    with R.open_release(whl) as rel:
        assert rel.wheel_name == whl.name and rel.wheel_sha256 == hashlib.sha256(whl.read_bytes()).hexdigest()
        assert synth_oracle(rel).flash_attn_version(O.FaQuery((9, 0), 128, 128))["version"] == 3
        extracted = rel.root
    assert not extracted.exists()  # the temporary extraction is removed


def test_not_a_release(tmp_path):
    (tmp_path / "x.whl").write_text("not a zip")
    for p in (tmp_path / "x.whl", tmp_path):
        with pytest.raises(A.OracleError), R.open_release(p):
            pass


# --- `attnmatrix vllm-answers` ---------------------------------------------------------------------------------

def test_cli_writes_answers_and_refuses_a_foreign_file(tmp_path, monkeypatch):
    root = write_tree(tmp_path / "tree")
    monkeypatch.setattr(N, "EXECUTED", SYNTH_EXECUTED)
    monkeypatch.setattr(O, "fa_queries", lambda: [O.FaQuery((9, 0), 128, 128), O.FaQuery((8, 0), 64, 64)])
    monkeypatch.setattr(O, "mla_queries", lambda: [O.MlaQuery((10, 0), (128, 64, 128), "bfloat16")])
    monkeypatch.setattr(O, "backend_queries", lambda: [])  # the synthetic tree has no CUDA platform module
    out = tmp_path / "answers.json"
    r = CliRunner().invoke(main, ["vllm-answers", "--wheel", str(root), "-o", str(out)])
    assert r.exit_code == 0, r.output
    a = A.load_answers(out)
    assert [x["version"] for x in a.doc["flash_attn_version"]] == [2, 3]  # sorted by capability
    assert {f["path"] for f in a.doc["executed_files"]} >= {"vllm/v1/attention/backends/fa_utils.py"}
    assert all(f["in_record"] for f in a.doc["executed_files"])
    foreign = tmp_path / "foreign.json"
    foreign.write_text("[]")
    r = CliRunner().invoke(main, ["vllm-answers", "--wheel", str(root), "-o", str(foreign)])
    assert r.exit_code == 2 and "not a vLLM answers file" in r.output and foreign.read_text() == "[]"
