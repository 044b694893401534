"""Running experiments: everything between a model and a number in a table.

The models and their fairseq integration live in :mod:`recurnmt.nmt` and
:mod:`recurnmt.vision`; this package runs them and reads what they wrote. It may import
``recurnmt.nmt`` (lazily where fairseq is heavy), never the reverse. The image models' trainer
and its commands are the image front end's own such package, :mod:`recurnmt.vision.training`.

* :mod:`.commands`: the one spelling of a ``fairseq-train`` / ``fairseq-generate`` command line
  (the ``--user-dir`` shim, option mappings as flags), and running commands in order or logged;
* :mod:`.experiment`: the small experiments of the scripts that compare models (demo,
  ``compare_nmt``, ``depth_sweep``, ``fairseq_speed``): model-size flags, one training recipe,
  test-set decoding, and the command-line options that set them;
* :mod:`.fairseq_log`: the one reader of fairseq's training and generation logs;
* :mod:`.launch`: ``recurnmt-train-nmt``, multi-process ``fairseq-train`` on CPUs or GPUs;
* :mod:`.recipe`, :mod:`.presets`: ``recurnmt-run-nmt-recipe``, the papers' recipes
  (``configs/nmt/``) and the datasets' standard settings;
* :mod:`.evaluation`, :mod:`.averaging`, :mod:`.scoring`:
  ``recurnmt-evaluate-nmt`` (checkpoint averaging, ``fairseq-generate``, BLEU into
  ``result.json``);
* :mod:`.results`: ``recurnmt-results-nmt``, the table of every ``result.json``;
* :mod:`.benchmark`, :mod:`.memory`, :mod:`.timed`: the benchmark scripts' harness (workers
  taking turns, FLOPs, memory on a CPU) and commands run against a wall-clock budget
  (``make gpu-check``).

Nothing is imported here: :mod:`.timed` must import with the standard library alone.
"""
