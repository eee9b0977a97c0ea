"""The error a conversion raises for a checkpoint it cannot turn into an artifact."""

from __future__ import annotations


class ConversionError(Exception):
    """A Hugging Face checkpoint directory is malformed or cannot be converted.

    The message names the file, tensor or config key at fault and what was expected.
    """
