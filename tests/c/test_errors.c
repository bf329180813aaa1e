/*
 * test_errors.c - provokes every error code of colibri.h and checks it.
 *
 *   test_errors GOOD OTHER_ORDER HUGE
 *
 * GOOD: a valid model in the host byte order; OTHER_ORDER: the same model in
 * the other byte order; HUGE: a valid model whose arena cannot be allocated
 * (max_seq_len near 2^32). Corrupted variants are made here in memory, with
 * the header CRC recomputed where the point is a field's range (this file's
 * own bitwise CRC32, independent of the library's).
 * One line per case: "ok CODE label" or "FAIL label: got X, want Y". Codes
 * that need the other kind of build are covered by running this program in
 * both (COLIBRI_E_UNSUPPORTED: static work-buffer build; COLIBRI_E_NO_MEMORY
 * from a failing malloc: dynamic build). Exit status 1 if any case failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "colibri_tokenizer.h"

static int failures;

static void expect(int got, int want, const char *label, const colibri_model *m)
{
    if (got == want) {
        printf("ok %d %s | %s\n", got, label, m ? colibri_error_detail(m) : "");
    } else {
        printf("FAIL %s: got %d (%s), want %d (%s) | %s\n", label, got,
               colibri_strerror(got), want, colibri_strerror(want),
               m ? colibri_error_detail(m) : "");
        failures++;
    }
}

typedef struct { void *base; uint8_t *data; size_t size; } buf;

static buf read_all(const char *path)
{
    buf b = { NULL, NULL, 0 };
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    b.size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    b.base = malloc(b.size + 128);
    b.data = (uint8_t *)(((uintptr_t)b.base + 63) & ~(uintptr_t)63);
    if (fread(b.data, 1, b.size, f) != b.size)
        exit(2);
    fclose(f);
    return b;
}

static buf copy_of(const buf *src)
{
    buf b = *src;
    b.base = malloc(b.size + 128);
    b.data = (uint8_t *)(((uintptr_t)b.base + 63) & ~(uintptr_t)63);
    memcpy(b.data, src->data, b.size);
    return b;
}

static uint32_t crc32_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static int file_be(const uint8_t *d) { return d[COLIBRI_HDR_BOM] == 0xFE; }

static void put(uint8_t *p, uint64_t v, int bytes, int be)
{
    for (int i = 0; i < bytes; i++)
        p[be ? bytes - 1 - i : i] = (uint8_t)(v >> (8 * i));
}

static void fix_header_crc(uint8_t *d)
{
    put(d + COLIBRI_HDR_HEADER_CRC, crc32_bitwise(d, COLIBRI_HDR_HEADER_CRC), 4,
        file_be(d));
}

/* An arena for GOOD, 64-byte aligned, plus slack for misalignment tests. */
static void *arena_base;
static uint8_t *arena;
static size_t arena_need;

static int init_mem(colibri_model *m, const buf *b)
{
    return colibri_init_from_memory(m, b->data, b->size, arena, arena_need);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_errors GOOD OTHER_ORDER HUGE\n");
        return 2;
    }
    unsigned flags = colibri_build_flags();
    int is_static = (flags & COLIBRI_BUILD_STATIC_WORKBUF) != 0;
    buf good = read_all(argv[1]), other = read_all(argv[2]);
    colibri_model m;

    expect(colibri_arena_size(good.data, good.size, &arena_need), COLIBRI_OK,
           "arena size of the good file", NULL);
    arena_base = malloc(arena_need + 128);
    arena = (uint8_t *)(((uintptr_t)arena_base + 63) & ~(uintptr_t)63);

    /* ---- init: format ---- */
    buf b = copy_of(&good);
    b.data[0] = 'X';
    expect(init_mem(&m, &b), COLIBRI_E_BAD_FORMAT, "bad magic", &m);
    free(b.base);

    b = copy_of(&good);
    b.size -= 64;
    expect(init_mem(&m, &b), COLIBRI_E_BAD_FORMAT, "truncated file", &m);
    b.size = 40;
    expect(init_mem(&m, &b), COLIBRI_E_BAD_FORMAT, "shorter than the header", &m);
    free(b.base);

    b = copy_of(&good);
    put(b.data + COLIBRI_HDR_N_KV_HEADS, 3, 2, file_be(b.data));
    fix_header_crc(b.data);
    expect(init_mem(&m, &b), COLIBRI_E_BAD_FORMAT, "n_kv_heads not dividing n_heads", &m);
    free(b.base);

    b = copy_of(&good);
    put(b.data + COLIBRI_HDR_VERSION, COLIBRI_FORMAT_VERSION + 1, 2, file_be(b.data));
    fix_header_crc(b.data);
    expect(init_mem(&m, &b), COLIBRI_E_VERSION, "format version newer than supported", &m);
    free(b.base);

    /* ---- init: CRCs ---- */
    b = copy_of(&good);
    b.data[COLIBRI_HDR_HEADER_CRC] ^= 1;
    expect(init_mem(&m, &b), COLIBRI_E_CRC, "header crc", &m);
    free(b.base);

    b = copy_of(&good);
    b.data[COLIBRI_TABLE_OFFSET + COLIBRI_ENT_CRC] ^= 0x10;
    expect(init_mem(&m, &b), COLIBRI_E_CRC, "table crc", &m);
    free(b.base);

    b = copy_of(&good);
    b.data[b.size - 200] ^= 0x01; /* inside the last section (lm_head) */
    expect(init_mem(&m, &b), COLIBRI_E_CRC, "section crc", &m);
    free(b.base);

    /* ---- init: byte order, alignment, arena ---- */
    expect(colibri_init_from_memory(&m, other.data, other.size, arena, arena_need),
           COLIBRI_E_BYTE_ORDER, "zero-copy of the other byte order", &m);

    b = copy_of(&good);
    memmove(b.data + 1, b.data, b.size);
    expect(colibri_init_from_memory(&m, b.data + 1, b.size, arena, arena_need),
           COLIBRI_E_ALIGN, "misaligned blob", &m);
    free(b.base);
    expect(colibri_init_from_memory(&m, good.data, good.size, arena + 8, arena_need),
           COLIBRI_E_ALIGN, "misaligned arena", &m);
    expect(colibri_init_from_memory(&m, good.data, good.size, arena, arena_need - 1),
           COLIBRI_E_ARENA_TOO_SMALL, "arena one byte short", &m);

    /* ---- init: bad arguments, I/O ---- */
    expect(colibri_init_from_memory(&m, NULL, good.size, arena, arena_need),
           COLIBRI_E_ARG, "NULL blob", &m);
    expect(colibri_init_from_memory(NULL, good.data, good.size, arena, arena_need),
           COLIBRI_E_ARG, "NULL model", NULL);
    size_t sz;
    expect(colibri_arena_size(good.data, good.size, NULL), COLIBRI_E_ARG,
           "arena size to NULL", NULL);

    /* A header whose arena does not fit in 64 bits. */
    b = copy_of(&good);
    int be = file_be(b.data);
    put(b.data + COLIBRI_HDR_N_LAYERS, 0xFFFE, 2, be);
    put(b.data + COLIBRI_HDR_MAX_BATCH, 0xFFFF, 2, be);
    put(b.data + COLIBRI_HDR_MAX_SEQ_LEN, 0xFFFFFFFFu, 4, be);
    put(b.data + COLIBRI_HDR_N_KV_HEADS, 0xFFFF, 2, be);
    put(b.data + COLIBRI_HDR_N_HEADS, 0xFFFF, 2, be);
    fix_header_crc(b.data);
    expect(colibri_arena_size(b.data, b.size, &sz), COLIBRI_E_NO_MEMORY,
           "arena size overflows", NULL);
    free(b.base);

    if (is_static) {
        expect(colibri_init(&m, argv[1]), COLIBRI_E_UNSUPPORTED,
               "colibri_init in a static work-buffer build", &m);
        expect(colibri_init_from_memory(&m, good.data, good.size, NULL, 0),
               COLIBRI_E_ARG, "static build without an arena", &m);
    } else {
        expect(colibri_init(&m, "/nonexistent/model.colibri"), COLIBRI_E_IO,
               "missing file", &m);
        expect(colibri_init(&m, NULL), COLIBRI_E_ARG, "NULL path", &m);
        expect(colibri_init(&m, argv[3]), COLIBRI_E_NO_MEMORY,
               "arena larger than memory", &m);
        colibri_free(&m);
        /* The other byte order is fine when the library may allocate. */
        expect(colibri_init(&m, argv[2]), COLIBRI_OK, "other byte order swapped", &m);
        colibri_free(&m);
    }

    /* ---- infer ---- */
    expect(init_mem(&m, &good), COLIBRI_OK, "init the good file", &m);
    colibri_info info;
    colibri_get_info(&m, &info);
    uint32_t V = info.shape.vocab, S = info.shape.max_seq_len, B = info.shape.max_batch;
    size_t cap = (size_t)(B + 1) * (S + 1);
    int32_t *ids = (int32_t *)calloc(cap, sizeof(int32_t));
    uint8_t *mask = (uint8_t *)calloc(cap, 1);
    float *logits = (float *)malloc(cap * V * sizeof(float));

    expect(colibri_infer(&m, ids, NULL, B + 1, 1, 0, logits),
           COLIBRI_E_INPUT_TOO_LARGE, "batch above max_batch", &m);
    expect(colibri_infer(&m, ids, NULL, 1, S + 1, 0, logits),
           COLIBRI_E_INPUT_TOO_LARGE, "seq above max_seq_len", &m);
    expect(colibri_infer(&m, ids, NULL, 1, 4, 0, logits), COLIBRI_OK, "prefill 4", &m);
    expect(colibri_infer(&m, ids, NULL, 1, S - 3, 4, logits),
           COLIBRI_E_INPUT_TOO_LARGE, "n_past + seq above max_seq_len", &m);
    expect(colibri_infer(&m, ids, NULL, 1, 1, 5, logits), COLIBRI_E_KV_STATE,
           "n_past beyond the cached tokens", &m);
    expect(colibri_infer(&m, ids, NULL, 2, 1, 4, logits), COLIBRI_E_KV_STATE,
           "batch differs from the cached batch", &m);
    ids[1] = (int32_t)V;
    expect(colibri_infer(&m, ids, NULL, 1, 2, 4, logits), COLIBRI_E_TOKEN,
           "token id == vocab", &m);
    ids[1] = -1;
    expect(colibri_infer(&m, ids, NULL, 1, 2, 4, logits), COLIBRI_E_TOKEN,
           "token id -1", &m);
    ids[1] = 0;
    mask[0] = 2;
    expect(colibri_infer(&m, ids, mask, 1, 1, 4, logits), COLIBRI_E_ARG,
           "mask value 2", &m);
    expect(colibri_infer(&m, NULL, NULL, 1, 1, 4, logits), COLIBRI_E_ARG,
           "NULL input_ids", &m);
    expect(colibri_infer(&m, ids, NULL, 0, 1, 4, logits), COLIBRI_E_ARG,
           "batch 0", &m);
    /* Failed calls leave the cache alone: n_past 4 still continues. */
    expect(colibri_infer(&m, ids, NULL, 1, 1, 4, logits), COLIBRI_OK,
           "decode after the failed calls", &m);
    expect(colibri_infer(&m, ids, NULL, 1, 1, 2, logits), COLIBRI_OK,
           "rewind to n_past 2", &m);

    colibri_model shared;
    colibri_free(&m);
    expect(colibri_infer(&m, ids, NULL, 1, 1, 0, logits), COLIBRI_E_NOT_INIT,
           "infer after free", &m);
    expect(colibri_share(&shared, &m, arena, arena_need), COLIBRI_E_NOT_INIT,
           "share from a freed owner", &shared);
    colibri_info tmp;
    expect(colibri_get_info(&m, &tmp), COLIBRI_E_NOT_INIT, "info after free", NULL);
    colibri_free(&m); /* twice is harmless */

    /* ---- strerror: every code has its own sentence ---- */
    static const int codes[] = {
        COLIBRI_OK, COLIBRI_E_BAD_FORMAT, COLIBRI_E_NO_MEMORY, COLIBRI_E_CRC,
        COLIBRI_E_IO, COLIBRI_E_VERSION, COLIBRI_E_BYTE_ORDER, COLIBRI_E_ARG,
        COLIBRI_E_TOKEN, COLIBRI_E_ARENA_TOO_SMALL, COLIBRI_E_ALIGN,
        COLIBRI_E_KV_STATE, COLIBRI_E_UNSUPPORTED, COLIBRI_E_NOT_INIT,
        /* colibri_tokenizer.h's: colibri_strerror knows them too. */
        COLIBRI_E_TOK_NONE, COLIBRI_E_TOK_FORMAT, COLIBRI_E_TOK_BUFFER,
        COLIBRI_E_TOK_UTF8, COLIBRI_E_TOK_NO_BOS,
    };
    const char *unknown = colibri_strerror(12345);
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        printf("strerror %d %s\n", codes[i], colibri_strerror(codes[i]));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(colibri_strerror(codes[i]), colibri_strerror(codes[j]))) {
                printf("FAIL strerror %d equals strerror %d\n", codes[i], codes[j]);
                failures++;
            }
        if (!strcmp(colibri_strerror(codes[i]), unknown)) {
            printf("FAIL strerror %d is the unknown-code text\n", codes[i]);
            failures++;
        }
    }
    printf("strerror 12345 %s\n", unknown);

    /* ---- strerror_for: -1 gets the meaning of the call that returned it,
     * every other code the colibri_strerror text ---- */
    const char *at_init = colibri_strerror_for(-1, COLIBRI_CALL_INIT);
    const char *at_infer = colibri_strerror_for(-1, COLIBRI_CALL_INFER);
    printf("strerror_for -1 init %s\nstrerror_for -1 infer %s\n", at_init, at_infer);
    if (!strstr(at_init, ".colibri file") || strstr(at_init, "max_seq_len")) {
        printf("FAIL strerror_for(-1, INIT) is not only the init meaning\n");
        failures++;
    }
    if (!strstr(at_infer, "max_seq_len") || strstr(at_infer, ".colibri")) {
        printf("FAIL strerror_for(-1, INFER) is not only the infer meaning\n");
        failures++;
    }
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        if (codes[i] == -1)
            continue;
        const char *plain = colibri_strerror(codes[i]);
        if (strcmp(colibri_strerror_for(codes[i], COLIBRI_CALL_INIT), plain)
            || strcmp(colibri_strerror_for(codes[i], COLIBRI_CALL_INFER), plain)) {
            printf("FAIL strerror_for %d differs from strerror\n", codes[i]);
            failures++;
        }
    }
    free(ids);
    free(mask);
    free(logits);
    free(good.base);
    free(other.base);
    free(arena_base);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
