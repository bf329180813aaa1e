"""The C runtime from Python: a ctypes binding of libcolibri.so.

    from colibri.runtime import Model
    with Model("model.colibri") as m:
        logits = m.infer([[5, 17, 3]])               # float32 [1, 3, vocab]
        nxt = int(logits[0, -1].argmax())
        step = m.infer([[nxt]], n_past=3)            # one decode step, KV cache

No compiler is needed at install time: the shared library is built with the
rest of the C runtime (`python -m colibri.buildsteps.cbuild` writes build/x86_64/
libcolibri.so beside libcolibri.a; `scons target=T` writes build/T/
libcolibri.so for every Linux target) and loaded with ctypes.

Where the library is looked for, first match wins:
  1. an explicit path: `Model(..., library=PATH)` or `load_library(PATH)`;
  2. the environment variable COLIBRI_LIBRARY (a path to libcolibri.so);
  3. the package's own build: <checkout>/build/<host target>/libcolibri.so
     (<checkout> the directory holding this package; host target x86_64,
     aarch64, armv7 or riscv64 after the machine).
Nothing else (no system paths): a library from elsewhere may come from
another colibri.h. A library whose API version or struct sizes differ from
what this module expects is refused (LibraryNotFoundError).

Errors: every negative code of the C library becomes the ColibriError
subclass of colibri.errors.RUNTIME_ERRORS (FormatError subclasses for a bad
file), carrying `code`, `strerror` (colibri_strerror_for, so -1 reads "bad
.colibri file" from init and "input larger than ..." from infer) and the
instance's `detail`. Arguments the C API cannot even express (a 3-D id
array, an id beyond int32, a mask of other shape) raise the same classes
(ArgumentError, TokenError) before any C call. Nothing here aborts the
interpreter; a closed Model raises NotInitializedError.

Text: Model.tokenize / detokenize / generate run the C tokenizer, streaming
detokenizer and sampler (colibri_tokenizer.h, colibri_sample.h) over the
file's tokenizer section: the same ids and text as colibri-cli --prompt. A
file without one raises NoTokenizerError; tokenizer codes (-30 .. -34) are
TokenizerCallError subclasses with colibri_tok_strerror's text.

Threads: Model(path, threads=N, spin=...) or Model.set_threads (colibri_set_threads):
N workers compute each infer and encode, with the bits of one thread.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import errors
from .file.format import DType, ModelShape

ROOT = Path(__file__).resolve().parent.parent
API_VERSION = 1          # COLIBRI_API_VERSION this module is written for
ARENA_ALIGN = 64         # COLIBRI_ARENA_ALIGN
CALL_INIT, CALL_INFER = 0, 1
_HOST_TARGETS = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64",
                 "arm64": "aarch64", "armv7l": "armv7", "riscv64": "riscv64"}


class _Shape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("vocab", "hidden", "intermediate",
                                               "max_seq_len")] + \
               [(n, ctypes.c_uint16) for n in ("n_layers", "n_heads", "n_kv_heads",
                                               "head_dim", "n_experts", "top_k",
                                               "max_batch", "group_size")] + \
               [("rope_theta", ctypes.c_float), ("rms_eps", ctypes.c_float),
                ("n_tensors", ctypes.c_uint32)]


class _Info(ctypes.Structure):
    _fields_ = [("shape", _Shape), ("format_version", ctypes.c_uint16),
                ("file_big_endian", ctypes.c_uint8), ("byte_swapped", ctypes.c_uint8),
                ("dtype_embed", ctypes.c_uint8), ("dtype_attn", ctypes.c_uint8),
                ("dtype_router", ctypes.c_uint8), ("dtype_expert", ctypes.c_uint8),
                ("dtype_lm_head", ctypes.c_uint8),
                ("n_unknown_sections", ctypes.c_uint32), ("file_size", ctypes.c_uint64),
                ("n_params", ctypes.c_uint64), ("arena_bytes", ctypes.c_size_t),
                ("chunk_tokens", ctypes.c_uint32), ("kernels", ctypes.c_char_p),
                ("load_mode", ctypes.c_char_p), ("huge_pages_advised", ctypes.c_uint8),
                ("n_threads", ctypes.c_uint32), ("thread_flags", ctypes.c_uint32),
                ("executor", ctypes.c_uint8), ("kv_dtype", ctypes.c_uint8),
                ("kv_bytes_per_token", ctypes.c_uint64), ("kv_bytes", ctypes.c_uint64),
                ("dtypes_attn", ctypes.c_uint16), ("dtypes_expert", ctypes.c_uint16)]


class _Options(ctypes.Structure):
    """colibri_options (colibri.h): size first, so the library knows which
    fields this binding filled."""
    _fields_ = [("size", ctypes.c_uint32), ("kv_dtype", ctypes.c_uint32),
                ("expert_slots", ctypes.c_uint32), ("slot_policy", ctypes.c_uint32),
                ("ram_bytes", ctypes.c_uint64), ("prefetch", ctypes.c_uint32)]


class _StreamStats(ctypes.Structure):
    """colibri_stream_stats (colibri.h)."""
    _fields_ = [("slots", ctypes.c_uint32), ("policy", ctypes.c_uint32)] + \
               [(n, ctypes.c_uint64) for n in ("slot_bytes", "resident_bytes", "hits",
                                               "misses", "evictions", "bytes_read",
                                               "read_ns", "errors", "wait_ns",
                                               "prefetched", "prefetch_hits",
                                               "prefetch_cancelled")] + \
               [("prefetch", ctypes.c_uint32), ("resident_mapped", ctypes.c_uint32),
                ("mapped", ctypes.c_uint64)]


# colibri_reader.read: (user, offset, dst, n) -> 0 or negative
_READ_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                            ctypes.c_size_t)


class _Reader(ctypes.Structure):
    _fields_ = [("read", _READ_FN), ("user", ctypes.c_void_p), ("size", ctypes.c_uint64)]


# COLIBRI_SLOTS_REUSE (the default), _FREQ, _LRU
SLOT_POLICIES = {"reuse": 2, "freq": 0, "lru": 1}
PREFETCH_DEFAULT = 8   # COLIBRI_PREFETCH_DEFAULT
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# a number, then K, M or G (KiB, MiB, GiB the same), then an optional B:
# colibri-cli's parse_size, so --ram and ram= take the same strings
_SIZE = re.compile(r"(?P<num>[+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:E[-+]?[0-9]+)?)(?:(?P<unit>[KMG])I?)?B?")
_SIZE_MAX = 1.8e19  # what a uint64_t holds, as colibri-cli checks it


def parse_size(value) -> int:
    """Bytes from an int or a string such as "512M", "2G", "1.5G" or
    "512MiB" (powers of 1024), as colibri-cli --ram takes them: at least
    one byte, at most what 64 bits hold."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _SIZE.fullmatch(str(value).strip().upper())
        v = float(m["num"]) * _SIZE_UNITS[m["unit"] or ""] if m else 0.0
        n = int(v) if 1.0 <= v <= _SIZE_MAX else 0
    if not 0 < n <= _SIZE_MAX:
        raise errors.ArgumentError(-7, "bad argument", f"ram={value!r}: a size in bytes, "
                                   "or with K, M or G (512M, 2G)", "init", "")
    return n


PART_NAMES = ("embed", "attn", "router", "experts", "ffn", "norms", "lm_head", "other")


class _WeightBytes(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint64 * len(PART_NAMES)),
                ("dtypes", ctypes.c_uint32 * len(PART_NAMES)),
                ("tensors", ctypes.c_uint32 * len(PART_NAMES))]


KV_DTYPES = {"f32": 0, "i8": 1}                # COLIBRI_KV_F32, COLIBRI_KV_I8


def _options(kv: str, ram=None, slots: int | None = None,
             policy: str = "reuse", prefetch: int = PREFETCH_DEFAULT) -> "_Options":
    if kv not in KV_DTYPES:
        raise errors.ArgumentError(-7, "bad argument", f"kv={kv!r}: choose f32 or i8",
                                   "init", "")
    if policy not in SLOT_POLICIES:
        raise errors.ArgumentError(-7, "bad argument",
                                   f"policy={policy!r}: choose reuse, freq or lru", "init", "")
    if slots is not None and (not isinstance(slots, int) or slots < 1):
        raise errors.ArgumentError(-7, "bad argument", f"slots={slots!r}: a count >= 1",
                                   "init", "")
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch < 2**32:
        raise errors.ArgumentError(-7, "bad argument", f"prefetch={prefetch!r}: a count >= 0",
                                   "init", "")
    return _Options(size=ctypes.sizeof(_Options), kv_dtype=KV_DTYPES[kv],
                    expert_slots=slots or 0, slot_policy=SLOT_POLICIES[policy],
                    ram_bytes=parse_size(ram) if ram is not None else 0, prefetch=prefetch)


class _TokInfo(ctypes.Structure):
    _fields_ = [("n_vocab", ctypes.c_uint32), ("bos_id", ctypes.c_int32),
                ("eos_id", ctypes.c_int32), ("model", ctypes.c_uint8),
                ("pretok", ctypes.c_uint8), ("template_bos", ctypes.c_uint8),
                ("template_eos", ctypes.c_uint8)]


class _SampleParams(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_uint32),
                ("top_p", ctypes.c_float), ("min_p", ctypes.c_float),
                ("repetition_penalty", ctypes.c_float), ("seed", ctypes.c_uint64)]


TOK_ADD_BOS, TOK_PARSE_SPECIAL, TOK_ADD_EOS = 1, 2, 8   # colibri_tokenize flags
THREADS_SPIN = 1                               # colibri_set_threads flag
LOGITS_ALL, LOGITS_LAST = 0, 1                 # colibri_infer_ex logits_mode
DETOK_SKIP_SPECIAL = 1                         # colibri_detok_init flag

_ON_BAD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


@dataclass(frozen=True)
class Info:
    """What colibri_get_info reports about an open model."""
    shape: ModelShape
    n_tensors: int
    format_version: int
    file_big_endian: bool
    byte_swapped: bool
    dtypes: dict            # "embed", "attn", "router", "expert", "lm_head" -> DType
    n_unknown_sections: int
    file_size: int
    n_params: int
    arena_bytes: int
    chunk_tokens: int
    kernels: str            # "ref", "avx2", "avx2-vnni", "neon", "neon-dotprod"
    load_mode: str          # "mmap", "read", "memory", "shared"
    huge_pages_advised: bool
    n_threads: int = 1      # workers computing an infer (colibri_set_threads)
    thread_spin: bool = False  # COLIBRI_THREADS_SPIN: workers never park
    kv: str = "f32"         # the KV cache type: "f32" or "i8"
    kv_bytes_per_token: int = 0  # cache bytes per position of one sequence
    kv_bytes: int = 0       # the whole cache in the arena


class Library:
    """A loaded libcolibri.so with its prototypes declared (load_library)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise errors.LibraryNotFoundError(f"{self.path}: cannot load: {exc}") from None
        try:
            for name in ("colibri_abi_sizeof_model", "colibri_abi_sizeof_info"):
                getattr(lib, name).restype = ctypes.c_size_t
                getattr(lib, name).argtypes = []
            lib.colibri_abi_api_version.restype = ctypes.c_int
            api = lib.colibri_abi_api_version()
            self.sizeof_model = lib.colibri_abi_sizeof_model()
            sizeof_info = lib.colibri_abi_sizeof_info()
        except AttributeError:
            raise errors.LibraryNotFoundError(
                f"{self.path} has no colibri_abi_* functions (src/shared_abi.c): it is not "
                "a libcolibri.so of this version; rebuild it "
                "(python -m colibri.buildsteps.cbuild)") from None
        if api != API_VERSION or sizeof_info != ctypes.sizeof(_Info):
            raise errors.LibraryNotFoundError(
                f"{self.path}: API version {api}, sizeof(colibri_info) {sizeof_info}; this "
                f"binding expects {API_VERSION} and {ctypes.sizeof(_Info)}: rebuild the "
                "library from this checkout (python -m colibri.buildsteps.cbuild)")
        # The tokenizer and sampler structs: colibri_tokenizer and
        # colibri_detok are opaque buffers of the library's sizes; the two
        # mirrored field by field must match it exactly.
        try:
            for name in ("tokenizer", "detok", "tokenizer_info", "sample_params"):
                f = getattr(lib, f"colibri_abi_sizeof_{name}")
                f.restype, f.argtypes = ctypes.c_size_t, []
            self.sizeof_tokenizer = lib.colibri_abi_sizeof_tokenizer()
            self.sizeof_detok = lib.colibri_abi_sizeof_detok()
            text_sizes = (lib.colibri_abi_sizeof_tokenizer_info(),
                          lib.colibri_abi_sizeof_sample_params())
        except AttributeError:
            raise errors.LibraryNotFoundError(
                f"{self.path} has no colibri_abi_sizeof_tokenizer (src/shared_abi.c): it "
                "predates the tokenizer; rebuild it (python -m colibri.buildsteps.cbuild)"
            ) from None
        want = (ctypes.sizeof(_TokInfo), ctypes.sizeof(_SampleParams))
        if text_sizes != want:
            raise errors.LibraryNotFoundError(
                f"{self.path}: sizeof(colibri_tokenizer_info), sizeof(colibri_sample_params) "
                f"= {text_sizes}; this binding expects {want}: rebuild the library from "
                "this checkout (python -m colibri.buildsteps.cbuild)")
        vp, sz, u32, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_int
        psz = ctypes.POINTER(sz)
        for name, res, args in (
                ("colibri_init", i, [vp, ctypes.c_char_p]),
                ("colibri_init_from_memory", i, [vp, vp, sz, vp, sz]),
                ("colibri_arena_size", i, [vp, sz, ctypes.POINTER(sz)]),
                ("colibri_init_ex", i, [vp, ctypes.c_char_p, ctypes.POINTER(_Options)]),
                ("colibri_init_from_memory_ex", i, [vp, vp, sz, vp, sz,
                                                    ctypes.POINTER(_Options)]),
                ("colibri_arena_size_ex", i, [vp, sz, ctypes.POINTER(_Options),
                                              ctypes.POINTER(sz)]),
                ("colibri_get_weight_bytes", i, [vp, ctypes.POINTER(_WeightBytes)]),
                ("colibri_init_stream", i, [vp, ctypes.POINTER(_Reader), vp, sz,
                                            ctypes.POINTER(_Options)]),
                ("colibri_stream_arena_size", i, [ctypes.POINTER(_Reader),
                                                  ctypes.POINTER(_Options), psz,
                                                  ctypes.POINTER(u32)]),
                ("colibri_get_stream_stats", i, [vp, ctypes.POINTER(_StreamStats), i]),
                ("colibri_infer", i, [vp, vp, vp, u32, u32, u32, vp]),
                ("colibri_infer_ex", i, [vp, vp, vp, u32, u32, u32, u32, vp]),
                ("colibri_set_threads", i, [vp, u32, u32]),
                ("colibri_free", None, [vp]),
                ("colibri_strerror", ctypes.c_char_p, [i]),
                ("colibri_strerror_for", ctypes.c_char_p, [i, i]),
                ("colibri_error_detail", ctypes.c_char_p, [vp]),
                ("colibri_get_info", i, [vp, ctypes.POINTER(_Info)]),
                ("colibri_verify", i, [vp, sz, _ON_BAD, vp, ctypes.POINTER(u32)]),
                ("colibri_build_flags", ctypes.c_uint, []),
                ("colibri_tokenizer_init", i, [vp, vp]),
                ("colibri_tokenizer_get_info", i, [vp, ctypes.POINTER(_TokInfo)]),
                ("colibri_tokenize", i, [vp, vp, sz, vp, sz, psz, ctypes.c_uint]),
                ("colibri_detokenize", i, [vp, vp, sz, vp, sz, psz, ctypes.c_uint]),
                ("colibri_detok_init", None, [vp, vp, ctypes.c_uint]),
                ("colibri_detok_push", i, [vp, ctypes.c_int32, vp, sz, psz]),
                ("colibri_detok_finish", i, [vp, vp, sz, psz]),
                ("colibri_tok_strerror", ctypes.c_char_p, [i]),
                ("colibri_sample_defaults", _SampleParams, []),
                ("colibri_sample_scratch_size", sz, [u32]),
                ("colibri_sample", i, [vp, u32, ctypes.POINTER(_SampleParams), vp, sz,
                                       ctypes.c_uint64, vp, sz, ctypes.POINTER(ctypes.c_int32)])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        # Encoder-decoder entry points: a library built before them still
        # loads; Model.encode then says to rebuild.
        for name, res, args in (
                ("colibri_encode", i, [vp, vp, vp, u32, u32]),
                ("colibri_encoder_output", i, [vp, vp]),
                ("colibri_decoder_start", ctypes.c_int32, [vp])):
            f = getattr(lib, name, None)
            if f is not None:
                f.restype, f.argtypes = res, args
        self.lib = lib

    def strerror(self, code: int, call: int = CALL_INIT) -> str:
        return self.lib.colibri_strerror_for(code, call).decode()

    def error(self, code: int, call: int, detail: str = "", where: str = ""):
        """The RuntimeCallError subclass instance for a failed call."""
        name = "infer" if call == CALL_INFER else "init"
        cls = errors.runtime_error_class(code, name)
        return cls(code, self.strerror(code, call), detail, name, where)

    def tok_error(self, code: int, call: str, detail: str = "", where: str = ""):
        """The exception for a failed tokenizer or sampler call: the
        TokenizerCallError subclass of -30 .. -34, else the colibri.h code's
        class; the text is colibri_tok_strerror's either way."""
        cls = errors.TOKENIZER_ERRORS.get(code) or errors.runtime_error_class(code, "infer")
        return cls(code, self.lib.colibri_tok_strerror(code).decode(), detail, call, where)

    @property
    def build_flags(self) -> int:
        """colibri_build_flags(): COLIBRI_BUILD_MMAP 1, _STATIC_WORKBUF 2, _DEBUG 4."""
        return int(self.lib.colibri_build_flags())


_loaded: dict[Path, Library] = {}
_load_lock = threading.Lock()


def default_library_path() -> Path:
    """Step 3 of the search order: the package's own build for this host."""
    target = _HOST_TARGETS.get(platform.machine().lower(), platform.machine().lower())
    return ROOT / "build" / target / "libcolibri.so"


def find_library(path: str | os.PathLike | None = None) -> Path:
    """The library to load, by the search order of the module docstring."""
    if path is not None:
        candidates = [("the path given", Path(path))]
    elif os.environ.get("COLIBRI_LIBRARY"):
        candidates = [("COLIBRI_LIBRARY", Path(os.environ["COLIBRI_LIBRARY"]))]
    else:
        candidates = [("the package's build", default_library_path())]
    for _, p in candidates:
        if p.is_file():
            return p.resolve()
    how, p = candidates[0]
    raise errors.LibraryNotFoundError(
        f"libcolibri.so not found ({how}: {p}); build it with "
        "`python -m colibri.buildsteps.cbuild` (or `scons`), or give its path "
        "(Model(..., library=PATH) or COLIBRI_LIBRARY=PATH)")


def load_library(path: str | os.PathLike | None = None) -> Library:
    """Load (once per file) and check the library found by find_library."""
    p = find_library(path)
    with _load_lock:
        if p not in _loaded:
            _loaded[p] = Library(p)
        return _loaded[p]


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array. ctypes' from_buffer is
    about 3x cheaper than ndarray.ctypes.data (which builds an object per
    call: ~2 µs, most of a decode call's binding overhead); it needs a
    writable buffer of at least one byte, else the slow path."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


def _aligned_empty(n: int, align: int = ARENA_ALIGN) -> np.ndarray:
    """n uint8 bytes whose address is a multiple of align (the array keeps
    its over-allocated base alive)."""
    buf = np.empty(n + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off:off + n]


def _aligned_copy(data) -> np.ndarray:
    src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    out = _aligned_empty(max(src.size, 1))[:src.size]
    out[:] = src
    return out


def _as_bytes(source) -> np.ndarray:
    """A file path or bytes-like -> 64-byte aligned uint8 array of its bytes."""
    if isinstance(source, (str, os.PathLike)):
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise errors.FileReadError(f"{source}: cannot read: {exc.strerror}") from None
        return _aligned_copy(data)
    return _aligned_copy(source)


def arena_size(source, library=None, *, kv: str = "f32") -> int:
    """Bytes of arena a model needs with a caller arena (colibri_arena_size_ex):
    the least `arena=` Model accepts with the same kv. `source` as for Model."""
    lib = load_library(library)
    blob = _as_bytes(source)
    out = ctypes.c_size_t(0)
    opt = _options(kv)
    rc = lib.lib.colibri_arena_size_ex(blob.ctypes.data, blob.size, ctypes.byref(opt),
                                       ctypes.byref(out))
    if rc:
        raise lib.error(rc, CALL_INIT, "", str(source) if isinstance(
            source, (str, os.PathLike)) else "")
    return int(out.value)


def verify(source, library=None) -> list[tuple[int, str]]:
    """colibri_verify over a file or bytes: every failing part as (index,
    what), index -2 the header, -1 the table, >= 0 a tensor-table entry, -3
    a structural error (checking stopped there); [] when intact. A file that
    cannot be read raises FileReadError, a newer format RuntimeVersionError."""
    return verify_code(source, library)[1]


def verify_code(source, library=None) -> tuple[int, list[tuple[int, str]]]:
    """verify() with colibri_verify's own return code: (0 | -1 structure |
    -3 CRC, the failing parts). A CRC that stops the check (DESC's) is -3
    with an index -3 part, so the parts alone do not say which."""
    lib = load_library(library)
    blob = _as_bytes(source)
    bad: list[tuple[int, str]] = []

    def on_bad(_user, index, what):
        bad.append((int(index), what.decode("utf-8", "replace")))
    cb = _ON_BAD(on_bad)
    count = ctypes.c_uint32(0)
    rc = lib.lib.colibri_verify(blob.ctypes.data, blob.size, cb, None, ctypes.byref(count))
    if rc in (-1, -3) and not bad:
        bad.append((-3, lib.strerror(rc)))
    if rc not in (0, -1, -3):   # OK, BAD_FORMAT and CRC are answers, not failures
        raise lib.error(rc, CALL_INIT, bad[0][1] if bad else "",
                        str(source) if isinstance(source, (str, os.PathLike)) else "")
    return rc, bad


class Model:
    """One instance of the C runtime over a .colibri model.

    source   a path (colibri_init: mapped or read, as the library was built;
             a file in the other byte order is swapped) or bytes-like (copied
             once into a 64-byte aligned buffer the Model keeps, then
             colibri_init_from_memory: in place, host byte order only).
    arena    None: the library allocates the arena it wants; an int: the
             Model allocates that many bytes (64-byte aligned) and hands them
             to colibri_init_from_memory (a path is then read into memory
             first, so it must be in the host byte order too);
             arena_size(source) is the least. Equal arenas give
             bit-identical logits.
    library  path of libcolibri.so (else COLIBRI_LIBRARY, else the package's
             build: see the module docstring).
    threads  workers computing each infer (colibri_set_threads; 1: the
             calling thread alone). The logits are the same bits for every
             count. spin: the workers spin instead of parking
             (COLIBRI_THREADS_SPIN: no system call inside infer).
    kv       the KV cache: "f32" (default: float32) or "i8" (int8 with one
             float32 scale per head vector, colibri_options.kv_dtype; about
             a quarter of the bytes; decoder-only files).
    ram      a memory budget (bytes, or "512M", "2G"): the routed experts
             stay in the file (a path) and are read into as many expert
             slots as the budget holds (colibri.h, "Experts from storage");
             a budget that holds the whole model loads it all-resident.
    slots    that many expert slots instead (a path, or a reader).
    policy   which expert a full slot cache gives up: "reuse" (default),
             "freq" or "lru" (docs/STREAMING.md, "Policies"). The logits
             are the same bits for every budget, slot count and policy.
    prefetch with ram or slots and a path: up to this many of a MoE layer's
             experts, predicted from the hidden state before its attention,
             are read while it runs (default 8, lowered to top_k and to
             what the slots allow; 0: none). Changes what is read, never a
             logit.
    reader   instead of source, a function read(offset, n) -> bytes over a
             file of reader_size bytes: colibri_init_stream with the
             caller's reader (bare metal's flash driver, or a test's),
             with slots or ram.

    One instance is not for concurrent use (the C instance is not
    thread-safe); calls on one Model from several Python threads are
    serialised by a lock, and close() waits for a running infer.
    """

    def __init__(self, source=None, *, arena: int | None = None, library=None,
                 threads: int = 1, spin: bool = False, kv: str = "f32", ram=None,
                 slots: int | None = None, policy: str = "reuse", reader=None,
                 reader_size: int | None = None, prefetch: int = PREFETCH_DEFAULT):
        self._lib = load_library(library)
        self._lock = threading.Lock()
        self._m = None
        self._source = source
        self._where = str(source) if isinstance(source, (str, os.PathLike)) else "<bytes>"
        lib = self._lib.lib
        m = ctypes.create_string_buffer(self._lib.sizeof_model)
        self._blob = self._arena = None
        opt = _options(kv, ram, slots, policy, prefetch)
        streamed = ram is not None or slots is not None
        self._reader = None
        if reader is not None and source is not None:
            raise errors.ArgumentError(-7, self._lib.strerror(-7), "a source and a reader: "
                                       "give one (the model is read from one place)",
                                       "init", self._where)
        if reader is not None:
            self._where = "<reader>"
            rc = self._init_reader(m, reader, reader_size, arena, opt)
        elif streamed and not isinstance(source, (str, os.PathLike)):
            raise errors.ArgumentError(-7, self._lib.strerror(-7), "ram= and slots= stream "
                                       "experts from a file: give its path (or a reader)",
                                       "init", self._where)
        elif isinstance(source, (str, os.PathLike)) and (arena is None or streamed):
            rc = lib.colibri_init_ex(m, os.fsencode(os.fspath(source)), ctypes.byref(opt))
        else:
            self._blob = _as_bytes(source)
            arena_ptr, arena_n = None, 0
            if arena is not None:
                if int(arena) < 0:
                    raise errors.ArgumentError(-7, self._lib.strerror(-7),
                                               f"arena = {arena} bytes", "init", self._where)
                self._arena = _aligned_empty(int(arena))
                arena_ptr, arena_n = self._arena.ctypes.data, int(arena)
            rc = lib.colibri_init_from_memory_ex(m, self._blob.ctypes.data, self._blob.size,
                                                 arena_ptr, arena_n, ctypes.byref(opt))
        if rc:
            detail = lib.colibri_error_detail(m).decode("utf-8", "replace")
            lib.colibri_free(m)
            self._blob = self._arena = None
            raise self._lib.error(rc, CALL_INIT, detail, self._where)
        self._m = m
        self._tok = self._tok_info = None     # colibri_tokenizer, on first use
        if threads != 1 or spin:
            try:
                self.set_threads(threads, spin=spin)
            except Exception:
                self.close()
                raise
        info = _Info()
        rc = lib.colibri_get_info(m, ctypes.byref(info))
        if rc:   # cannot happen on an initialised model; never leave it open
            self.close()
            raise self._lib.error(rc, CALL_INIT, "colibri_get_info", self._where)
        self.info = _to_info(info)
        s = self.info.shape
        self.vocab, self.max_batch, self.max_seq_len = s.vocab, s.max_batch, s.max_seq_len

    def _init_reader(self, m, reader, size, arena, opt) -> int:
        """colibri_init_stream through a Python read(offset, n) -> bytes."""
        if size is None or int(size) <= 0:
            raise errors.ArgumentError(-7, self._lib.strerror(-7), "a reader needs "
                                       "reader_size, the file's bytes", "init", self._where)

        def read(_user, offset, dst, n):
            try:
                data = reader(int(offset), int(n))
            except Exception:   # the library reports COLIBRI_E_IO
                return -1
            if data is None or len(data) != n:
                return -1
            ctypes.memmove(dst, bytes(data), n)
            return 0

        # kept for the instance's life: the library calls it during infer
        self._reader = (_READ_FN(read), _Reader())
        self._reader[1].read, self._reader[1].size = self._reader[0], int(size)
        arena_ptr, arena_n = None, 0
        if arena is not None:
            self._arena = _aligned_empty(int(arena))
            arena_ptr, arena_n = self._arena.ctypes.data, int(arena)
        return self._lib.lib.colibri_init_stream(m, ctypes.byref(self._reader[1]), arena_ptr,
                                                 arena_n, ctypes.byref(opt))

    def stream_stats(self, reset: bool = False) -> dict:
        """What the expert slots did (colibri_get_stream_stats): slots,
        policy, slot_bytes, resident_bytes, hits, misses, evictions,
        bytes_read, read_ns, errors, wait_ns, prefetched (reads a prediction
        started), prefetch_hits (hits on them), prefetch_cancelled (of them,
        those the routing did not use, cancelled before any byte was read),
        prefetch (experts a layer may prefetch), resident_mapped (1: the
        resident sections are used from the mapped file, not the arena),
        mapped (experts used from the page cache through the mapped file
        instead of read);
        slots 0 and policy None for an all-resident model.
        reset: clear the counters afterwards."""
        with self._lock:
            if self._m is None:
                raise self._closed_error()
            st = _StreamStats()
            rc = self._lib.lib.colibri_get_stream_stats(self._m, ctypes.byref(st), int(reset))
            if rc:
                raise self._lib.error(rc, CALL_INIT, "", self._where)
            out = {name: int(getattr(st, name)) for name, _ in _StreamStats._fields_}
            # an all-resident model has no slots and so no policy
            out["policy"] = None if not out["slots"] else {
                v: k for k, v in SLOT_POLICIES.items()}.get(out["policy"], out["policy"])
            return out

    # -- lifetime ---------------------------------------------------------------
    def close(self) -> None:
        """Free the instance (colibri_free). Idempotent; later calls raise
        NotInitializedError."""
        with self._lock:
            if self._m is not None:
                self._lib.lib.colibri_free(self._m)
                self._m = None
                self._blob = self._arena = None
                self._reader = None   # the library no longer calls it
                self._tok = None      # pointed into the model's memory

    @property
    def closed(self) -> bool:
        return self._m is None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_m", None) is not None:
                self.close()
        except Exception:
            pass

    def _closed_error(self):
        return errors.NotInitializedError(-13, self._lib.strerror(-13),
                                          "this Model is closed", "infer", self._where)

    # -- threads ----------------------------------------------------------------
    def set_threads(self, n: int, *, spin: bool = False) -> None:
        """colibri_set_threads: compute each infer on n workers (the calling
        thread included; 1 joins the workers). Raises ArgumentError (n < 1
        or > 64), UnsupportedError (a build without threads)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n < 2**32:
            raise errors.ArgumentError(-7, self._lib.strerror(-7), f"threads = {n!r}",
                                       "set_threads", self._where)
        with self._lock:
            if self._m is None:
                raise self._closed_error()
            rc = self._lib.lib.colibri_set_threads(self._m, int(n), THREADS_SPIN if spin else 0)
            if rc:
                detail = self._lib.lib.colibri_error_detail(self._m).decode("utf-8", "replace")
                raise self._lib.error(rc, CALL_INIT, detail, self._where)
        if getattr(self, "info", None) is not None:
            info = _Info()
            self._lib.lib.colibri_get_info(self._m, ctypes.byref(info))
            self.info = _to_info(info)

    # -- inference --------------------------------------------------------------
    def infer(self, ids, mask=None, n_past: int = 0, *, out: np.ndarray | None = None,
              last_only: bool = False) -> np.ndarray:
        """colibri_infer: logits float32 [batch, seq, vocab] for token ids
        [batch, seq] (a 1-D sequence is batch 1), written by the C runtime
        straight into the returned array (or into `out`, a C-contiguous
        float32 array of that shape, e.g. reused across decode steps).
        last_only: logits [batch, vocab] of each sequence's last position
        only (colibri_infer_ex COLIBRI_LOGITS_LAST: the LM head skips the
        other rows; each row the same bits as in the full result).
        mask [batch, seq] of 0/1 (None: all 1); n_past 0 starts afresh, > 0
        continues from the KV cache. Raises the RuntimeCallError subclass of
        the code (InputTooLargeError, TokenError, KVStateError, ...)."""
        ids, mask_ptr, mask = self._ids_and_mask(ids, mask)
        b, s = ids.shape
        if not 0 <= int(n_past) < 2**32:
            raise self._arg_error(f"n_past = {n_past}")
        shape = (b, self.vocab) if last_only else (b, s, self.vocab)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32
              or out.shape != shape or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise self._arg_error(f"out must be a writable C-contiguous float32 array of "
                                  f"shape {shape}")
        with self._lock:
            m = self._m
            if m is None:
                raise self._closed_error()
            rc = self._lib.lib.colibri_infer_ex(m, _address(ids), mask_ptr, b, s, int(n_past),
                                                LOGITS_LAST if last_only else LOGITS_ALL,
                                                _address(out))
            if rc:
                detail = self._lib.lib.colibri_error_detail(m).decode("utf-8", "replace")
                raise self._lib.error(rc, CALL_INFER, detail, self._where)
        return out

    def encode(self, ids, mask=None) -> np.ndarray:
        """colibri_encode on an encoder-decoder file: runs the encoder over ids
        [batch, seq] (mask 0/1, None all 1) and returns its output float32
        [batch, seq, hidden]; then infer() runs decoder steps (n_past 0 first,
        usually from decoder_start). Raises as infer() does."""
        ids, mask_ptr, mask = self._ids_and_mask(ids, mask)
        b, s = ids.shape
        lib = self._lib.lib
        if not hasattr(lib, "colibri_encode") or lib.colibri_encode.argtypes is None:
            raise errors.LibraryNotFoundError(
                f"{self._lib.path} has no colibri_encode: rebuild it "
                "(python -m colibri.buildsteps.cbuild)")
        out = np.empty((b, s, self.info.shape.hidden), dtype=np.float32)
        with self._lock:
            m = self._m
            if m is None:
                raise self._closed_error()
            rc = lib.colibri_encode(m, _address(ids), mask_ptr, b, s)
            if not rc:
                rc = lib.colibri_encoder_output(m, _address(out))
            if rc:
                detail = lib.colibri_error_detail(m).decode("utf-8", "replace")
                raise self._lib.error(rc, CALL_INFER, detail, self._where)
        return out

    @property
    def decoder_start(self) -> int | None:
        """An encoder-decoder's decoder start token, None for other models."""
        lib = self._lib.lib
        if not hasattr(lib, "colibri_decoder_start") or self._m is None:
            return None
        v = int(lib.colibri_decoder_start(self._m))
        return None if v < 0 else v

    def _ids_and_mask(self, ids, mask):
        """ids as C-contiguous int32 [batch, seq], the mask pointer (or None)
        and the mask array it points into (keep it alive)."""
        ids = np.asarray(ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2:
            raise self._arg_error(f"ids has shape {ids.shape}: expected [batch, seq] or [seq]")
        if ids.dtype != np.int32:
            if ids.size and ids.dtype.kind not in "iub":
                raise self._arg_error(f"ids of dtype {ids.dtype}: expected integers")
            if ids.size and (ids.min() < -2**31 or ids.max() >= 2**31):
                bad = ids.min() if ids.min() < -2**31 else ids.max()
                raise errors.TokenError(-8, self._lib.strerror(-8, CALL_INFER),
                                        f"token id {int(bad)} does not fit in int32",
                                        "infer", self._where)
            ids = ids.astype(np.int32)
        ids = np.ascontiguousarray(ids)
        mask_ptr = None
        if mask is not None:
            mask = np.asarray(mask)
            if mask.ndim == 1 and ids.shape[0] == 1:
                mask = mask[None, :]
            if mask.shape != ids.shape:
                raise self._arg_error(f"mask has shape {mask.shape}, ids {ids.shape}")
            if mask.dtype != np.uint8:
                if mask.size and mask.dtype.kind not in "iub":
                    raise self._arg_error(f"mask of dtype {mask.dtype}: expected 0/1 integers")
                # Values other than 0/1 reach the library as 2, which it
                # rejects (COLIBRI_E_ARG): no silent wrap-around to 0/1.
                mask = np.where((mask == 0) | (mask == 1), mask, 2).astype(np.uint8)
            mask = np.ascontiguousarray(mask)
            mask_ptr = _address(mask)
        return ids, mask_ptr, mask

    def _arg_error(self, detail: str):
        return errors.ArgumentError(-7, self._lib.strerror(-7, CALL_INFER), detail,
                                    "infer", self._where)

    # -- text -------------------------------------------------------------------
    def _tokenizer(self, call: str):
        """The colibri_tokenizer (initialised once; call with the lock held):
        NoTokenizerError when the file has no tokenizer section."""
        if self._m is None:
            raise self._closed_error()
        if self._tok is None:
            tok = ctypes.create_string_buffer(self._lib.sizeof_tokenizer)
            rc = self._lib.lib.colibri_tokenizer_init(tok, self._m)
            if rc:
                raise self._lib.tok_error(rc, call, "", self._where)
            ti = _TokInfo()
            self._lib.lib.colibri_tokenizer_get_info(tok, ctypes.byref(ti))
            self._tok, self._tok_info = tok, ti
        return self._tok

    @property
    def tokenizer_info(self) -> dict:
        """colibri_tokenizer_get_info: n_vocab, bos_id, eos_id (-1: none),
        model, pretok, template_bos, template_eos. NoTokenizerError without a
        tokenizer."""
        with self._lock:
            self._tokenizer("tokenize")
            ti = self._tok_info
        return {k: int(getattr(ti, k)) for k, _ in _TokInfo._fields_}

    def tokenize(self, text, add_bos: bool | None = None, parse_special: bool = False,
                 add_eos: bool = False) -> list[int]:
        """colibri_tokenize: the ids of `text` (str, or UTF-8 bytes; invalid
        UTF-8 reads as U+FFFD), HF tokenizers' for the checkpoint's
        tokenizer.json. add_bos None: as the tokenizer's template does;
        parse_special: special tokens written in the text become their ids
        (else plain text); add_eos: eos last (T5's template: pass
        tokenizer_info["template_eos"]). NoTokenizerError, NoBosError, ..."""
        with self._lock:
            tok = self._tokenizer("tokenize")
            if add_bos is None:
                add_bos = bool(self._tok_info.template_bos) and self._tok_info.bos_id >= 0
        return self._tokenize(text, (TOK_ADD_BOS if add_bos else 0)
                              | (TOK_PARSE_SPECIAL if parse_special else 0)
                              | (TOK_ADD_EOS if add_eos else 0), tok)

    def _tokenize(self, text, flags: int, tok) -> list[int]:
        if isinstance(text, str):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise errors.TextUTF8Error(-33, self._lib.lib.colibri_tok_strerror(-33).decode(),
                                           str(exc), "tokenize", self._where) from None
        else:
            data = bytes(text)
        cap = len(data) + 2
        n = ctypes.c_size_t(0)
        for _ in range(2):
            ids = np.empty(max(cap, 1), np.int32)
            with self._lock:
                if self._m is None:
                    raise self._closed_error()
                rc = self._lib.lib.colibri_tokenize(tok, data, len(data), ids.ctypes.data, cap,
                                                    ctypes.byref(n), flags)
            if rc != -32:
                break
            cap = int(n.value)
        if rc:
            raise self._lib.tok_error(rc, "tokenize", "", self._where)
        return ids[:n.value].tolist()

    def detokenize(self, ids, skip_special: bool = False) -> str:
        """colibri_detokenize: the text of `ids`, HF tokenizers'
        decode(ids, skip_special_tokens=skip_special). TokenError for an id
        outside the tokenizer's vocabulary."""
        arr = self._ids32(ids, "detokenize")
        cap = 16 * arr.size + 16
        n = ctypes.c_size_t(0)
        for _ in range(2):
            out = ctypes.create_string_buffer(cap)
            with self._lock:
                tok = self._tokenizer("detokenize")
                rc = self._lib.lib.colibri_detokenize(
                    tok, arr.ctypes.data, arr.size, out, cap, ctypes.byref(n),
                    DETOK_SKIP_SPECIAL if skip_special else 0)
            if rc != -32:
                break
            cap = int(n.value)
        if rc:
            raise self._lib.tok_error(rc, "detokenize", "", self._where)
        return out.raw[:n.value].decode("utf-8", "replace")

    def _ids32(self, ids, call: str) -> np.ndarray:
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise errors.ArgumentError(-7, self._lib.strerror(-7), f"ids of shape {arr.shape} "
                                       f"and dtype {arr.dtype}: expected a 1-D list of ints",
                                       call, self._where)
        if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
            raise errors.TokenError(-8, self._lib.strerror(-8), "a token id does not fit in "
                                    "int32", call, self._where)
        return np.ascontiguousarray(arr, dtype=np.int32)

    def generate(self, prompt, max_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 seed: int = 0, add_bos: bool | None = None) -> "Generation":
        """Text generation as `colibri-cli --prompt TEXT --generate N` does
        it: the prompt tokenised (special tokens parsed; bos as the template
        does unless add_bos says), each next token chosen by colibri_sample
        (greedy with temperature 0; else seeded sampling: the same tokens as
        colibri-cli with the same flags), its text streamed by colibri_detok
        (special tokens skipped; a UTF-8 character split across tokens comes
        out whole). Stops at eos, max_tokens or the KV cache's end. An
        encoder-decoder (Switch Transformers) encodes the prompt (eos last
        when the template says so, as transformers' tokenizer does) and
        generates the decoder's text from its start token, as
        transformers' generate does.

        Returns an iterator of text pieces (str), each final as soon as
        yielded; its `.ids` lists the generated ids so far. The prompt,
        parameters and tokenizer are checked here, before any token."""
        if int(max_tokens) < 0:
            raise self._arg_error(f"max_tokens = {max_tokens}")
        p = self._lib.lib.colibri_sample_defaults()
        try:
            p.temperature, p.top_k, p.top_p = float(temperature), int(top_k), float(top_p)
            p.min_p, p.repetition_penalty = float(min_p), float(repetition_penalty)
            p.seed = int(seed) & (2**64 - 1)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._arg_error(f"sampling parameter: {exc}") from None
        if int(top_k) < 0 or int(top_k) >= 2**32:
            raise self._arg_error(f"top_k = {top_k}")
        start = self.decoder_start
        with self._lock:
            self._tokenizer("tokenize")
            eos_last = start is not None and bool(self._tok_info.template_eos)
        ids = self.tokenize(prompt, add_bos=add_bos, parse_special=True, add_eos=eos_last)
        if not ids:
            raise self._arg_error("the prompt has no tokens")
        if start is not None:
            if len(ids) > self.max_seq_len:
                raise errors.InputTooLargeError(
                    -1, self._lib.strerror(-1, CALL_INFER), f"the prompt is {len(ids)} "
                    f"tokens, the encoder takes {self.max_seq_len}", "infer", self._where)
            self.encode(np.asarray([ids], np.int32))
            ids = [start]
        if len(ids) >= self.max_seq_len:
            raise errors.InputTooLargeError(
                -1, self._lib.strerror(-1, CALL_INFER), f"the prompt is {len(ids)} tokens, "
                f"the KV cache holds {self.max_seq_len}", "infer", self._where)
        # Check the parameters once now (C says which values it refuses).
        probe = np.zeros(1, np.float32)
        scratch = np.empty(max(int(self._lib.lib.colibri_sample_scratch_size(1)), 8), np.uint8)
        out = ctypes.c_int32(0)
        hist0 = np.zeros(1, np.int32)
        rc = self._lib.lib.colibri_sample(probe.ctypes.data, 1, ctypes.byref(p),
                                          hist0.ctypes.data, 0, 0,
                                          scratch.ctypes.data, scratch.size, ctypes.byref(out))
        if rc:
            raise self._lib.tok_error(rc, "sample", "temperature, top_p, min_p must be finite "
                                      ">= 0 and repetition_penalty > 0", self._where)
        return Generation(self, ids, int(max_tokens), p)

    # -- the file ---------------------------------------------------------------
    def weight_bytes(self) -> dict:
        """colibri_get_weight_bytes: {part: (bytes, dtypes, tensors)} for the
        parts of PART_NAMES, dtypes a sorted tuple of DType (the section bytes
        of the file's tensors of that part, as the C runtime counts them)."""
        with self._lock:
            if self._m is None:
                raise self._closed_error()
            wb = _WeightBytes()
            rc = self._lib.lib.colibri_get_weight_bytes(self._m, ctypes.byref(wb))
        if rc:
            raise self._lib.error(rc, CALL_INIT, "colibri_get_weight_bytes", self._where)
        return {name: (int(wb.bytes[i]),
                       tuple(DType(d) for d in range(32) if wb.dtypes[i] >> d & 1),
                       int(wb.tensors[i]))
                for i, name in enumerate(PART_NAMES)}

    def verify(self) -> list[tuple[int, str]]:
        """colibri_verify over this model's file (re-read from its path) or
        bytes: [] when every CRC matches, else (index, what) per failing part
        (see verify())."""
        with self._lock:
            if self._m is None:
                raise self._closed_error()
            source = self._blob if self._blob is not None else self._source
        return verify(source, self._lib.path)

    def __repr__(self) -> str:
        if self._m is None:
            return f"<colibri.runtime.Model {self._where} closed>"
        s = self.info.shape
        return (f"<colibri.runtime.Model {self._where} vocab={s.vocab} layers={s.n_layers} "
                f"experts={s.n_experts} kernels={self.info.kernels}>")


def _to_info(i: _Info) -> Info:
    s = i.shape
    shape = ModelShape(vocab=s.vocab, hidden=s.hidden, intermediate=s.intermediate,
                       max_seq_len=s.max_seq_len, n_layers=s.n_layers, n_heads=s.n_heads,
                       n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, n_experts=s.n_experts,
                       top_k=s.top_k, max_batch=s.max_batch, group_size=s.group_size,
                       rope_theta=float(s.rope_theta), rms_eps=float(s.rms_eps))

    def dt(v):
        try:
            return DType(v)
        except ValueError:
            return int(v)
    return Info(shape=shape, n_tensors=int(s.n_tensors), format_version=int(i.format_version),
                file_big_endian=bool(i.file_big_endian), byte_swapped=bool(i.byte_swapped),
                dtypes={"embed": dt(i.dtype_embed), "attn": dt(i.dtype_attn),
                        "router": dt(i.dtype_router), "expert": dt(i.dtype_expert),
                        "lm_head": dt(i.dtype_lm_head)},
                n_unknown_sections=int(i.n_unknown_sections), file_size=int(i.file_size),
                n_params=int(i.n_params), arena_bytes=int(i.arena_bytes),
                chunk_tokens=int(i.chunk_tokens),
                kernels=(i.kernels or b"").decode(), load_mode=(i.load_mode or b"").decode(),
                huge_pages_advised=bool(i.huge_pages_advised),
                n_threads=int(i.n_threads), thread_spin=bool(i.thread_flags & THREADS_SPIN),
                kv={v: k for k, v in KV_DTYPES.items()}.get(int(i.kv_dtype), str(i.kv_dtype)),
                kv_bytes_per_token=int(i.kv_bytes_per_token), kv_bytes=int(i.kv_bytes))


class Generation:
    """The iterator Model.generate returns: text pieces as they become
    final; `ids` the generated token ids so far, `prompt_ids` the prompt's."""

    def __init__(self, model: Model, prompt_ids: list[int], max_tokens: int,
                 params: _SampleParams):
        self.model, self.prompt_ids, self.ids = model, list(prompt_ids), []
        self._it = self._run(max_tokens, params)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._it)

    @property
    def text(self) -> str:
        """The rest of the stream, joined (consumes the iterator)."""
        return "".join(self)

    def _run(self, max_tokens: int, p: _SampleParams):
        m, lib = self.model, self.model._lib
        c = lib.lib
        with m._lock:
            m._tokenizer("generate")
            tok, ti = m._tok, m._tok_info
        V = m.vocab
        n_text = min(int(ti.n_vocab), V)     # a padded vocabulary's extra ids have no text
        limit = m.max_seq_len
        hist = np.zeros(len(self.prompt_ids) + max_tokens, np.int32)
        n = len(self.prompt_ids)
        hist[:n] = self.prompt_ids
        size = int(c.colibri_sample_scratch_size(V))
        scratch = np.empty(max(size, 8), np.uint8)
        d = ctypes.create_string_buffer(lib.sizeof_detok)
        buf_cap = 512
        buf = ctypes.create_string_buffer(buf_cap)
        k = ctypes.c_size_t(0)
        nxt = ctypes.c_int32(0)
        if max_tokens == 0:
            return
        logits = m.infer(hist[None, :n], last_only=True)[0].copy()
        step_out = np.empty((1, 1, V), np.float32)
        with m._lock:
            c.colibri_detok_init(d, m._tokenizer("generate"), DETOK_SKIP_SPECIAL)

        def drain(fn, *args):
            nonlocal buf, buf_cap
            while True:
                with m._lock:
                    m._tokenizer("generate")     # the model is still open
                    rc = fn(d, *args, buf, buf_cap, ctypes.byref(k))
                if rc == -32:
                    buf_cap = int(k.value)
                    buf = ctypes.create_string_buffer(buf_cap)
                    continue
                if rc:
                    raise lib.tok_error(rc, "detokenize", "", m._where)
                return buf.raw[:k.value].decode("utf-8", "replace")

        for g in range(max_tokens):
            logits[n_text:] = -np.inf
            rc = c.colibri_sample(logits.ctypes.data, V, ctypes.byref(p), hist.ctypes.data,
                                  n + g, g, scratch.ctypes.data, scratch.size,
                                  ctypes.byref(nxt))
            if rc:
                raise lib.tok_error(rc, "sample", "", m._where)
            t = int(nxt.value)
            hist[n + g] = t
            self.ids.append(t)
            piece = drain(c.colibri_detok_push, t)
            if piece:
                yield piece
            if t == ti.eos_id or g == max_tokens - 1 or n + g + 1 >= limit:
                break
            m.infer(hist[None, n + g:n + g + 1], n_past=n + g, out=step_out)
            logits = step_out[0, 0].copy()
        tail = drain(c.colibri_detok_finish)
        if tail:
            yield tail
