"""Exceptions the colibri package raises for problems a user can act on.

The CLI turns a ColibriError into one line (`colibri: error: ...`) and its
`exit_status` (2 unless a command says otherwise); anything else is a bug and
keeps its traceback.
"""


class ColibriError(Exception):
    """A problem with the user's input or environment, with a message that says
    what is wrong and, where possible, what to do."""
    exit_status = 2


class FormatError(ColibriError):
    """A .colibri file is malformed: the message names the field or tensor and
    the value found."""


class CRCError(FormatError):
    """A section's or the header's CRC32 does not match its bytes."""


class FileReadError(FormatError):
    """A .colibri file cannot be read at all (missing, no permission, a
    directory): nothing is known about its content. A FormatError subclass so
    that callers catching FormatError for "no usable model" keep working;
    `colibri verify` tells it apart from damage by its exit status."""


class VersionError(FormatError):
    """A .colibri file of a newer format version than this colibri reads: the
    file may be intact, the tool is too old."""


class ConversionError(ColibriError):
    """A Hugging Face checkpoint cannot be converted (missing or unexpected
    tensors, shape mismatches, unsupported architecture...)."""
