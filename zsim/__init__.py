"""zsim: a digital twin of GPU training clusters for ZeRO-style training."""

__version__ = "0.1.0"
