"""fairseq ``--user-dir`` entry point: ``fairseq-train ... --user-dir user_dir``.

All code lives in the installed ``recurnmt`` package; importing it registers the models.
"""

import recurnmt.nmt  # noqa: F401
