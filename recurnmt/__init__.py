"""recurnmt: recurrent, weight-shared Transformers for translation and vision.

``recurnmt.modules`` holds the pure-PyTorch blocks, ``recurnmt.nmt`` the fairseq plugin,
``recurnmt.vision`` the image models and ``recurnmt.analysis`` the measurement tools.
"""

__version__ = "0.1.0"
