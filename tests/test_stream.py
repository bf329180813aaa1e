"""Experts from storage (colibri.h, "Experts from storage"; docs/STREAMING.md).

A streamed instance keeps every section but the routed experts resident and
reads an expert into one of N slots when a token routes to it. Its logits
must be the all-resident instance's bits for every slot count (down to one
slot for the whole model), policy, thread count, storage type, byte order
and feature of a description. The judge is the all-resident C instance of
the same file, which the golden tests hold to the numpy reference and to
transformers. A damaged expert is an error at the step that reads it, never
wrong logits, and the instance stays usable; a failing reader is
COLIBRI_E_IO; a budget gives the slots it holds; what cannot stream is
refused by name.
"""
from __future__ import annotations

import concurrent.futures
import re
import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri import errors, runtime
from colibri.file import format as F
from colibri.model import route_trace as rt
from feature_models import DESCRIPTIONS, SHAPE, write_model
from test_runtime_support import c_build  # noqa: F401

# name -> description; None is Mixtral's (a version 1 file).
MODELS = dict(DESCRIPTIONS, mixtral=None)
PRESETS = {"f32": None, "int8": F.PRESET_INT8, "q4": F.PRESET_Q4}
# the block types need 256 columns (a K block): hidden 256, like golden "k256"
Q4_SHAPE = dataclasses.replace(SHAPE, hidden=256, intermediate=64)
# experts that outweigh the arena, as in the models budgets are for
WIDE_SHAPE = dataclasses.replace(SHAPE, intermediate=512)


@pytest.fixture(scope="module")
def so(c_build):
    return c_build("host").so


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    cache = {}

    def get(name, quant="f32", byte_order="little", wide=False):
        key = (name, quant, byte_order, wide)
        if key not in cache:
            shape = WIDE_SHAPE if wide else Q4_SHAPE if quant == "q4" else SHAPE
            cache[key] = write_model(root / f"{name}-{quant}-{byte_order}-{wide}.colibri",
                                     MODELS[name], shape=shape, dtypes=PRESETS[quant],
                                     byte_order=byte_order, seed=len(name) + 7)
        return cache[key]
    return get


def routed_experts(path) -> int:
    cf = F.read_file(path)
    return len({(e.layer, e.expert) for e in cf.entries if e.kind == F.Kind.EXPERT_W1})


def session(m: runtime.Model, vocab: int) -> np.ndarray:
    """A prefill of two sequences, then decode steps fed back greedily, then
    a rewind: every path of infer that reaches the experts. All logits,
    concatenated."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, vocab, size=(2, 9))
    out = [m.infer(prompt)]
    nxt = np.argmax(out[-1][:, -1], axis=-1)[:, None]
    for step in range(6):
        out.append(m.infer(nxt, n_past=9 + step))
        nxt = np.argmax(out[-1][:, -1], axis=-1)[:, None]
    out.append(m.infer(prompt[:, :4], n_past=5))  # rewind into the cache
    return np.concatenate([o.reshape(-1) for o in out])


# How a streamed instance of the library's own reader fills its slots from a
# file the page cache holds (every test file here is, just written): used
# where they are through the mapped file (the default on Linux), or read
# (COLIBRI_STREAM_COPY=1: the resident part read into the arena too, as a
# caller's reader and a big-endian file do).
FILLS = {"mapped": None, "read": "1"}


@pytest.fixture(params=sorted(FILLS))
def fill(request, monkeypatch):
    if FILLS[request.param]:
        monkeypatch.setenv("COLIBRI_STREAM_COPY", FILLS[request.param])
    else:
        monkeypatch.delenv("COLIBRI_STREAM_COPY", raising=False)
    return request.param


@pytest.mark.parametrize("quant", sorted(PRESETS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_equal_all_resident(so, model, name, quant, fill):
    path = model(name, quant)
    with runtime.Model(path, library=so) as m:
        want = session(m, m.vocab)
        n_layers = m.info.shape.n_layers
    total = routed_experts(path)
    for slots in sorted({1, n_layers, total - 1, total}):
        for policy in rt.POLICIES:
            for threads in (1, 3):
                with runtime.Model(path, library=so, slots=slots, policy=policy,
                                   threads=threads) as m:
                    assert m.info.load_mode == "stream"
                    got = session(m, m.vocab)
                    st = m.stream_stats()
                assert np.array_equal(got, want), (slots, policy, threads)
                assert st["slots"] == slots and st["errors"] == 0
                assert st["misses"] + st["prefetched"] >= 1
                # every fill a read (of a byte at least) or a mapped expert
                assert st["bytes_read"] >= st["misses"] + st["prefetched"] - \
                    st["prefetch_cancelled"] - st["mapped"]
                if fill == "mapped":  # warm: every fill the page cache's
                    assert st["resident_mapped"] == 1 and st["bytes_read"] == 0
                    assert st["mapped"] >= 1
                else:
                    assert st["resident_mapped"] == 0 and st["mapped"] == 0
                # the default prefetch where the slots allow it (a layer
                # pass's experts twice, the prefetch and the read-ahead)
                allowed = slots >= 2 * SHAPE.top_k + SHAPE.top_k + 2
                assert st["prefetch"] == (SHAPE.top_k if allowed else 0), slots
                assert st["prefetch_hits"] <= st["prefetched"] and \
                    (st["prefetched"] >= 1) == allowed, st
                if slots == total:  # every expert read once at most
                    assert st["evictions"] == 0
                    assert st["misses"] + st["prefetched"] <= total


def test_big_endian_file_streams_to_the_same_bits(so, model):
    """Resident sections and each expert are swapped as they are read."""
    path = model("qwen2", "int8", "big")
    with runtime.Model(path, library=so) as m:
        assert m.info.byte_swapped
        want = session(m, m.vocab)
    with runtime.Model(path, library=so, slots=2) as m:
        assert m.info.load_mode == "stream" and m.info.byte_swapped
        assert np.array_equal(session(m, m.vocab), want)


def test_a_callers_reader_streams_to_the_same_bits(so, model):
    """colibri_init_stream with the caller's reader (bare metal's flash
    driver): the same bits, and only the reader is asked for bytes."""
    path = model("olmoe", "int8")
    data = path.read_bytes()
    asked = []

    def read(offset, n):
        asked.append((offset, n))
        return data[offset:offset + n]

    with runtime.Model(path, library=so) as m:
        want = session(m, m.vocab)
    with runtime.Model(reader=read, reader_size=len(data), library=so, slots=3) as m:
        assert m.info.load_mode == "stream"
        assert np.array_equal(session(m, m.vocab), want)
        # one read per expert brought in: the expert's sections, contiguous
        st = m.stream_stats()
    cf = F.read_file(path)
    spans = {}
    for e in cf.entries:
        if e.kind in (F.Kind.EXPERT_W1, F.Kind.EXPERT_W3, F.Kind.EXPERT_W2):
            a, b = spans.get((e.layer, e.expert), (e.offset, 0))
            spans[(e.layer, e.expert)] = (min(a, e.offset), max(b, e.offset + e.size))
    expert_reads = [r for r in asked if (r[0], r[0] + r[1]) in set(spans.values())]
    assert len(expert_reads) == st["misses"] and st["read_ns"] == 0


def test_one_source_and_no_policy_without_slots(so, model):
    """A path and a reader at once is refused (which would be read?); an
    all-resident model reports no slots and no policy."""
    path = model("olmoe", "int8")
    data = path.read_bytes()
    with pytest.raises(errors.ArgumentError, match="a source and a reader"):
        runtime.Model(path, reader=lambda o, n: data[o:o + n], reader_size=len(data),
                      library=so, slots=2)
    with runtime.Model(path, library=so) as m:
        st = m.stream_stats()
    assert st["slots"] == 0 and st["policy"] is None, st


def damaged(path, tmp_path, layer, expert, kind=F.Kind.EXPERT_W2):
    cf = F.read_file(path)
    e = next(x for x in cf.entries if x.kind == kind and x.layer == layer
             and x.expert == expert)
    b = bytearray(path.read_bytes())
    b[e.offset + e.size // 2] ^= 0x40
    out = tmp_path / "damaged.colibri"
    out.write_bytes(bytes(b))
    return out


def test_damaged_expert_is_an_error_at_the_step_that_reads_it(so, model, tmp_path, fill):
    path = model("mixtral", "int8")
    bad = damaged(path, tmp_path, layer=SHAPE.n_layers - 1, expert=2)
    with pytest.raises(errors.RuntimeCRCError, match="EXPERT_W2 layer 2 expert 2"):
        runtime.Model(bad, library=so)          # all-resident: every CRC at init
    good = runtime.Model(path, library=so)
    m = runtime.Model(bad, library=so, slots=2)
    outcomes = {}
    for t in range(SHAPE.vocab):                # each token alone, position 0
        try:
            got = m.infer([[t]])
        except errors.RuntimeCRCError as exc:
            assert "EXPERT_W2 layer 2 expert 2" in str(exc)
            outcomes[t] = "crc"
            continue
        assert np.array_equal(got, good.infer([[t]]))   # never wrong logits
        outcomes[t] = "ok"
    assert set(outcomes.values()) == {"ok", "crc"}, outcomes
    assert m.stream_stats()["errors"] == list(outcomes.values()).count("crc")
    # The cache keeps the n_past tokens before a failed call: continue there.
    first = next(t for t, o in outcomes.items() if o == "ok")
    m.infer([[first]])
    good.infer([[first]])
    tried = 0
    for t in range(SHAPE.vocab):
        try:
            got = m.infer([[t]], n_past=1)
        except errors.RuntimeCRCError:
            tried += 1
            continue
        assert np.array_equal(got, good.infer([[t]], n_past=1))
    assert tried >= 1
    m.close()
    good.close()


def test_a_damaged_expert_of_a_big_endian_file_is_named_by_its_section(so, model, tmp_path):
    """A byte-swapped expert is swapped only once all of its sections pass
    their checks: the check, run again on infer's thread for the error's
    detail (the reader thread checked it first), names the damaged section,
    W2 (the expert's last), not W1 that an earlier swap would have made
    fail."""
    path = model("mixtral", "int8", "big")
    bad = damaged(path, tmp_path, layer=SHAPE.n_layers - 1, expert=2)
    with runtime.Model(path, library=so) as good, \
            runtime.Model(bad, library=so, slots=2) as m:
        assert m.info.load_mode == "stream" and m.info.byte_swapped
        failed = 0
        for t in range(SHAPE.vocab):
            try:
                got = m.infer([[t]])
            except errors.RuntimeCRCError as exc:
                assert "EXPERT_W2 layer 2 expert 2" in str(exc)
                failed += 1
                continue
            assert np.array_equal(got, good.infer([[t]]))
        assert failed >= 1
        assert m.stream_stats()["errors"] == failed


def test_of_two_damaged_resident_sections_the_first_is_named(so, model, tmp_path, fill):
    """A warm file's resident sections are checked where they are, in two
    halves on two threads; read, one by one into the arena: either way the
    error names the first damaged section in the file, as the all-resident
    init does, whichever half meets its damage first."""
    path = model("mixtral", "int8")
    cf = F.read_file(path)
    experts = (F.Kind.EXPERT_W1, F.Kind.EXPERT_W2, F.Kind.EXPERT_W3)
    resident = [i for i, e in enumerate(cf.entries)
                if e.kind != F.Kind.DESC and e.kind not in experts]
    first, last = resident[0], resident[-1]
    raw = bytearray(path.read_bytes())
    for i in (first, last):     # a mantissa bit of the first value: finite
        raw[cf.entries[i].offset + 1] ^= 0x40
    bad = tmp_path / "two-damaged.colibri"
    bad.write_bytes(bytes(raw))
    with pytest.raises(errors.RuntimeCRCError) as whole:
        runtime.Model(bad, library=so)
    with pytest.raises(errors.RuntimeCRCError) as streamed:
        runtime.Model(bad, library=so, slots=2)
    for exc in (whole, streamed):
        assert f"tensor {first} (" in str(exc.value), str(exc.value)
        assert f"tensor {last} (" not in str(exc.value)


def test_a_failing_read_is_an_io_error_and_the_instance_recovers(so, model):
    path = model("granite", "int8")
    data = path.read_bytes()
    broken = {"on": False}

    def read(offset, n):
        if broken["on"]:
            raise OSError("flash not ready")
        return data[offset:offset + n]

    with runtime.Model(path, library=so) as ref:
        want = ref.infer([[1, 2, 3]])
    with runtime.Model(reader=read, reader_size=len(data), library=so, slots=1) as m:
        broken["on"] = True
        with pytest.raises(errors.RuntimeIOError, match="reading expert"):
            m.infer([[1, 2, 3]])
        broken["on"] = False
        assert np.array_equal(m.infer([[1, 2, 3]]), want)
        assert m.stream_stats()["errors"] == 1


def test_a_budget_gives_the_slots_it_holds(so, model):
    path = model("qwen3", "int8", wide=True)
    size = path.stat().st_size
    with runtime.Model(path, library=so) as m:
        resident_arena = m.info.arena_bytes
    with runtime.Model(path, library=so, slots=1) as m:
        one = m.info.arena_bytes
        slot = m.stream_stats()["slot_bytes"]
    budget = one + 3 * slot + 4096
    assert budget < size + resident_arena
    with runtime.Model(path, library=so, ram=budget) as m:
        st = m.stream_stats()
        assert m.info.load_mode == "stream" and st["slots"] >= 3
        assert m.info.arena_bytes <= budget       # everything it holds is the arena
    with pytest.raises(errors.OutOfMemoryError, match="holds no expert slot"):
        runtime.Model(path, library=so, ram=one // 2)
    # A budget that holds the file and the all-resident arena: all-resident.
    with runtime.Model(path, library=so, ram=size + resident_arena) as m:
        assert m.info.load_mode != "stream" and m.stream_stats()["slots"] == 0


def test_what_cannot_stream_is_refused(so, model):
    path = model("mixtral", "f32")
    with pytest.raises(errors.ArgumentError, match="file has"):
        runtime.Model(path, library=so, slots=10_000)
    with pytest.raises(errors.ArgumentError, match="give its path"):
        runtime.Model(path.read_bytes(), library=so, slots=2)
    with pytest.raises(errors.ArgumentError, match="policy"):
        runtime.Model(path, library=so, slots=2, policy="random")
    with pytest.raises(errors.ArgumentError, match="ram="):
        runtime.Model(path, library=so, ram="lots")


@pytest.mark.parametrize("variant", ["host", "nommap"])
def test_cli_streams_and_reports_its_slots(c_build, model, tmp_path, variant):
    """Mapped or read (nommap: the x86_64 target's default, which reads the
    file into huge pages), a hosted build streams with its own reader."""
    cli = c_build(variant).cli
    path = model("olmoe", "int8")
    args = [str(cli), "--model", str(path), "--tokens", "1,2,3,4", "--generate", "5"]
    a = subprocess.run(args + ["--logits-out", str(tmp_path / "a.bin")],
                       capture_output=True, text=True, check=True)
    b = subprocess.run(args + ["--slots", "2", "--policy", "lru",
                               "--logits-out", str(tmp_path / "b.bin")],
                       capture_output=True, text=True, check=True)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    assert "experts: 2 slots" in b.stderr and "experts:" not in a.stderr
    info = subprocess.run([str(cli), "--model", str(path), "--slots", "2", "--info"],
                          capture_output=True, text=True, check=True).stdout
    assert "load: stream" in info and "expert_slots: 2 of" in info
    assert "(policy reuse)" in info   # the default
    bad = subprocess.run([str(cli), "--model", str(path), "--ram", "1K", "--info"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "raise --ram" in bad.stderr


def test_streaming_under_asan_ubsan(c_build, model, tmp_path):
    """The library's own reader and an allocated arena (colibri_init_ex with
    --slots): every path of a streamed instance under AddressSanitizer and
    UBSan, which report as a non-zero exit; the same bits as all-resident."""
    cli = c_build("asan").cli
    for path in (model("qwen2", "int8"), model("mixtral", "q4"),
                 model("olmoe", "int8", "big")):
        base = [str(cli), "--model", str(path), "--tokens", "1,2,3,4,5", "--generate", "4"]
        runs = {"resident": [], "one": ["--slots", "1"],
                "lru": ["--slots", "2", "--policy", "lru", "--threads", "2"],
                # every slot: the prefetch where the file has room for it
                "all": ["--slots", str(routed_experts(path))]}
        outs = {}
        for key, extra in runs.items():
            out = tmp_path / f"{path.stem}-{key}.bin"
            r = subprocess.run(base + extra + ["--logits-out", str(out)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and "runtime error" not in r.stderr, r.stderr
            outs[key] = out.read_bytes()
        assert outs["one"] == outs["resident"] == outs["lru"] == outs["all"], path
    bad = damaged(model("qwen2", "int8"), tmp_path, layer=0, expert=1,
                  kind=F.Kind.EXPERT_W1)
    r = subprocess.run([str(cli), "--model", str(bad), "--slots", "1", "--tokens",
                        ",".join(map(str, range(40)))], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "AddressSanitizer" not in r.stderr
    assert "EXPERT_W1 layer 0 expert 1" in r.stderr and "runtime error" not in r.stderr


def test_reader_thread_under_tsan(c_build, model, tmp_path):
    """The library's reader thread (a read in flight while an expert
    computes, on 1 and 2 compute threads), a damaged expert met with a read
    still in flight (drained), and colibri_free joining the thread: no
    report from ThreadSanitizer, the all-resident bits."""
    cli = c_build("tsan").cli
    path = model("mixtral", "int8")
    base = [str(cli), "--model", str(path), "--tokens", "1,2,3,4,5", "--generate", "4"]
    outs = {}
    # read-ahead needs more slots than a layer pass's 2 * top_k experts
    ahead = str(2 * SHAPE.top_k + 1)
    # and the prefetch: its reads queued, cancelled and settled
    every = str(routed_experts(path))
    for key, extra in {"resident": [], "two": ["--slots", "2"],
                       "three": ["--slots", ahead, "--threads", "2"],
                       "prefetch": ["--slots", every, "--threads", "2"]}.items():
        out = tmp_path / f"{key}.bin"
        r = subprocess.run(base + extra + ["--logits-out", str(out)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, r.stderr
        outs[key] = out.read_bytes()
    assert outs["two"] == outs["resident"] == outs["three"] == outs["prefetch"]
    bad = damaged(path, tmp_path, layer=SHAPE.n_layers - 1, expert=2)
    r = subprocess.run([str(cli), "--model", str(bad), "--slots", ahead, "--tokens",
                        ",".join(map(str, range(40)))], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and "ThreadSanitizer" not in r.stderr, r.stderr
    assert "EXPERT_W2 layer 2 expert 2" in r.stderr


def page_cache_pages(path: Path) -> tuple[int, int]:
    """(pages of the file the page cache holds, pages of the file): mincore
    over a mapping this process never touches."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size, page = path.stat().st_size, os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec), len(vec)


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)   # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or os.uname().sysname != "Linux",
                    reason="the page-cache probe (mincore) is the Linux reader's")
def test_a_streamed_run_leaves_the_page_cache_as_it_found_it(so, model, tmp_path):
    """The library's reader adds nothing to the page cache and takes nothing
    from it: cold, init's reads of the resident part are dropped after
    reading and experts are read direct; warm (every page cached, as after a
    mapped run), everything is used from the cache and stays there (before,
    init dropped the whole file, so a warm file was cold at every start).
    The same bits either way; mapped only where warm."""
    path = tmp_path / "m.colibri"
    shutil.copyfile(model("olmoe", "int8"), path)
    with runtime.Model(path, library=so) as m:
        want = session(m, m.vocab)
    drop_from_page_cache(path)
    held, total = page_cache_pages(path)
    if held:
        pytest.skip(f"the page cache kept {held} of {total} pages after POSIX_FADV_DONTNEED")
    with runtime.Model(path, library=so, slots=2) as m:
        got = session(m, m.vocab)
        st = m.stream_stats()
    assert np.array_equal(got, want) and st["misses"] >= 2
    assert st["resident_mapped"] == 0 and st["mapped"] == 0   # cold: read
    assert page_cache_pages(path) == (0, total)
    path.read_bytes()   # warm: every page cached
    assert page_cache_pages(path) == (total, total)
    with runtime.Model(path, library=so, slots=2) as m:
        got = session(m, m.vocab)
    assert np.array_equal(got, want)
    assert page_cache_pages(path) == (total, total)


def file_rss(path: Path) -> int:
    """Bytes of `path` this process has mapped in memory (the Rss of its
    mappings in /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"),
                    reason="counts the mapped file in /proc/self/smaps (Linux)")
def test_a_warm_run_maps_the_resident_part_and_what_the_slots_hold_only(so, model, tmp_path):
    """Warm, the resident part and the experts the slots hold are used where
    the page cache has them, through the mapped file, not copied: the
    process maps those pages and no more, not the experts' pages next to a
    resident one (which the kernel maps around a fault) nor an expert a slot
    gave up, so the budget holds. Half warm (the resident part and half the
    experts cached), the others are read, and a slot that a read has filled
    goes on reading. The same bits every way; the page cache as found."""
    path = tmp_path / "m.colibri"
    shutil.copyfile(model("qwen3", "int8", wide=True), path)
    page = os.sysconf("SC_PAGE_SIZE")
    entries = F.read_file(path).entries
    experts = [e for e in entries if e.kind in (F.Kind.EXPERT_W1, F.Kind.EXPERT_W3,
                                                F.Kind.EXPERT_W2)]
    resident = [e for e in entries if e not in experts]
    assert min(e.size for e in experts) > 4 * page   # whole pages to hide
    with runtime.Model(path, library=so) as m:
        want = session(m, m.vocab)
    # the pages of the header, the table and every resident section; then
    # the experts of the slots, at most a slot each (and a page either end)
    pages = set(range(-(-min(e.offset for e in entries) // page)))
    for e in resident:
        pages |= set(range(e.offset // page, (e.offset + e.size - 1) // page + 1))
    bound = len(pages) * page
    slots = 2
    with runtime.Model(path, library=so, slots=slots) as m:
        at_init = file_rss(path)
        got = session(m, m.vocab)
        st = m.stream_stats()
        mapped = file_rss(path)
    assert np.array_equal(got, want)
    assert st["resident_mapped"] == 1 and st["bytes_read"] == 0 and st["evictions"] > 0
    assert st["mapped"] > 2 * slots
    assert 0 < at_init <= bound, (at_init, bound)
    bound += slots * (st["slot_bytes"] + 2 * page)
    assert 0 < mapped <= bound, (mapped, bound)
    if not hasattr(os, "posix_fadvise"):
        return
    drop_from_page_cache(path)
    # half warm: the resident part and every other expert's sections
    # cached (no readahead past them), the other experts not
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, min(e.offset for e in entries), 0)   # header and table
        for e in resident + [e for e in experts if e.expert % 2 == 0]:
            os.pread(fd, e.size, e.offset)
    finally:
        os.close(fd)
    before = page_cache_pages(path)
    if not 0 < before[0] < before[1]:
        pytest.skip(f"the page cache holds {before[0]} of {before[1]} pages, not half")
    with runtime.Model(path, library=so, slots=4) as m:
        got = session(m, m.vocab)
        st = m.stream_stats()
    assert np.array_equal(got, want)
    assert st["mapped"] >= 1 and st["bytes_read"] > 0, st
    assert page_cache_pages(path) == before


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or os.uname().sysname != "Linux"
                    or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="runs the reader as another user (root, setpriv, Linux)")
def test_a_reader_that_may_not_ask_the_page_cache_reads_experts_direct(c_build, model):
    """Linux tells mincore's truth only to a process that owns the file or
    may write it; to any other it says every page is cached. A model file
    installed read-only for others (root's, 0644) run by another user: the
    reader must not believe it (it would read every expert through the
    cache, which a cgroup charges, and take the cache's pages for its own),
    so experts are read direct and leave nothing in the cache; the logits
    are the owner's."""
    import tempfile
    src = model("olmoe", "int8", wide=True)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        os.chmod(d, 0o755)
        path, cli = d / "m.colibri", d / "colibri-cli"
        shutil.copyfile(src, path)
        shutil.copyfile(c_build("host").cli, cli)
        os.chmod(path, 0o644)
        os.chmod(cli, 0o755)
        args = [str(cli), "--model", str(path), "--tokens", "1,2,3", "--generate", "4",
                "--slots", "2"]
        want = subprocess.run(args[:-2], capture_output=True, text=True, timeout=300)
        assert want.returncode == 0, want.stderr
        experts = sum(e.size for e in F.read_file(path).entries
                      if e.kind in (F.Kind.EXPERT_W1, F.Kind.EXPERT_W3, F.Kind.EXPERT_W2))
        drop_from_page_cache(path)
        assert page_cache_pages(path)[0] == 0
        got = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                              "--clear-groups", *args], capture_output=True, text=True,
                             timeout=300)
        assert got.returncode == 0, got.stderr
        assert got.stdout == want.stdout   # the same greedy tokens
        m = re.search(r"\((\d+\.\d) MB, ", got.stderr)
        assert m and float(m[1]) > 0, got.stderr   # experts read, not "cached"
        held, total = page_cache_pages(path)
        page = os.sysconf("SC_PAGE_SIZE")
        # what stays is the resident part the run mapped, not its experts
        assert held * page <= path.stat().st_size - experts + 64 * page, (held, total)


def test_own_reader_writes_only_the_bytes_asked_for(c_build, model):
    """The library's reader reads the header into a stack buffer of exactly
    its size. When that buffer happened to start on a 4096-byte boundary it
    took the O_DIRECT path and read a whole block into it (a CI run's ASan
    report; without ASan, heap corruption seen later). The stack's place
    follows the environment's size once ASLR is off (setarch -R), so 256
    paddings of 16 bytes put the buffer at every 16-byte offset of a page
    and one of them on its boundary."""
    if shutil.which("setarch") is None:
        pytest.skip("setarch (util-linux) not installed")
    cli = c_build("asan").cli
    path = model("qwen2", "int8")
    cmd = ["setarch", "x86_64", "-R", str(cli), "--model", str(path), "--slots", "1",
           "--info"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("setarch -R refused here (no personality(2) in this sandbox?)")

    def run(pad):
        env = dict(os.environ, COLIBRI_TEST_PAD="x" * pad)
        return pad, subprocess.run(cmd, env=env, capture_output=True, text=True,
                                   timeout=120)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for pad, r in pool.map(run, range(0, 4096, 16)):
            assert r.returncode == 0 and "expert_slots: 1" in r.stdout, (pad, r.stderr)


def test_colibri_plan_reports_what_the_runtime_holds(so, model, capsys, monkeypatch):
    """`colibri plan`: the slots and arena of the streamed instance, and the
    uniform-routing reads from the file's own expert sizes."""
    from colibri import cli
    monkeypatch.setenv("COLIBRI_LIBRARY", str(so))
    path = model("mixtral", "int8", wide=True)
    with runtime.Model(path, library=so, slots=1) as m:
        budget = m.info.arena_bytes + 2 * m.stream_stats()["slot_bytes"]
    with runtime.Model(path, library=so, ram=budget) as m:
        st, arena = m.stream_stats(), m.info.arena_bytes
    assert cli.main(["plan", str(path), "--ram", str(budget), "--tokens", "1,2,3",
                     "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert f"expert slots: {st['slots']} of" in out
    assert f"arena (all the instance holds): {arena / 1e6:,.1f} MB" in out
    cf = F.read_file(path)
    sizes = {}
    for e in cf.entries:
        if e.kind in (F.Kind.EXPERT_W1, F.Kind.EXPERT_W3, F.Kind.EXPERT_W2):
            sizes[(e.layer, e.expert)] = sizes.get((e.layer, e.expert), 0) + e.size
    miss = 1 - st["slots"] / len(sizes)
    reads = SHAPE.n_layers * SHAPE.top_k * miss
    assert f"({reads:.1f} experts)" in out
    assert out.count("measured, 3 tokens + 3 greedy steps") == len(runtime.SLOT_POLICIES)


# --- routing traces (colibri-cli --route-trace, colibri/model/route_trace.py) ---

_STATS = re.compile(r"experts: (\d+) slots, (\d+) uses, (\d+) hits \([^)]*\), (\d+) read")


def _traced_run(cli, path, out, *extra):
    r = subprocess.run([str(cli), "--model", str(path), "--tokens",
                        ",".join(str(i % 60) for i in range(3, 40, 3)), "--generate", "12",
                        "--route-trace", str(out), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = _STATS.search(r.stderr)
    return r, (tuple(map(int, m.groups())) if m else None)


@pytest.mark.parametrize("name", ["qwen3", "mixtral"])
def test_route_trace_replays_to_the_runtimes_own_counts(c_build, model, tmp_path, name):
    """The routing an all-resident run records is the routing of every
    streamed run (the same bits), and replaying it for a slot count and a
    policy gives exactly the hits and reads the streamed runtime counted:
    the replay is stream.c's cache, step for step (qwen3's first layer is
    dense: it has no line)."""
    cli = c_build("host").cli
    path = model(name, "int8")
    n_exp = routed_experts(path)
    _, none = _traced_run(cli, path, tmp_path / "resident.txt")
    assert none is None   # all resident: no slot statistics
    resident = (tmp_path / "resident.txt").read_text()
    trace = rt.read_trace(tmp_path / "resident.txt")
    assert trace.passes and trace.tokens() == 13 + 11
    assert all(sum(c for _, c in ex) % SHAPE.top_k == 0 for _, ex in trace.passes)
    for slots in (1, 2, 5, n_exp - 1, n_exp):
        for policy in rt.POLICIES:
            out = tmp_path / f"s{slots}-{policy}.txt"
            _, (got_slots, uses, hits, reads) = _traced_run(
                cli, path, out, "--slots", str(slots), "--policy", policy, "--prefetch", "0")
            assert out.read_text() == resident, (slots, policy)
            want = rt.replay(trace, slots, policy)
            assert (got_slots, uses, hits, reads) == (slots, want["uses"], want["hits"],
                                                      want["misses"]), (slots, policy)
    # the synchronous reader (no reader thread) makes the same choices
    r = subprocess.run([str(cli), "--model", str(path), "--tokens",
                        ",".join(str(i % 60) for i in range(3, 40, 3)), "--generate", "12",
                        "--slots", str(n_exp - 1)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, COLIBRI_STREAM_SYNC="1"))
    want = rt.replay(trace, n_exp - 1, "reuse")
    assert tuple(map(int, _STATS.search(r.stderr).groups())) == (
        n_exp - 1, want["uses"], want["hits"], want["misses"])
    # a slot for every expert: each expert the run routes to is read once
    distinct = {(layer, e) for layer, ex in trace.passes for e, _ in ex}
    assert rt.replay(trace, n_exp, "lru")["misses"] == len(distinct)


def test_route_trace_errors_and_plan_replay(so, c_build, model, tmp_path, capsys, monkeypatch):
    """`colibri plan --trace` prints the replay under each policy; a file
    that is not a trace, a malformed line, an expert out of range or a trace
    of another shape is one error line naming the file."""
    from colibri import cli
    monkeypatch.setenv("COLIBRI_LIBRARY", str(so))
    path = model("qwen2", "int8")
    good = tmp_path / "good.txt"
    _traced_run(c_build("host").cli, path, good)
    assert cli.main(["plan", str(path), "--slots", "3", "--trace", str(good)]) == 0
    out = capsys.readouterr().out
    for policy in rt.POLICIES:
        r = rt.replay(rt.read_trace(good), 3, policy)
        assert f"policy {policy}: hit rate {r['hits'] / r['uses']:.1%}" in out
        assert f"({r['misses']} reads)" in out
    head = good.read_text().splitlines()[0]
    for text, says in ((b"\xff\xfe", "cannot read"), ("hello\n", "not a route trace"),
                       (head + "\n0 1:x\n", ":2: expected"), (head + "\n0 99:1\n", "out of range"),
                       (head.replace(f"n_layers {SHAPE.n_layers}", "n_layers 7") + "\n",
                        "record it with this model")):
        bad = tmp_path / "bad.txt"
        bad.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert cli.main(["plan", str(path), "--slots", "3", "--trace", str(bad)]) == 2
        out, err = capsys.readouterr()
        assert says in err and err.count("\n") == 1 and not out, (out, err)


def test_route_observer_refuses_what_it_cannot_take(so):
    """colibri_set_route_observer: NULL model -7 (COLIBRI_E_ARG), an
    instance never initialised -13 (COLIBRI_E_NOT_INIT)."""
    import ctypes
    lib = runtime.load_library(so)
    f = lib.lib.colibri_set_route_observer
    f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    assert f(None, None, None) == -7
    blank = ctypes.create_string_buffer(lib.sizeof_model)
    assert f(blank, None, None) == -13


def test_reuse_policy_reads_less_than_lru_and_freq_on_trained_routing(c_build, tmp_path):
    """COLIBRI_SLOTS_REUSE (the default) on the routing of a trained router:
    the demo model (4 layers x 8 experts, top 2) prefilling four of its
    held-out evaluation windows, then 120 greedy tokens each. Replayed for
    every slot count from 2 to all but one (the replay is the runtime's
    cache: test_route_trace_replays_to_the_runtimes_own_counts), it reads no
    more experts than LRU at any count, and fewer than LRU and FREQ over
    all counts. (docs/STREAMING.md, "Policies", gives the table.)"""
    import importlib.util
    from colibri.model.convert import ColibriExporter
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("demo_eval", root / "models/demo/eval.py")
    demo_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_eval)
    path = ColibriExporter(root / "models/demo/checkpoint", quant="int8").export(
        tmp_path / "demo-int8.colibri")
    traces = []
    for k, ids in enumerate(demo_eval.window_ids(demo_eval.load_windows()[:4])):
        out = tmp_path / f"w{k}.txt"
        r = subprocess.run([str(c_build("host").cli), "--model", str(path), "--tokens",
                            ",".join(map(str, ids.tolist())), "--generate", "120",
                            "--route-trace", str(out)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        traces.append(rt.read_trace(out))
    n_exp = traces[0].n_layers * traces[0].n_experts
    reads = {p: [sum(rt.replay(t, slots, p)["misses"] for t in traces)
                 for slots in range(2, n_exp)] for p in rt.POLICIES}
    assert all(a <= b for a, b in zip(reads["reuse"], reads["lru"])), reads
    assert sum(reads["reuse"]) < min(sum(reads["lru"]), sum(reads["freq"])), reads


def test_a_prefetched_damaged_expert_is_an_error_only_where_a_pass_uses_it(so, model,
                                                                          tmp_path, fill):
    """A prefetch reads what the hidden state predicts, used or not: a
    damaged expert it reads is counted, and is an error exactly at the
    steps whose routing uses it, as without prefetch (the slot stays empty;
    the use reads it again). Never wrong logits; the all-resident judge."""
    path = model("mixtral", "int8")
    bad = damaged(path, tmp_path, layer=SHAPE.n_layers - 1, expert=2)
    total = routed_experts(path)
    outcomes, stats = {}, {}
    with runtime.Model(path, library=so) as good:
        for prefetch in (0, SHAPE.top_k):
            got = []
            with runtime.Model(bad, library=so, slots=total, prefetch=prefetch) as m:
                for t in range(SHAPE.vocab):   # each token alone, position 0
                    try:
                        logits = m.infer([[t]])
                    except errors.RuntimeCRCError as exc:
                        assert "EXPERT_W2 layer 2 expert 2" in str(exc)
                        got.append("crc")
                        continue
                    assert np.array_equal(logits, good.infer([[t]]))
                    got.append("ok")
                stats[prefetch] = m.stream_stats()
            outcomes[prefetch] = got
    assert outcomes[0] == outcomes[SHAPE.top_k] and {"ok", "crc"} <= set(outcomes[0])
    on = stats[SHAPE.top_k]
    assert on["prefetch"] == SHAPE.top_k and on["prefetched"] >= 1
    # each failing step read it at least once (a prefetch that predicted it
    # for a step that did not use it, and began it, counts one more)
    assert on["errors"] >= outcomes[0].count("crc") == stats[0]["errors"]


def test_prefetch_predicts_trained_routing(c_build, tmp_path):
    """The prediction on a trained router: the demo model (4 layers x 8
    experts, top 2) over two held-out windows and 60 greedy tokens each,
    with 12 slots for its 32 experts. With prefetch, most of what is
    predicted is used, and most of the reads a pass would have waited for
    are done or in flight when it needs them: the uses that start a read
    fall to under half. The logits are the same bits."""
    import importlib.util
    from colibri.model.convert import ColibriExporter
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("demo_eval", root / "models/demo/eval.py")
    demo_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_eval)
    path = ColibriExporter(root / "models/demo/checkpoint", quant="int8").export(
        tmp_path / "demo-int8.colibri")
    stats = re.compile(r"experts: \d+ slots, (\d+) uses, (\d+) hits \([^)]*\), (\d+) read"
                       r".*prefetch (\d+) a layer: (\d+) read, (\d+) hit, (\d+) cancelled")
    cli = str(c_build("host").cli)
    for k, ids in enumerate(demo_eval.window_ids(demo_eval.load_windows()[:2])):
        runs = {}
        for prefetch in ("0", "2"):
            out = tmp_path / f"w{k}-{prefetch}.bin"
            r = subprocess.run([cli, "--model", str(path), "--tokens",
                                ",".join(map(str, ids.tolist())), "--generate", "60",
                                "--slots", "12", "--prefetch", prefetch, "--logits-out",
                                str(out)], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            runs[prefetch] = (out.read_bytes(), r.stderr)
        assert runs["0"][0] == runs["2"][0]
        assert "prefetch" not in runs["0"][1].split("experts:")[1]
        uses0, hits0, _ = map(int, _STATS.search(runs["0"][1]).groups()[1:])
        uses, hits, reads, per, fetched, used, cancelled = map(
            int, stats.search(runs["2"][1]).groups())
        assert per == 2 and uses == uses0   # the same routing
        misses0, misses = uses0 - hits0, uses - hits
        assert reads == misses + fetched - cancelled
        assert used >= 0.7 * fetched, runs["2"][1]
        assert misses < 0.5 * misses0, (misses0, runs["2"][1])
