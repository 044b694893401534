"""The repository's own commands, outside the installed package.

Each runs as ``python scripts/NAME.py`` (the package installed, as ``make setup`` installs it)
and none changes ``sys.path``, but the ones that drive a study of ``studies/`` (the checkout's
own, not installed), which put the checkout's root first with one line before their imports
(tests/test_scripts.py). The ones that run before anything is installed import only the
standard library (``setup_env.py``, ``compat.py``, ``gpu_wheels.py``), or run as ``python -m
scripts.gpu_check`` from the repository's root, which puts the checkout on the import path.
This file makes ``scripts`` a regular package, so that ``-m scripts.NAME`` finds this folder
before any installed distribution that ships a top-level ``scripts``.
"""
