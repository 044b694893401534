"""Serving trained models: recurnmt in PyTorch against CTranslate2 from ``recurnmt-export-ct2``'s
directories (``scripts/deploy_bench.py``: :mod:`.measure`, the page :mod:`.report`)."""
