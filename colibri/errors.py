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


# ---- the C runtime through colibri.runtime -------------------------------------

class LibraryNotFoundError(ColibriError):
    """colibri.runtime found no usable libcolibri.so (none built, or one
    built from another version of colibri.h): the message says where it
    looked and how to build it."""


class RuntimeCallError(ColibriError):
    """A call of the C runtime (libcolibri, through colibri.runtime) returned
    a negative code. Attributes: `code` (the colibri.h code), `strerror`
    (colibri_strerror_for(code, call): -1 has one meaning per call), `detail`
    (colibri_error_detail of the instance: the field, tensor or value; may be
    ""), `call` ("init" or "infer"). Each code has its subclass
    (RUNTIME_ERRORS); the init-time file errors are also the matching
    FormatError subclasses, so `except FormatError` catches a bad file from
    either engine. `advice`: what to do, which the CLI adds to the line
    (colibri-cli's advice() for the same code)."""
    code = None
    advice = ""

    def __init__(self, code: int, strerror: str, detail: str = "", call: str = "init",
                 where: str = ""):
        self.code, self.strerror, self.detail, self.call = code, strerror, detail, call
        msg = f"{where}: " if where else ""
        msg += strerror
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class BadFormatError(RuntimeCallError, FormatError):
    """-1 at init (COLIBRI_E_BAD_FORMAT): not a valid .colibri file."""
    code = -1

    @property
    def advice(self) -> str:
        # a GGUF file's detail already says how to convert it; copying it
        # again would not help
        if "colibri convert" in self.detail:
            return ""
        return "copy it again, or re-create it with `colibri convert`"


class InputTooLargeError(RuntimeCallError):
    """-1 at infer (COLIBRI_E_INPUT_TOO_LARGE): batch > max_batch, seq >
    max_seq_len or n_past + seq > max_seq_len."""
    code = -1
    advice = "shorten the input, or re-convert with a larger --max-seq-len/--max-batch"


class OutOfMemoryError(RuntimeCallError):
    """-2 (COLIBRI_E_NO_MEMORY): malloc failed (arena, file copy, byte swap),
    or a memory budget (ram_bytes) too small for what it must hold."""
    code = -2
    advice = ("free memory or use a smaller model; with a memory budget (--ram), raise it "
              "to at least the size above")


class RuntimeCRCError(RuntimeCallError, CRCError):
    """-3 (COLIBRI_E_CRC): a header, table or section CRC does not match."""
    code = -3
    advice = "copy or convert the file again"


class RuntimeIOError(RuntimeCallError, FileReadError):
    """-4 (COLIBRI_E_IO): open, stat, mmap or read failed."""
    code = -4
    advice = "check the path and permissions"


class RuntimeVersionError(RuntimeCallError, VersionError):
    """-5 (COLIBRI_E_VERSION): the file's format version is newer."""
    code = -5
    advice = "upgrade colibri"


class ByteOrderError(RuntimeCallError):
    """-6 (COLIBRI_E_BYTE_ORDER): in-place use of a file in the other byte order."""
    code = -6
    advice = "convert with `colibri convert --byte-order` for this host"


class ArgumentError(RuntimeCallError):
    """-7 (COLIBRI_E_ARG): a bad argument (batch or seq 0, a mask value other
    than 0/1, wrong shapes; the detail names it)."""
    code = -7


class TokenError(RuntimeCallError):
    """-8 (COLIBRI_E_TOKEN): a token id < 0 or >= vocab."""
    code = -8
    advice = "use token ids below the model's vocab"


class ArenaTooSmallError(RuntimeCallError):
    """-9 (COLIBRI_E_ARENA_TOO_SMALL): the arena is below colibri_arena_size."""
    code = -9


class AlignmentError(RuntimeCallError):
    """-10 (COLIBRI_E_ALIGN): blob or arena misaligned."""
    code = -10


class KVStateError(RuntimeCallError):
    """-11 (COLIBRI_E_KV_STATE): n_past beyond the cached tokens, or another
    batch than the cached one."""
    code = -11


class UnsupportedError(RuntimeCallError):
    """-12 (COLIBRI_E_UNSUPPORTED): not available in this build."""
    code = -12


class NotInitializedError(RuntimeCallError):
    """-13 (COLIBRI_E_NOT_INIT): the model was never initialised or is closed."""
    code = -13


class TokenizerCallError(RuntimeCallError):
    """A tokenizer or sampler call of the C runtime (colibri_tokenizer.h,
    colibri_sample.h, through Model.tokenize / detokenize / generate)
    returned a code of its own (-30 .. -34): `strerror` is
    colibri_tok_strerror's text, `call` "tokenize", "detokenize" or
    "sample"."""


class NoTokenizerError(TokenizerCallError):
    """-30 (COLIBRI_E_TOK_NONE): the file has no tokenizer section (convert
    the checkpoint with its tokenizer.json to get one)."""
    code = -30


class TokenizerFormatError(TokenizerCallError, FormatError):
    """-31 (COLIBRI_E_TOK_FORMAT): the file's tokenizer section is malformed."""
    code = -31


class TokenBufferError(TokenizerCallError):
    """-32 (COLIBRI_E_TOK_BUFFER): an output buffer too small (the binding
    retries with the size C asks for, so this only escapes on a library bug)."""
    code = -32


class TextUTF8Error(TokenizerCallError):
    """-33 (COLIBRI_E_TOK_UTF8): the text is not valid UTF-8."""
    code = -33


class NoBosError(TokenizerCallError):
    """-34 (COLIBRI_E_TOK_NO_BOS): add_bos asked, the tokenizer has no bos."""
    code = -34


TOKENIZER_ERRORS = {cls.code: cls for cls in (NoTokenizerError, TokenizerFormatError,
                                              TokenBufferError, TextUTF8Error, NoBosError)}


# (code, call) -> class; call None: the same class for both calls.
RUNTIME_ERRORS = {
    (-1, "init"): BadFormatError, (-1, "infer"): InputTooLargeError,
    **{(cls.code, None): cls for cls in (
        OutOfMemoryError, RuntimeCRCError, RuntimeIOError, RuntimeVersionError,
        ByteOrderError, ArgumentError, TokenError, ArenaTooSmallError, AlignmentError,
        KVStateError, UnsupportedError, NotInitializedError)},
}


def runtime_error_class(code: int, call: str) -> type:
    """The RuntimeCallError subclass of a C return code (RuntimeCallError
    itself for a code this package does not know)."""
    return RUNTIME_ERRORS.get((code, call)) or RUNTIME_ERRORS.get((code, None)) \
        or RuntimeCallError
