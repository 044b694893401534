"""Dataset preparation for recurnmt.

Commands (run as modules):

* ``python -m data_prep.embedded``: the shipped LibreOffice-help German-English corpus
  (``build`` rebuilds it from Debian packages, ``prepare`` binarizes the shipped copy).
* ``python -m data_prep.iwslt14``: IWSLT14 De-En through the Hugging Face ``datasets`` library.
* ``python -m data_prep.wmt14``: WMT14 En-De through the Hugging Face ``datasets`` library.

Shared pieces: :mod:`data_prep.atomic` (temp dir + atomic rename), :mod:`data_prep.checksums`
(sha256 manifests), :mod:`data_prep.segment` (sentencepiece / BPE), :mod:`data_prep.binarize`
(``fairseq-preprocess`` with a joined dictionary) and :mod:`data_prep.cleaning` (pair filters).
"""
