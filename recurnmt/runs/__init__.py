"""Running experiments: everything between a model and a number in a table.

The models and their fairseq integration live in :mod:`recurnmt.nmt` and
:mod:`recurnmt.vision`; this package runs them and reads what they wrote. It may import
``recurnmt.nmt`` (lazily where fairseq is heavy), never the reverse.

* :mod:`.commands`: fairseq's tools, the ``--user-dir`` shim, option mappings as flags, and
  running commands in order;
* :mod:`.experiment`: the training and translation commands of the scripts that compare
  models, their shared recipe and the reading of their logs;
* :mod:`.launch`: ``recurnmt-train-nmt``, multi-process ``fairseq-train`` on CPUs or GPUs;
* :mod:`.recipe`, :mod:`.presets`: ``recurnmt-run-nmt-recipe``, the papers' recipes
  (``configs/nmt/``) and the datasets' standard settings;
* :mod:`.evaluation`, :mod:`.averaging`, :mod:`.evaluate`, :mod:`.scoring`:
  ``recurnmt-evaluate-nmt`` (checkpoint averaging, ``fairseq-generate``, BLEU into
  ``result.json``);
* :mod:`.results`: ``recurnmt-results-nmt``, the table of every ``result.json``;
* :mod:`.benchmark`, :mod:`.memory`, :mod:`.timed`: the benchmark scripts' harness (workers
  taking turns, FLOPs, memory on a CPU) and commands run against a wall-clock budget
  (``make gpu-check``).

Nothing is imported here: :mod:`.timed` must import with the standard library alone.
"""
