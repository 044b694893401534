"""The project's own studies: the runs behind the pages of ``docs/`` and the pages they write.

Each is driven by a script of ``scripts/`` (the command the page names) and imports
``recurnmt`` as a user would, by its public names; nothing of the installed package imports
it, and it is not installed (setup.cfg's packages are ``recurnmt`` and ``data_prep``), so a
script that drives one puts the checkout's root on the import path.

* :mod:`.plan`: a study as a resumable plan of runs, reused while their settings hold, and its
  committed record;
* :mod:`.relaxed`: relaxed recursion against training from scratch (``scripts/relaxed_nmt.py``,
  docs/relaxed_nmt.md);
* :mod:`.speculative`: self-speculative and compiled decoding of trained models
  (``scripts/speculative.py``, ``scripts/compiled_decoding.py``; docs/speculative.md,
  docs/compiled_decoding.md);
* :mod:`.deploy`: the models served by CTranslate2 against PyTorch (``scripts/deploy_bench.py``,
  docs/deploy.md).
"""
