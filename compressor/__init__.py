"""Compression and deployment optimizer for pretrained NLP encoders."""

__version__ = "0.1.0"
