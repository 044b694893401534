"""Run by ``.venv-argos/bin/python`` (tests/test_argos_e2e.py): installs an ``.argosmodel``
with Argos Translate's own ``package.install_from_path`` and translates through
``argostranslate.translate``.

Reads JSON from stdin: ``{"package": PATH, "from": CODE, "to": CODE, "lines": [...]}``; writes
JSON to stdout: the installed package folders, each line's translation, the sentences Argos's
splitter made of it, and the splitter's class and model file. Argos's folders come from the
environment (``ARGOS_PACKAGES_DIR``, ``XDG_*``), which the test points at a temporary folder.
This file imports nothing of recurnmt: it runs in Argos's environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    request = json.load(sys.stdin)
    from argostranslate import package, settings, translate

    package.install_from_path(Path(request["package"]))
    installed = sorted(p.name for p in settings.package_data_dir.iterdir())
    translation = translate.get_translation_from_codes(request["from"], request["to"])
    sentencizer = translation.underlying.sentencizer  # a CachedTranslation's PackageTranslation
    out = {
        "packages_dir": str(settings.package_data_dir),
        "installed": installed,
        "splitter": type(sentencizer).__name__,
        "splitter_model": str(getattr(sentencizer, "lang", "")),
        "translations": [
            translate.translate(line, request["from"], request["to"]) for line in request["lines"]
        ],
        "sentences": [sentencizer.split_sentences(line) for line in request["lines"]],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
