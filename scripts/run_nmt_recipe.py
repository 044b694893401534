"""Run a paper recipe of ``configs/nmt/`` (train, then evaluate) with one command.

A thin wrapper of :mod:`recurnmt.nmt.recipe`::

    python scripts/run_nmt_recipe.py list
    python scripts/run_nmt_recipe.py show ringformer_wmt14
    python scripts/run_nmt_recipe.py run ringformer_wmt14 --dry-run
    python scripts/run_nmt_recipe.py run ringformer_wmt14 --nproc 2 --device cuda
    python scripts/run_nmt_recipe.py run sret_iwslt14 --override train.max_update=1000
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recurnmt.nmt.recipe import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
