"""voxflow: a serving engine for speech-generating models."""
__version__ = "0.1.0"
