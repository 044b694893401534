"""recurnmt: recurrent, weight-shared Transformers for translation and vision.

``recurnmt.modules`` holds the pure-PyTorch blocks, ``recurnmt.nmt`` the fairseq plugin,
``recurnmt.vision`` the image models (``recurnmt.vision.training`` their trainer and evaluation),
``recurnmt.analysis`` the measurement tools and ``recurnmt.experiments`` what runs experiments
(fairseq command lines, launcher, recipes, evaluation, results, the benchmark harness).
"""

__version__ = "0.1.0"
