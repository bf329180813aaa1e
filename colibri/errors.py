"""Exceptions the colibri package raises for problems a user can act on.

The CLI turns a ColibriError into one line (`colibri: error: ...`) and a
non-zero exit status; anything else is a bug and keeps its traceback.
"""


class ColibriError(Exception):
    """A problem with the user's input or environment, with a message that says
    what is wrong and, where possible, what to do."""


class FormatError(ColibriError):
    """A .colibri file is malformed: the message names the field or tensor and
    the value found."""


class CRCError(FormatError):
    """A section's or the header's CRC32 does not match its bytes."""


class ConversionError(ColibriError):
    """A Hugging Face checkpoint cannot be converted (missing or unexpected
    tensors, shape mismatches, unsupported architecture...)."""
