"""Running the image models: the trainer and its tools, beside :mod:`recurnmt.vision.models` as
:mod:`recurnmt.experiments` stands beside :mod:`recurnmt.nmt`. It imports the models, never the reverse.

What stays in :mod:`recurnmt.vision` is what a model needs to be built, run, saved or converted:
``models/`` and ``layers/``, the registries (``registry.py``, and ``timm_registry.py``, what
``timm.create_model`` calls), ``data/`` (the data sets and their specs, which the analysis tools
and scripts read too), ``checkpoint.py`` (the file a model is saved in and rebuilt from, which the
converter, the analysis tools and distillation read) and ``convert.py`` (the converter, as
``recurnmt.nmt.convert`` stays with its models). What moved here serves training and measuring
only: no model, no registry and no converter imports it.

* :mod:`.train`: ``python -m recurnmt.vision.training.train``, the phases of a run and its loop;
  :mod:`.setup` builds what a run holds (model, data, optimisation, loss), :mod:`.state` holds,
  saves and restores it; :mod:`.arguments` is its command line;
* :mod:`.engine`: one training epoch and one evaluation pass; :mod:`.losses`: the objectives;
  :mod:`.mixed_depth`: SReT's two branches as one module; :mod:`.zero`: ZeRO stage 1;
  :mod:`.distributed`: the process group;
* :mod:`.evaluate`: ``python -m recurnmt.vision.training.evaluate``, a checkpoint's accuracy, cost and
  speed; :mod:`.flops`: multiply-accumulates and throughput;
* :mod:`.budget`: ``python -m recurnmt.vision.training.budget``, a DVT cascade's exit thresholds for a
  compute budget; :mod:`.exits`: every exit's logits and top-1.

Nothing is imported here.
"""
