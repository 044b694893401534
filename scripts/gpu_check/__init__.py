"""``make gpu-check``: recurnmt on a GPU within a time budget, as one report.

Time on a rented or shared GPU is short, and the first thing a check does there is install,
so the whole check runs within ``--budget`` seconds of wall time (default 480: 8 minutes on one
H100/H200, installation included). On a CUDA machine it

1. builds ``.venv-gpu`` on the CUDA torch already installed: a virtual environment of
   ``--python`` (default: this interpreter) that also sees that interpreter's packages (a
   ``.pth`` file; plain ``--system-site-packages`` would miss a torch that lives in another
   virtual environment), so the machine's own torch, torchvision and numpy are kept, whatever
   their versions. Only what is missing is installed, at the versions of
   requirements/lock.txt, from the package index or, with ``--wheels DIR``, from that folder
   alone (GPU machines often reach no index: ``make gpu-wheels`` fills one,
   ``scripts/gpu_wheels.py``). Where no torch is installed at all, the pinned torch's CUDA
   wheel comes from the index (``--torch-index-url``);
2. then the steps, in this order, each with a share of the budget left when it starts (an
   early step that runs long shortens the later ones; a step left less than 20 s is not
   started, and the report says so):

   - ``decode``: beam-search generation of every family against fairseq's transformer at
     base size (``scripts/profile_decoding.py --no-profile``: all models in one process, their
     timed rounds alternating; about 55 s on an H100), first because it is quick and what the
     speed targets are most about; ``--decode base-b4 iwslt-b4 base-b1`` adds the
     ``*_iwslt_de_en`` size and greedy search (beam 1), each a step of its own;
   - ``fairseq``: the real ``fairseq-train`` and ``fairseq-generate`` of fairseq's
     ``transformer`` and ``ringformer`` at base size on 2,000 pairs of the embedded corpus
     (``scripts/fairseq_speed.py``; steady state: the second epoch is timed, every batch
     shape having been met in the first);
   - ``nmt``: ``scripts/benchmark_nmt.py`` at base size (H=512, FF=2048, 8 heads, 6 levels)
     in every ``--dtypes`` (default fp16; ``--dtypes fp16 bf16`` adds bf16 to every step);
   - ``tests``: ``pytest -m cuda`` (in parallel where pytest-xdist is installed); stopped at
     its limit, the tests that ran are counted;
   - ``vision``: ``scripts/benchmark_vision.py`` at ViT-S/16 (D=384, FF=1536, 6 heads, 12
     levels, 224 px) in every ``--dtypes``.

   The step counts are sized to the budget (``--budget 960`` measures twice as many steps);
3. streams every command's output to the terminal and to a log (``--log``, default the
   report's ``.log``), and writes the markdown report (``--out``, default
   ``docs/gpu_check.md``) and its ``.json`` after every step, so that a run stopped at any
   point leaves every figure measured so far: device, Python, torch, CUDA and the other
   versions, the tests' result, and the tables of ratios to fairseq's ``transformer`` and to
   timm's ViT, each next to its target (issue 13): training tokens/s of every weight-shared
   family >= 1.0x the transformer in fp16, generation (beam 4) >= 1.0x, and the
   cross-attention part of the decoder cache at most M/N of the transformer's for M unique
   cross-attentions over N levels (1/N for a fully shared decoder).

Without a CUDA device it stops at once. ``--cpu-smoke`` runs the steps but the tests on the CPU
at a tiny size (fairseq in fp32, the benchmarks in bf16; no environment), to check the
pipeline, the budget and the report anywhere.

    make gpu-check                                   # python3's CUDA torch, index for the rest
    make gpu-check PYTHON=/opt/torch/.venv/bin/python3 WHEELS=wheels   # no index
    make gpu-check GPU_CHECK_FLAGS="--budget 900"    # more time, more steps measured
    python -m scripts.gpu_check --cpu-smoke --out work/gpu_check.md

It runs before recurnmt is installed, with the machine's own Python: ``python -m
scripts.gpu_check`` from the repository's root puts that root first on the import path, so
the standard-library-only modules it shares with the package (``recurnmt.cli``,
``recurnmt.experiments.artifacts``, ``recurnmt.experiments.timed``) import from the checkout.

Its modules: ``environment.py`` (1. above), ``steps.py`` (2.), ``report.py`` (the report of
3.), and ``__main__.py``, the command line that runs them in turn.
"""
