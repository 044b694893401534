"""Train a translation model on one process, several GPUs of one node, or several nodes.

A thin wrapper of :mod:`recurnmt.nmt.launch`: arguments before ``--`` choose the processes,
the ones after it go to ``fairseq-train``. The launcher adds the flags that work (CPU: gloo
and legacy_ddp; GPUs: nccl) and refuses fairseq's silent failure modes before starting.

    # one process (CPU or the first GPU)
    python scripts/train_nmt.py -- DATA --user-dir user_dir --arch ringformer_tiny ...
    # two CPU processes (gloo)
    python scripts/train_nmt.py --nproc 2 --device cpu -- DATA ...
    # 8 GPUs of one node through torchrun
    python scripts/train_nmt.py --nproc 8 --launcher torchrun -- DATA ...
    # two nodes with 8 GPUs each: run on both, with --node-rank 0 and 1
    python scripts/train_nmt.py --nnodes 2 --node-rank 0 --nproc 8 \\
        --master-addr node0 --master-port 29500 -- DATA ...

For the papers' recipes, ``scripts/run_nmt_recipe.py run RECIPE`` builds these arguments.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recurnmt.nmt.launch import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
