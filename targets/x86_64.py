"""x86-64 Linux, the host: AVX2+FMA kernels with the reference fallback chosen
at run time, dynamic work buffer. Runs natively.

mmap off: colibri_init reads the file into an anonymous region advised
MADV_HUGEPAGE. A decode step streams every weight once, and on 4 KiB pages
(which is what a mapped file gets) the small benchmark model decoded 1.4x
slower (int8: 23.3 against 16.4 ms a token, bench/results/FINDINGS.md). The
price is a private copy of the file instead of sharing the page cache;
threads share one copy with colibri_share. mmap=1 brings the mapping back."""
from . import Target

TARGET = Target(
    name="x86_64",
    description="x86-64 Linux (host gcc), AVX2+FMA kernels, runs natively",
    os="linux",
    prefix="",
    package="gcc",
    arch_flags=("-m64",),
    byte_order="little",
    pointer_bytes=8,
    kernels=("avx2",),
    defaults=dict(mmap=False, workbuf="dynamic", avx2=True, fma=True, neon=False),
    # Native. qemu-x86_64 -cpu Haswell (package qemu-user) also runs the same
    # binaries; the matrix uses native runs because they are 30x faster.
    emulator=(),
    emulator_package="",
    ram_bytes=64 << 20,
    flash_bytes=16 << 20,
    # The tokenizer's NFC tables (32 KiB) stay out of the firmware library's
    # budget: an NFC tokenizer is COLIBRI_E_UNSUPPORTED in this build (the host
    # library colibri.buildsteps.cbuild makes, and libcolibri.so, have them).
    defines=("COLIBRI_NO_TOK_NORM",),
    budgets=dict(
        # libcolibri.a text+rodata+data. The host carries four x86 tables
        # (AVX2, VEX and EVEX VNNI, AVX-512 VNNI), each with its block
        # kernels specialised per tile shape (decode 8 rows, prefill 4 x 2 or
        # 1 x 8, tails; AVX-512's own Q4_K / Q6_K decode and 8 x 4, 8 x 2 prefill tiles),
        # about 125 KiB, the tokenizer's Unicode 16 General_Category table
        # (16 KiB, for stored regex programs) and the streamed experts:
        # 289.7 KiB (294.3 with Unigram and NFKC, FORMAT.md 7.3; 296.8 with the normaliser programs and the byte-alphabet steps, 7.4; 301.3 with the streamed reader's thread in this mmap=0 build), so 320 KiB (the AVX-512 prefill forms, 1.3-1.4x avx2's
        # on q4 prefill, took it past 288). Then 337.7 KiB: AVX-512's 8 x 4
        # Q4_K / Q6_K prefill tiles (+13.7 KiB; q4 prefill 1.22x on Zen 4)
        # and the AVX-512 and AVX2 attention tiles at four widths (+23.6
        # KiB; prefill at 2048 positions 3.5x, decode there 1.5x), so 352
        # KiB; the Precompiled normaliser (FORMAT.md 7.5) 2.7 more: 340.4
        # KiB; the int8 decode form on 2 rows a block, 339.4; Q5_0 (the
        # narrow-row fallback of the 4-bit mix) in the three AVX2 tables,
        # 358.0; Q5_K (GGUF imports: one plain-AVX2 form in all three
        # tables, 17 KiB), 376.9, so 384 KiB; the prefetch of streamed
        # experts (docs/STREAMING.md) 2.9: 379.8; the PCLMULQDQ CRC-32
        # (a 7.9 GB file's check 3.9 s -> 1.1 s) 0.6: 380.4; the int8
        # decode form that loads a group ahead (three tables; bench/results/
        # FINDINGS.md 13) and the streamed reader's page-cache probe: 385.6,
        # so 392 KiB; the mapping of a warm file 389.3; the VPCLMULQDQ CRC
        # (16-21 GB/s against 9-10 on Zen 3), checks on the reader thread
        # and the resident part checked in two halves (a warm first token
        # 0.35 -> 0.20 s, docs/STREAMING.md): 391.6, so 400 KiB; one decode
        # row per memory stream (int8 decode 53 -> 96 tokens/s on Zen 3,
        # bench/results/FINDINGS.md 14): 395.3; the int8 KV row in one
        # load and avx512.c's decode streams (Xeon q4 decode 88.5 -> 135.3
        # tokens/s, FINDINGS.md 15): 397.7; AVX-512's Q5_K prefill tiles
        # (the 4-bit mix's LM head and GGUF Q5_K_M imports; 128-token Q5_K
        # products 64 -> 128 GOPS on a Xeon): 411.1, so 416 KiB; attention
        # tiles grouped over a block (keys transposed once for 8 or 4
        # tiles), a branch-free form for whole blocks and a vector max
        # (prefill attention at 2048 positions 1.5x, FINDINGS.md 17):
        # 417.9, so 424 KiB; the K types' prefill in one-row x 8-token tiles
        # over L2 panels in the AVX2 tables (q4 prefill 1.37x there,
        # FINDINGS.md 18): 416.2; the block types in GGUF's layouts (fp16
        # scales through F16C in the AVX2 tiles and AVX-512's 8-row scale
        # gathers, FINDINGS.md 19): 421.7; the attention's fused
        # multiply-adds (16-column value passes, FINDINGS.md 21): 423.0; the
        # avx2 int8 GEMM in int16 pairs and its next-chunk prefetch
        # (FINDINGS.md 22): 423.6; the attention forms' tile bookkeeping
        # shared with the NEON form (kernels.h clb_att_block_lanes): 423.8;
        # their prefetch as one inline step (clb_att_prefetch_ahead): 423.3;
        # Q4_0 / Q5_0 prefill through the int8 GEMM, so their tiles for the
        # rows past the last strip went from 1 x 8 to 1 x 1 (FINDINGS.md
        # 24): 414.6; the int8 GEMM's activations biased once a tile: 413.8;
        # avx512.c's zmm micro-kernel in that GEMM (x86_gemm.h): 415.9;
        # avx512.c's GEMM for the K types (Q4_K / Q5_K / Q6_K prefill from
        # 12 tokens 1.5-2.2x, FINDINGS.md 25; its unpack one instance a
        # type with the rows unrolled, 10.6 KiB: 26 KiB fully unrolled, 4.2
        # as one copy of loops, 10 % slower end to end): 434.2, so 440 KiB; its
        # micro-kernel widths behind one dispatcher: 433.9; the SwiGLU's
        # SiLU in the kernel tables (kernels.h silu_mul): 435.2; RMSNorm,
        # the activations' quantisation and RoPE in parallel rows: 435.9;
        # the experts' combine and the residual adds too: 436.1; tiles
        # taken in runs (threads.c run_tiles): 436.2; the SiLU a row pass
        # too (its own tiling gone): 436.1; the K types' GEMM in the AVX2
        # tables (Q4_K / Q5_K / Q6_K prefill from 12 tokens 1.3-1.6x at
        # 128 tokens, FINDINGS.md 27; its unpack one instance a type, 14.4
        # KiB: one for the three, 7.7, was 3-8 % slower from 12 to 32
        # tokens), its driver shared with avx512.c: 459.0, so 464 KiB; Q4_0
        # and Q5_0 prefill without VNNI in int16 runs of bytes (1.3x at 128
        # tokens; runs of a whole Q4_0 block as well were 3 KiB more for
        # the same speed): 461.7; the pack on avx2.c's one 8 x 8 transpose: 461.6;
        # the decode tile's scales two rows a ymm, every type's d in one
        # conversion (FINDINGS.md 28): 459.8; Q6_K decode prefetching
        # line starts (FINDINGS.md 29): 461.0; T5 attention with dot
        # products and output columns in flight (encdec.c t5_attend): 461.4;
        # T5's attention on the kernel table's attend_rows: 461.3; the KV
        # rows of the plan and of the encoder-decoder shared (clb_kv_rows): 460.0;
        # avx512 Q6_K zero-extending its scale operand (FINDINGS.md 31): 460.1;
        # Zen 5 (FINDINGS.md 32): the AVX-512 attention's plain loads on
        # full masks and a Q5_K decode tile: 467.5, so 470 KiB; Q4_0's own
        # AVX-512 decode tile and the decode tiles' requests inline (GGUF
        # Q4_0 decode 1.15x on Zen 5, FINDINGS.md 35): 472.6, so 480 KiB; Q8_0,
        # llama.cpp's 8.5-bit block (its AVX-512 decode tile, one AVX2 form of its
        # tiles in the three tables): 481.2, so 488 KiB; 482.1 with its GEMM
        # pack reading the blocks in place; 481.8 with its AVX2 tiles in
        # q4_0_dots (one form of the 32-column blocks).
        # The embedded targets keep their own budgets.
        runtime=488 << 10,
        firmware_flash=4 << 20,   # static executable incl. libc and the model (demo: 2 MiB)
        firmware_ram=16 << 20,    # data+bss (arena included)
        image=4 << 20,            # packed firmware.bin against the slot
    ),
    link_flags=("-static",),
    run_timeout=60.0,
)
