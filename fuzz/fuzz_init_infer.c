/*
 * fuzz_init_infer.c - libFuzzer harness: colibri_init_from_memory (or
 * colibri_init through a memfd, for the byte-swapping path) over arbitrary
 * bytes, then colibri_infer with inputs taken from the input's tail, then
 * colibri_verify.
 *
 * Input layout:  [ model bytes ... ][ 16-byte control tail ]
 *   tail[0]  flags (FL_* below)
 *   tail[1]  batch:  1 + tail[1] % (max_batch + 1)  (may exceed max_batch)
 *   tail[2]  seq:    1 + tail[2] % (max_seq_len + 1), capped at MAX_SEQ
 *   tail[3]  attention-mask bits (with FL_MASK), bit i % 8 for token i
 *   tail[4..15] token bytes: id = byte % vocab, or with FL_RAW_IDS the byte
 *            as a signed int8 scaled by vocab/64 (negative and >= vocab ids)
 *
 * FL_FIX_CRCS recomputes every CRC the structure lets us find (sections,
 * table, header) before loading, so mutations reach the checks and the
 * forward pass behind the CRCs instead of stopping at the first CRC.
 *
 * The model bytes are copied into a buffer of exactly their size so
 * AddressSanitizer catches any read past the end of the file. Arenas above
 * ARENA_CAP are not allocated (a hostile header may ask for terabytes;
 * that refusal is tested elsewhere): init then gets a too-small arena and
 * must say so.
 *
 * Every input also opens a streamed instance (colibri_init_stream, one or
 * two expert slots, a reader over the same bytes) and holds it to the
 * all-resident one: where both run the same call in one chunk, the logits
 * must be the same bits, and a file the all-resident path accepts must
 * stream (a contradiction aborts: a crash to libFuzzer and to the replay).
 *
 * Built two ways: with clang -fsanitize=fuzzer (fuzz/run.sh) and with a
 * plain main() (fuzz/replay_main.c) that replays files, for the test suite.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "colibri.h"
#include "fuzz_harness.h"

#define TAIL 16
#define ARENA_CAP ((size_t)64 << 20)   /* bytes */
#define LOGITS_CAP ((size_t)1 << 20)   /* floats per call */
#define MAX_SEQ 12u

enum {
    FL_FIX_CRCS = 1, FL_MASK = 2, FL_RAW_IDS = 4, FL_DECODE = 8,
    FL_VIA_FILE = 16, FL_VERIFY = 32, FL_REWIND = 64, FL_NULL_MASK_DECODE = 128
};

static uint32_t crc_table[256];

static uint32_t crc32_z(const uint8_t *p, uint64_t n)
{
    if (!crc_table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
            crc_table[i] = c;
        }
    }
    uint32_t c = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

static uint64_t get(const uint8_t *p, int bytes, int be)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[be ? bytes - 1 - i : i] << (8 * i);
    return v;
}

static void put(uint8_t *p, uint64_t v, int bytes, int be)
{
    for (int i = 0; i < bytes; i++)
        p[be ? bytes - 1 - i : i] = (uint8_t)(v >> (8 * i));
}

/* Recompute section CRCs (entries whose range lies in the file), then the
 * table CRC, then the header CRC: the order in which they cover each other. */
static void fix_crcs(uint8_t *b, size_t size)
{
    if (size < COLIBRI_HEADER_SIZE)
        return;
    int be = b[COLIBRI_HDR_BOM] == 0xFE;
    uint64_t n = get(b + COLIBRI_HDR_N_TENSORS, 4, be);
    if (n <= (size - COLIBRI_TABLE_OFFSET) / COLIBRI_ENTRY_SIZE) {
        uint8_t *tab = b + COLIBRI_TABLE_OFFSET;
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *en = tab + i * COLIBRI_ENTRY_SIZE;
            uint64_t off = get(en + COLIBRI_ENT_OFFSET, 8, be);
            uint64_t sz = get(en + COLIBRI_ENT_SIZE, 8, be);
            if (off <= size && sz <= size - off)
                put(en + COLIBRI_ENT_CRC, crc32_z(b + off, sz), 4, be);
        }
        put(b + COLIBRI_HDR_TABLE_CRC, crc32_z(tab, n * COLIBRI_ENTRY_SIZE), 4, be);
    }
    put(b + COLIBRI_HDR_HEADER_CRC, crc32_z(b, COLIBRI_HDR_HEADER_CRC), 4, be);
}

static void on_bad(void *user, int index, const char *what)
{
    (void)index;
    /* The message must be a terminated string: strlen reads all of it. */
    *(size_t *)user += strlen(what);
}

/* The error detail must always be a terminated string within its buffer;
 * the first non-empty one is kept for the replay report. */
static void check_detail(const colibri_model *m, fuzz_result *r)
{
    const char *d = colibri_error_detail(m);
    size_t n = strnlen(d, sizeof m->priv_.detail);
    if (n >= sizeof m->priv_.detail)
        abort(); /* unterminated detail: a harness-visible bug */
    if (!r->detail[0] && n < sizeof r->detail)
        memcpy(r->detail, d, n + 1);
}

static int load(colibri_model *m, const uint8_t *blob, size_t size, int via_file,
                void *arena, size_t arena_size)
{
    if (!via_file)
        return colibri_init_from_memory(m, blob, size, arena, arena_size);
    /* colibri_init maps the file and byte-swaps a foreign-order one. */
    int fd = memfd_create("colibri-fuzz", 0);
    if (fd < 0)
        return colibri_init_from_memory(m, blob, size, arena, arena_size);
    int rc;
    if (write(fd, blob, size) != (ssize_t)size) {
        rc = colibri_init_from_memory(m, blob, size, arena, arena_size);
    } else {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        rc = colibri_init(m, path);
    }
    close(fd);
    return rc;
}

typedef struct { const uint8_t *b; size_t n; } mem_file;

static int mem_read(void *user, uint64_t off, void *dst, size_t n)
{
    const mem_file *f = (const mem_file *)user;
    if (off > f->n || n > f->n - off)
        abort(); /* the library asked past the file's end */
    memcpy(dst, f->b + off, n);
    return 0;
}

/* The streamed instance of blob, one or two slots. With want (the
 * all-resident instance ran ids [batch, seq] in one chunk): the same call
 * must give the same bits. Without (the resident path refused the file,
 * e.g. a damaged expert, or did not run): a few tokens from the tail,
 * which may stop at the damage but must not misbehave. */
static void stream_check(const uint8_t *blob, size_t size, const uint8_t *tail,
                         int resident_rc, const int32_t *ids, const uint8_t *mask,
                         uint32_t batch, uint32_t seq, const float *want, size_t n_logits)
{
    mem_file f = { blob, size };
    colibri_reader rd = { mem_read, &f, size };
    colibri_options o = colibri_options_default();
    o.expert_slots = 1 + (tail[1] & 1u);
    size_t need = 0;
    int rc = colibri_stream_arena_size(&rd, &o, &need, NULL);
    if (rc == COLIBRI_E_ARG) { /* fewer experts than slots */
        o.expert_slots = 1;
        rc = colibri_stream_arena_size(&rd, &o, &need, NULL);
    }
    if (rc || need > ARENA_CAP) {
        /* what the resident path loads must stream, unless it cannot: no
         * routed expert (_UNSUPPORTED), an encoder-decoder (_ARG with the
         * one slot every decoder-only file with experts takes) */
        if (resident_rc == COLIBRI_OK && rc && rc != COLIBRI_E_UNSUPPORTED
            && rc != COLIBRI_E_ARG)
            abort();
        return;
    }
    void *arena = aligned_alloc(64, (need + 63) / 64 * 64);
    colibri_model m;
    rc = colibri_init_stream(&m, &rd, arena, need, &o);
    if (rc != COLIBRI_OK && resident_rc == COLIBRI_OK)
        abort();
    colibri_info info;
    if (rc == COLIBRI_OK && colibri_get_info(&m, &info) == COLIBRI_OK) {
        int32_t own[4];
        float *got;
        if (want) {
            got = (float *)malloc(n_logits * sizeof(float));
            int irc = colibri_infer(&m, ids, mask, batch, seq, 0, got);
            if (irc != COLIBRI_OK || memcmp(got, want, n_logits * sizeof(float)) != 0)
                abort();
        } else {
            uint32_t n = info.shape.max_seq_len < 4 ? info.shape.max_seq_len : 4;
            for (uint32_t i = 0; i < n; i++)
                own[i] = (int32_t)(tail[4 + i] % info.shape.vocab);
            got = (size_t)n * info.shape.vocab <= LOGITS_CAP
                      ? (float *)malloc((size_t)n * info.shape.vocab * sizeof(float)) : NULL;
            if (got)
                (void)colibri_infer(&m, own, NULL, 1, n, 0, got);
        }
        free(got);
    }
    colibri_free(&m);
    free(arena);
}

int fuzz_one(const uint8_t *data, size_t size, fuzz_result *r)
{
    memset(r, 0, sizeof *r);
    r->arena_rc = r->init_rc = r->infer_rc = r->decode_rc = r->verify_rc = 1;
    if (size < TAIL)
        return 0;
    size_t msize = size - TAIL;
    const uint8_t *tail = data + msize;
    unsigned flags = tail[0];
    uint8_t *blob = (uint8_t *)malloc(msize ? msize : 1);
    if (!blob)
        return 0;
    memcpy(blob, data, msize);
    if (flags & FL_FIX_CRCS)
        fix_crcs(blob, msize);

    size_t need = 0;
    r->arena_rc = colibri_arena_size(blob, msize, &need);
    int fits = r->arena_rc == COLIBRI_OK && need <= ARENA_CAP;
    size_t arena_size = fits ? (need + 63) / 64 * 64 : 64;
    void *arena = aligned_alloc(64, arena_size);
    colibri_model m;
    /* A model too large for the cap may not be loaded through the file
     * path either (the library would allocate it). */
    int via_file = (flags & FL_VIA_FILE) && fits;
    r->init_rc = load(&m, blob, msize, via_file, arena, arena_size);
    check_detail(&m, r);
    if (r->init_rc == COLIBRI_OK) {
        colibri_info info;
        if (colibri_get_info(&m, &info) != COLIBRI_OK)
            abort();
        const colibri_shape *s = &info.shape;
        uint32_t batch = 1 + tail[1] % ((uint32_t)s->max_batch + 1);
        uint32_t seq_lim = s->max_seq_len < MAX_SEQ ? s->max_seq_len : MAX_SEQ;
        uint32_t seq = 1 + tail[2] % (seq_lim + 1);
        /* Keep the logits buffer bounded: a huge vocab gets one token. */
        while ((size_t)batch * seq * s->vocab > LOGITS_CAP && (batch > 1 || seq > 1)) {
            if (seq > 1)
                seq--;
            else
                batch--;
        }
        size_t nt = (size_t)batch * seq;
        if (nt * s->vocab <= LOGITS_CAP) {
            int32_t *ids = (int32_t *)malloc(nt * sizeof *ids);
            uint8_t *mask = (uint8_t *)malloc(nt);
            float *logits = (float *)malloc(nt * s->vocab * sizeof(float));
            for (size_t i = 0; i < nt; i++) {
                uint8_t t = tail[4 + i % 12];
                ids[i] = (flags & FL_RAW_IDS)
                             ? (int32_t)(int8_t)t * (int32_t)(s->vocab / 64 + 1)
                             : (int32_t)(t % s->vocab);
                mask[i] = (tail[3] >> (i % 8)) & 1;
            }
            /* An encoder-decoder (ENC_DEC) runs the same ids through its
             * encoder first; the decoder then sees them too. */
            r->infer_rc = colibri_decoder_start(&m) < 0 ? COLIBRI_OK
                          : colibri_encode(&m, ids, (flags & FL_MASK) ? mask : NULL,
                                           batch, seq);
            if (r->infer_rc == COLIBRI_OK)
                r->infer_rc = colibri_infer(&m, ids, (flags & FL_MASK) ? mask : NULL,
                                            batch, seq, 0, logits);
            check_detail(&m, r);
            if (r->infer_rc == COLIBRI_OK) {
                for (size_t i = 0; i < nt * s->vocab; i++)
                    if (!(logits[i] - logits[i] == 0.0f))
                        r->nonfinite = 1;
            }
            /* one chunk in both (COLIBRI_CHUNK_TOKENS): the same bits */
            if (r->infer_rc == COLIBRI_OK && nt <= 16)
                stream_check(blob, msize, tail, r->init_rc, ids,
                             (flags & FL_MASK) ? mask : NULL, batch, seq, logits,
                             nt * s->vocab);
            if (r->infer_rc == COLIBRI_OK && (flags & FL_DECODE)) {
                /* One decode step per sequence, continuing or rewinding. */
                uint32_t n_past = (flags & FL_REWIND) ? seq / 2 : seq;
                r->decode_rc = colibri_infer(&m, ids, (flags & FL_NULL_MASK_DECODE)
                                             ? NULL : mask, batch, 1, n_past, logits);
                check_detail(&m, r);
            }
            free(ids);
            free(mask);
            free(logits);
        }
        colibri_free(&m);
    } else {
        stream_check(blob, msize, tail, r->init_rc, NULL, NULL, 0, 0, NULL, 0);
    }
    if (flags & FL_VERIFY) {
        size_t total = 0;
        uint32_t nbad = 0;
        r->verify_rc = colibri_verify(blob, msize, on_bad, &total, &nbad);
    }
    free(arena);
    free(blob);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_result r;
    return fuzz_one(data, size, &r);
}
