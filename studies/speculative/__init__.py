"""Decoding trained models: self-speculative decoding against plain decoding and fairseq's
transformer (``scripts/speculative.py``: :mod:`.measure`, the page :mod:`.report`), and each
step compiled against fairseq's search (``scripts/compiled_decoding.py``: :mod:`.compiled`)."""
