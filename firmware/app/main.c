/*
 * main.c - the Colibri firmware application, the same on every target.
 *
 * It runs the model embedded in the image (model_blob.h) on the fixed
 * prompts of the generated fw_config.h: a prefill of each prompt, then
 * greedy decoding of FW_N_GENERATE tokens one step at a time, and prints
 * every logit row, the greedy tokens and a checksum per prompt. Memory is
 * all static: the arena is sized by the build from the model header
 * (FW_ARENA_BYTES), checked here against the runtime's own
 * colibri_arena_size before use. No malloc, no stdio.
 *
 * Output (parsed by colibri/buildsteps/emulate.py, one record per line):
 *   colibri-fw target=T model_bytes=N arena_bytes=A arena_needed=R
 *   kernels NAME                   the kernel table init picked (colibri_info)
 *   threads N                      workers per infer (fw_threads(); only
 *                                  printed when N > 1)
 *   prompt P t0,t1,...
 *   row P I h0 h1 ... h(vocab-1)   logits of fed position I as float bits (hex)
 *   tokens P g0,g1,...             greedy tokens (lowest id wins ties)
 *   checksum P 0xXXXXXXXX          FNV-1a over the rows' float bits
 *   done
 * Exit status: 0 success, 1 a colibri call failed (the line before says
 * which, with colibri_strerror and the error detail), 2 the arena is too
 * small for this runtime (rebuild; both sizes are printed), 3 the embedded
 * model failed its boot-time check (model_check.h: CRCs and padding of every
 * byte, before the runtime reads any of it).
 */
#include <stdint.h>
#include <string.h>

#include "colibri.h"
#include "fw_config.h"
#include "model_blob.h"
#include "model_check.h"
#include "platform.h"

static uint8_t arena[FW_ARENA_BYTES] __attribute__((aligned(COLIBRI_ARENA_ALIGN)));
static float logits[FW_MAX_ROWS * FW_VOCAB]; /* [rows, vocab] of one call */
static colibri_model model;

/* --- minimal output, no stdio (keeps newlib's heap and buffers out) ------ */

static void put(const char *s) { fw_write(s, strlen(s)); }

static void put_u32(uint32_t v) {
    char buf[11];
    int i = 10;
    buf[i] = 0;
    do {
        buf[--i] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v);
    put(buf + i);
}

static void put_int(int v) {
    if (v < 0) {
        put("-");
        put_u32((uint32_t)(-(int64_t)v));
    } else {
        put_u32((uint32_t)v);
    }
}

static void hex32(char *out, uint32_t v) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 8; i++) out[i] = digits[(v >> (28 - 4 * i)) & 15u];
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u); /* the value's bits, independent of byte order */
    return u;
}

/* FNV-1a over the bits of each float, least significant byte first, so the
 * checksum is the same on little- and big-endian targets. */
static uint32_t fnv1a(uint32_t h, const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = float_bits(v[i]);
        for (int b = 0; b < 4; b++) {
            h ^= (u >> (8 * b)) & 0xFFu;
            h *= 16777619u;
        }
    }
    return h;
}

static void put_row(uint32_t prompt, uint32_t index, const float *row) {
    char line[9 * 64 + 1];
    put("row ");
    put_u32(prompt);
    put(" ");
    put_u32(index);
    uint32_t i = 0;
    while (i < FW_VOCAB) { /* chunks of 64 values keep the stack small */
        uint32_t n = 0;
        for (uint32_t k = 0; k < 64 && i < FW_VOCAB; k++, i++) {
            line[n++] = ' ';
            hex32(line + n, float_bits(row[i]));
            n += 8;
        }
        fw_write(line, n);
    }
    put("\n");
}

static int32_t argmax(const float *row) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < FW_VOCAB; i++)
        if (row[i] > row[best]) best = i; /* strict: the lowest id wins ties */
    return (int32_t)best;
}

/* call: which API call failed, so -1 reads as its one meaning (colibri.h). */
static int fail(const char *what, colibri_call call, int rc) {
    put("error: ");
    put(what);
    put(": ");
    put(colibri_strerror_for(rc, call));
    put(" (");
    put_int(rc);
    put("): ");
    put(colibri_error_detail(&model));
    put("\n");
    return 1;
}

static int run_prompt(uint32_t p) {
    const int32_t *prompt = fw_prompt_tokens + fw_prompt_start[p];
    uint32_t len = fw_prompt_len[p];
    uint32_t h = 2166136261u;
    int32_t generated[FW_N_GENERATE];

    put("prompt ");
    put_u32(p);
    put(" ");
    for (uint32_t i = 0; i < len; i++) {
        if (i) put(",");
        put_int(prompt[i]);
    }
    put("\n");

    int rc = colibri_infer(&model, prompt, NULL, 1, len, 0, logits);
    if (rc) return fail("colibri_infer (prefill)", COLIBRI_CALL_INFER, rc);
    for (uint32_t r = 0; r < len; r++) put_row(p, r, logits + (size_t)r * FW_VOCAB);
    h = fnv1a(h, logits, len * FW_VOCAB);
    generated[0] = argmax(logits + (size_t)(len - 1) * FW_VOCAB);

    for (uint32_t g = 1; g < FW_N_GENERATE; g++) {
        rc = colibri_infer(&model, &generated[g - 1], NULL, 1, 1, len + g - 1, logits);
        if (rc) return fail("colibri_infer (decode)", COLIBRI_CALL_INFER, rc);
        put_row(p, len + g - 1, logits);
        h = fnv1a(h, logits, FW_VOCAB);
        generated[g] = argmax(logits);
    }

    put("tokens ");
    put_u32(p);
    put(" ");
    for (uint32_t g = 0; g < FW_N_GENERATE; g++) {
        if (g) put(",");
        put_int(generated[g]);
    }
    put("\nchecksum ");
    put_u32(p);
    put(" 0x");
    char hx[9];
    hex32(hx, h);
    hx[8] = 0;
    put(hx);
    put("\n");
    return 0;
}

int main(void) {
    size_t need = 0;
    int rc = colibri_arena_size(colibri_model_blob, colibri_model_blob_size, &need);

    put("colibri-fw target=" FW_TARGET " model_bytes=");
    put_u32(colibri_model_blob_size);
    put(" arena_bytes=");
    put_u32((uint32_t)sizeof arena);
    put(" arena_needed=");
    put_u32((uint32_t)need);
    put("\n");
    /* Refuse a model corrupted in flash before anything parses it. */
    int bad = colibri_fw_model_check(colibri_model_blob, colibri_model_blob_size, NULL);
    if (bad) return bad;
    if (rc) return fail("colibri_arena_size", COLIBRI_CALL_INIT, rc);
    if (need > sizeof arena) {
        put("error: the runtime needs an arena of ");
        put_u32((uint32_t)need);
        put(" bytes, the build reserved ");
        put_u32((uint32_t)sizeof arena);
        put(" (FW_ARENA_BYTES): colibri/buildsteps/blob.py arena_bytes is short for this runtime\n");
        return 2;
    }
    rc = colibri_init_from_memory(&model, colibri_model_blob, colibri_model_blob_size,
                                  arena, sizeof arena);
    if (rc) return fail("colibri_init_from_memory", COLIBRI_CALL_INIT, rc);
    /* Which kernels run is chosen at init from the CPU (AVX2, SDOT): say
     * which, so a test can tell the runs on different CPUs apart. */
    colibri_info info;
    rc = colibri_get_info(&model, &info);
    if (rc) return fail("colibri_get_info", COLIBRI_CALL_INIT, rc);
    put("kernels ");
    put(info.kernels);
    put("\n");
    /* More workers when the platform asks: the logits keep their bits. */
    uint32_t threads = fw_threads();
    if (threads > 1) {
        rc = colibri_set_threads(&model, threads, 0);
        if (rc) return fail("colibri_set_threads", COLIBRI_CALL_INIT, rc);
        put("threads ");
        put_u32(threads);
        put("\n");
    }

    for (uint32_t p = 0; p < FW_N_PROMPTS; p++) {
        rc = run_prompt(p);
        if (rc) {
            colibri_free(&model);
            return rc;
        }
    }
    colibri_free(&model);
    put("done\n");
    return 0;
}
