"""The relaxed-recursion study (``scripts/relaxed_nmt.py``): its runs and their order
(:mod:`.study`) and its page (:mod:`.report`)."""
