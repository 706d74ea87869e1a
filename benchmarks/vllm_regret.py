"""Selection regret of attnmatrix's and vLLM's choices on the embedded matrix, and how often they agree.

The same figures as `site/vllm-comparison.md` (attnmatrix/engines/vllm/comparison.py), as plain text: per arch and
op, the measured cells (at least two validated, timed backends), attnmatrix's regret (1.00 by construction)
and vLLM's (where its pick is measured), then per arch and decision the agreement counts.

usage: python benchmarks/vllm_regret.py [RESULT FILES...]   (extra result files are merged with the embedded matrix)
"""

from __future__ import annotations

import sys

from attnmatrix.matrix.evidence import load_evidence
from attnmatrix.matrix.policy import resolve

from attnmatrix.engines.vllm.comparison import print_regret


def main() -> None:
    print(print_regret(resolve(load_evidence(sys.argv[1:]))))


if __name__ == "__main__":
    main()
