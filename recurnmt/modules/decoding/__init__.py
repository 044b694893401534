"""Decoding in one place: every loop that decodes a recurnmt decoder step by step.

What a loop asks of a model is one small protocol,
:class:`~recurnmt.modules.decoding.protocol.DecodingSide` (embed a step, run levels i..j over a
cache, read logits, keep rows); the front ends (fairseq's generators in ``recurnmt.nmt``, the
``transformers`` model's ``generate()`` in ``recurnmt.hf``) make one and translate their own
calling convention, nothing else. The package, bottom up:

* :mod:`.kv_cache` (:class:`KVCache`: one attention's keys and values, grown in place),
  :mod:`.session` (the per-level state of one decoding) and :mod:`.cache`
  (:class:`StackCache`: a stack's caches, reordered and truncated as one);
* :mod:`.static_cache` (:class:`StaticStackCache`: buffers of fixed shape, a position on the
  device) and :mod:`.static_steps` (a step over fixed buffers, run eagerly, compiled by
  ``torch.compile`` or replayed as a CUDA graph), :mod:`.compiled` (one compiled function per
  model and setting);
* :mod:`.speculative` (self-speculative decoding: drafts from the first levels, verified by
  the rest), :mod:`.rules` (how log-probabilities become the distribution a token is chosen
  from: lengths, temperature, top-k, top-p);
* :mod:`.exits` (per-row exits: rows leave a step's level loop early, the rest run on
  compacted, the skipped levels' keys and values from the exit state);
* :mod:`.options` (the decoding options, declared once: each front end renders its own
  spelling).

The submodules are imported where they are used (``from recurnmt.modules.decoding.cache
import StackCache``): the block library's attention holds a :class:`KVCache`, and the loops
hold the block library's stack, so this package's own import loads none of them.
"""
