"""Can a validation problem tell "feature applied" from "feature ignored"?

For each feature a problem asks for, `ignoring(p, feature)` lists the outputs a kernel would return if
it silently dropped that feature, one per plausible way of dropping it (a window's left edge ignored,
a block table ignored, query heads mapped to the wrong KV heads, ...), all computed by the reference.
`feature_effects(p)` measures how far each of them lies from the true answer, in units of the
tolerance `compare()` applies: a margin of 10 means some element is off by ten times what a correct
kernel may be off by. A check whose margin is below `BAR` cannot say no to a kernel that ignores
the feature, and a `pass` it gives says nothing about that feature.

A feature that cannot change the answer by its definition is exempt, with the reason: a causal mask
over one query token at the end of the cache masks nothing (masks are bottom-right aligned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
from attnmatrix.matrix.cases import Case

from attnmatrix.vocabulary import FEATURES

from .problem import RECIPE, VALIDATION_SHAPES, Problem, Recipe, Shape, make_problem
from .reference import TOLERANCES, mask_for, reference_attention

BAR = 10.0  # a feature's effect must reach this many tolerances


@dataclass(frozen=True)
class Effect:
    """How far one way of ignoring one feature moves the answer.

    `margin` is max |ignoring - reference| / (atol + rtol * |reference|) over the compared elements;
    `beyond` counts the elements a kernel that ignored the feature would get wrong.
    """

    feature: str
    variant: str
    margin: float | None
    beyond: int
    elements: int
    exempt: str | None = None

    @property
    def discriminates(self) -> bool:
        return self.exempt is not None or (self.margin is not None and self.margin >= BAR)

    def to_dict(self) -> dict:
        d = {"feature": self.feature, "variant": self.variant, "margin": None if self.margin is None
             else round(self.margin, 2), "beyond": self.beyond, "elements": self.elements}
        if self.exempt:
            d["exempt"] = self.exempt
        return d


def active_features(p: Problem) -> list[str]:
    """The features this problem exercises, in the case space's order (MLA prefill is causal by definition)."""
    on = {
        "causal": p.causal, "sliding_window": p.window is not None, "softcap": bool(p.softcap),
        "alibi": p.alibi_slopes is not None, "sinks": p.sinks is not None, "gqa": p.k.shape[2] != p.q.shape[2],
        "varlen": p.seqlens_q is not None or p.seqlens_k is not None, "paged_kv": p.page_size is not None,
        "fp8": p.fp8 and p.q.element_size() == 1, "fp8_kv": p.fp8 and p.q.element_size() != 1,
    }
    # `qk_rope:<n>` names how an MLA case's qk head dim splits into nope and rope parts (which vLLM's MLA
    # backends accept or refuse); the attention over the whole qk head dim is the same, so it is no feature a
    # kernel could ignore.
    return [f for f in FEATURES if on.get(f)]


# --- the ways a kernel can ignore each feature ---------------------------------------------------------

Output = Callable[[torch.dtype], torch.Tensor]


def _ref(p: Problem) -> Output:
    return lambda dtype: reference_attention(p, dtype=dtype)


def _as_one_sequence(p: Problem) -> Output:
    """cu_seqlens ignored: the packed tokens of the whole batch attended as one sequence."""

    def out(dtype: torch.dtype) -> torch.Tensor:
        q, k, v, _, _ = p.packed()
        one = Shape("packed", 1, q.shape[0], k.shape[0], p.shape.heads_q, k.shape[1], p.shape.window)
        flat = replace(p, shape=one, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), seqlens_q=None,
                       seqlens_k=None)
        return p.unpack(reference_attention(flat, dtype=dtype)[0])

    return out


def _paged_in_storage_order(p: Problem) -> Problem:
    """The block table ignored: each sequence's pages read in the cache's storage order."""
    k_cache, v_cache, _ = p.paged_kv()
    b, sk = p.shape.batch, p.k.shape[1]

    def unpaged(cache: torch.Tensor) -> torch.Tensor:
        return cache.reshape(b, -1, *cache.shape[2:])[:, :sk]

    return replace(p, k=unpaged(k_cache), v=unpaged(v_cache))


def _window_without_left_edge(p: Problem) -> Problem:
    assert p.window is not None
    return replace(p, window=None, causal=p.causal or p.window[1] == 0)


def _heads_tiled(p: Problem) -> Problem:
    ratio = p.q.shape[2] // p.k.shape[2]
    return replace(p, k=p.k.repeat(1, 1, ratio, 1), v=p.v.repeat(1, 1, ratio, 1))


def ignoring(p: Problem, feature: str) -> list[tuple[str, Output]]:
    """(variant, output) for each plausible way a kernel ignores `feature` of `p`."""
    if feature == "causal":
        return [("no causal mask", _ref(replace(p, causal=False)))]
    if feature == "sliding_window":
        return [("window's left edge ignored", _ref(_window_without_left_edge(p)))]
    if feature == "softcap":
        return [("no softcap", _ref(replace(p, softcap=0.0)))]
    if feature == "alibi":
        return [("no ALiBi bias", _ref(replace(p, alibi_slopes=None)))]
    if feature == "sinks":
        return [("no sink logits", _ref(replace(p, sinks=None)))]
    if feature == "gqa":
        return [("query head h reads KV head h mod n_kv", _ref(_heads_tiled(p)))]
    if feature == "varlen":
        out = [("sequence boundaries ignored", _as_one_sequence(p))]
        if p.shape.seqlen_q == 1:  # a decode kernel reads a padded cache: lengths ignored means reading all of it
            out.append(("cache lengths ignored", _ref(replace(p, seqlens_q=None, seqlens_k=None))))
        return out
    if feature == "paged_kv":
        return [("block table ignored", _ref(_paged_in_storage_order(p)))]
    if feature in ("fp8", "fp8_kv"):
        return [("descales ignored", _ref(replace(p, descale=None)))]
    raise KeyError(f"no way to ignore unknown feature {feature!r}")


def _exemption(p: Problem, feature: str) -> str | None:
    """Why `feature` cannot change this problem's answer by definition, or None."""
    if feature == "causal" and p.window is None:
        dev = p.q.device
        same = all(bool(mask_for(p, p.valid_q(b), p.valid_k(b), dev).all()) for b in range(p.shape.batch)
                   if p.valid_q(b) > 0)
        if same:
            return "every query is at the end of its keys: a bottom-right causal mask masks nothing"
    return None


# --- measuring -------------------------------------------------------------------------------------------

def _valid_rows(p: Problem, t: torch.Tensor) -> torch.Tensor:
    if p.seqlens_q is None:
        return t.reshape(-1)
    return torch.cat([t[b, : p.valid_q(b)].reshape(-1) for b in range(p.shape.batch)])


def effect_of(p: Problem, ref: torch.Tensor, feature: str, variant: str, other: torch.Tensor) -> Effect:
    tol = TOLERANCES["fp8" if p.fp8 else p.case.dtype]
    r, o = _valid_rows(p, ref.double()), _valid_rows(p, other.double())
    ratio = (o - r).abs() / (tol["atol"] + tol["rtol"] * r.abs())
    return Effect(feature, variant, float(ratio.max()), int((ratio > 1).sum()), r.numel())


def feature_effects(p: Problem, *, dtype: torch.dtype = torch.float32,
                    features: Iterable[str] | None = None) -> list[Effect]:
    """The effect of every way of ignoring every feature `p` exercises (or of `features`)."""
    ref = reference_attention(p, dtype=dtype)
    out = []
    for feature in features if features is not None else active_features(p):
        why = _exemption(p, feature)
        if why:
            out.append(Effect(feature, "-", None, 0, 0, exempt=why))
            continue
        for variant, output in ignoring(p, feature):
            out.append(effect_of(p, ref, feature, variant, output(dtype)))
    return out


def validation_effects(case: Case, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                       recipe: Recipe = RECIPE, device: str = "cpu") -> list[Effect]:
    """`feature_effects` of the problem `probe_case` validates `case` on (same shape, seed and recipe).
    The values are drawn on the CPU whatever `device` computes the references."""
    p = make_problem(case, VALIDATION_SHAPES[case.op], seed=seed, recipe=recipe, device=device)
    return feature_effects(p, dtype=dtype)


def blind_features(case: Case, *, seed: int = 0, recipe: Recipe = RECIPE, device: str = "cpu") -> list[Effect]:
    """The effects of `case`'s validation that fall under the bar: what a `pass` of it cannot vouch for."""
    return [e for e in validation_effects(case, seed=seed, recipe=recipe, device=device) if not e.discriminates]


def weakest(cases: Iterable[Case], *, recipe: Recipe = RECIPE, device: str = "cpu") -> dict[tuple, tuple]:
    """Per (feature, op, dtype): the smallest margin over `cases` and the case it came from (exempt
    features are listed with margin None only where no case measured them)."""
    worst: dict[tuple, tuple] = {}
    for case in cases:
        for e in validation_effects(case, recipe=recipe, device=device):
            k = (e.feature, case.op, case.dtype)
            if e.exempt:
                worst.setdefault(k, (None, case.key, e.exempt))
            elif k not in worst or worst[k][0] is None or e.margin < worst[k][0]:
                worst[k] = (e.margin, case.key, e.variant)
    return worst


def main(argv: list[str] | None = None) -> int:
    """Print the weakest margin of every feature x op x dtype over the standard case space."""
    import argparse

    from attnmatrix.kernels.problem import RECIPES
    from attnmatrix.matrix.cases import case_space

    ap = argparse.ArgumentParser(prog="python -m attnmatrix.kernels.sensitivity", description=main.__doc__)
    ap.add_argument("--recipe", type=int, default=RECIPE.version, choices=sorted(RECIPES))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    worst = weakest(case_space(["cpu"], ["x"]), recipe=RECIPES[args.recipe], device=args.device)
    print(f"validation problem version {args.recipe}: weakest margin (x tolerance, bar {BAR:g}) per feature, op, dtype")
    under = 0
    for (feature, op, dtype), (margin, key, how) in sorted(worst.items()):
        shown = "exempt" if margin is None else f"{margin:8.1f}"
        under += margin is not None and margin < BAR
        print(f"{feature:15} {op:12} {dtype:9} {shown:>8}  {key.split('/', 2)[2]}  ({how})")
    print(f"{under} of {len(worst)} under the bar")
    return 1 if under else 0


if __name__ == "__main__":
    raise SystemExit(main())
