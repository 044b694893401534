"""Results table (markdown) and bar chart (PNG) across architectures.

A thin wrapper of :mod:`recurnmt.nmt.results`; reads the ``result.json`` files that the
evaluations write::

    python scripts/results_nmt.py runs/ --markdown runs/results.md --png runs/results.png
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recurnmt.nmt.results import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
