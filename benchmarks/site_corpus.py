"""Benchmark: runtime sites of real shapes from a real vLLM release's files (see
tests/helpers/site_corpus.py for the shapes): applied, compared with a plain replacement, compiled,
reverted.

Last line: sites=<n> identical=<n> compile_broken=<n> revert_exact=<n>/<n>

    python benchmarks/site_corpus.py [--vllm 0.20.0] [--limit 30] [-v]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers.site_corpus import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    main()
