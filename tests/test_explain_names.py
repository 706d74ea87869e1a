"""`attnmatrix explain --names ENGINE`: the answer also in an inference engine's backend names, from the query
engine's data and rule (`Engine.names_of`, `Engine.in_engine_names`), the same on the fast path, `--full` and
`--model`; an engine the data does not name is a usage error."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner, Result

from attnmatrix import selector
from attnmatrix.cli.group import main


def run(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def answer(*args) -> dict:
    r = run("explain", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_order_in_vllms_names_is_the_selectors() -> None:
    a = answer("--arch", "sm_90", "--head-size", "128", "--names", "vllm")
    assert "from" in a  # the fast path: the selector's engine answered
    assert a["names"]["engine"] == "vllm"
    assert a["names"]["order"] == selector.select_backends((9, 0), 128, names="vllm")
    assert len(set(a["names"]["order"])) == len(a["names"]["order"]) > 1
    table = selector._ENGINE.names_of("vllm", "prefill")
    assert a["names"]["backends"] == {b: table[b] for b in a["backends"] if b in table}
    assert not {"fa2", "fa3", "fa4"} & set(a["names"]["backends"])  # upstream builds: vLLM does not run them
    m = answer("--capability", "10.0", "--head-size", "192", "--head-size-v", "128", "--op", "mla_prefill",
               "--names", "vllm")
    assert m["names"]["order"] == selector.select_backends((10, 0), 192, 128, op="mla_prefill", names="vllm")
    assert "names" not in answer("--arch", "sm_90", "--head-size", "128")


def test_the_terminal_answer_says_each_backends_name() -> None:
    r = run("explain", "--arch", "sm_90", "--head-size", "128", "--names", "vllm")
    assert r.exit_code == 0, r.output
    order = ", ".join(selector.select_backends((9, 0), 128, names="vllm"))
    assert f"order in vllm's names: {order} (" in " ".join(r.stdout.split())
    assert "fa4 (not run by vllm): supported" in r.stdout
    assert "vllm_fa3 (vllm: FLASH_ATTN):" in r.stdout


def test_the_names_are_the_engines_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # A name the data gives is the name the CLI says, and an engine the data adds is known to --names.
    names = copy.deepcopy(selector._ENGINE.data["engine_names"])
    names["vllm"]["prefill"]["flashinfer"] = "FLASHINFER_RENAMED"
    names["other"] = {"prefill": {"fa4": "FA4_IN_OTHER"}}
    monkeypatch.setitem(selector._ENGINE.data, "engine_names", names)
    a = answer("--arch", "sm_90", "--head-size", "128", "--names", "vllm")
    assert a["names"]["backends"]["flashinfer"] == "FLASHINFER_RENAMED"
    assert "FLASHINFER_RENAMED" in a["names"]["order"] and "FLASHINFER" not in a["names"]["order"]
    assert answer("--arch", "sm_90", "--head-size", "128", "--names", "other")["names"]["order"] == ["FA4_IN_OTHER"]
    r = run("explain", "--arch", "sm_90", "--head-size", "128", "--names", "sglang")
    assert r.exit_code == 2 and "known: other, vllm" in r.output


def test_an_unknown_engine_is_a_usage_error_naming_the_option() -> None:
    # every form of explain, --full and --model before the matrix is resolved
    for extra in (["--head-size", "128"], ["--head-size", "128", "--full"], ["--model", "llama-3.1-8b"]):
        r = run("explain", "--arch", "sm_90", *extra, "--names", "sglang")
        assert r.exit_code == 2, (extra, r.output)
        assert "--names: unknown engine 'sglang' (known: vllm;" in r.output and not r.stdout.startswith("{"), extra


@pytest.mark.slow
@pytest.mark.parametrize("query", [
    ["--arch", "sm_90", "--head-size", "128"],
    ["--arch", "sm_90", "--head-size", "128", "--gqa", "--op", "decode", "--page-size", "16"],
    ["--capability", "10.0", "--head-size", "192", "--head-size-v", "128", "--op", "mla_prefill"],
])
def test_the_fast_path_and_full_say_the_same_names(query: list[str]) -> None:
    fast, full = answer(*query, "--names", "vllm"), answer(*query, "--names", "vllm", "--full")
    assert "from" in fast and "from" not in full
    assert fast["order"] == full["order"] and fast["names"] == full["names"]


@pytest.mark.slow
def test_model_answers_each_query_in_names() -> None:
    a = answer("--arch", "sm_90", "--model", "llama-3.1-8b", "--names", "vllm")
    queries = [q for ly in a["layers"] for q in ly["queries"]]
    assert queries
    for q in queries:
        assert q["names"]["order"] == selector._ENGINE.in_engine_names("vllm", q["op"], q["order"])
