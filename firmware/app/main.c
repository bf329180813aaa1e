/*
 * main.c - the Colibri firmware application, the same on every target.
 *
 * It runs the model embedded in the image (model_blob.h) on the prompts
 * of the generated fw_config.h: either fixed token-id prompts, or (text mode,
 * FW_TEXT_PROMPT) one text prompt that the device tokenises itself from the
 * tokenizer section of the embedded file (colibri_tokenize). Each prompt is
 * prefilled (in chunks of FW_MAX_ROWS tokens), then FW_N_GENERATE tokens are
 * chosen one step at a time by colibri_sample with the build's sampling
 * parameters (FW_SAMPLE_*: greedy when the temperature is 0; the draw of
 * generated token g is step g of the seed's counter-based sequence, the
 * history for the repetition penalty is the prompt plus what was generated,
 * as `colibri generate` and colibri-cli do). It prints every logit row, the
 * chosen tokens, in text mode the text as the streaming detokenizer releases
 * it, and a checksum per prompt. Memory is all static: the arena is sized by
 * the build from the model header and the KV cache type (FW_ARENA_BYTES,
 * FW_KV_DTYPE: scons kv=f32|i8), checked here against the runtime's own
 * colibri_arena_size_ex before use. No malloc, no stdio.
 *
 * An encoder-decoder model (colibri_decoder_start >= 0) encodes each prompt
 * (colibri_encode) and prefills the decoder with its start token: the rows
 * are then the decoder's, 1 + FW_N_GENERATE - 1 of them.
 *
 * Output (parsed by colibri/buildsteps/emulate.py, one record per line):
 *   colibri-fw target=T model_bytes=N arena_bytes=A arena_needed=R kv=f32|i8
 *   kernels NAME                   the kernel table init picked (colibri_info)
 *   threads N                      workers per infer (fw_threads(); only
 *                                  printed when N > 1)
 *   prompt P t0,t1,...             the prompt's ids (text mode: the device's)
 *   row P I h0 h1 ... h(vocab-1)   logits of fed position I as float bits (hex)
 *   text P ESCAPED                 text mode: bytes the detokenizer released
 *                                  after a token (\\, \n, \r, \t, \xNN escaped)
 *   tokens P g0,g1,...             the chosen tokens
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
#include "colibri_sample.h"
#include "colibri_tokenizer.h"
#include "fw_config.h"
#include "model_blob.h"
#include "model_check.h"
#include "platform.h"

static uint8_t arena[FW_ARENA_BYTES] __attribute__((aligned(COLIBRI_ARENA_ALIGN)));
static float logits[FW_MAX_ROWS * FW_VOCAB]; /* [rows, vocab] of one call */
static colibri_model model;
/* colibri_sample's scratch: 12 bytes per id (colibri_sample_scratch_size). */
static uint64_t sample_scratch[(FW_VOCAB * 12u + 7u) / 8u];
#if FW_TEXT_PROMPT
static colibri_tokenizer tokenizer;
static int32_t text_ids[FW_PROMPT_ID_CAP + FW_N_GENERATE]; /* prompt, then generated */
#endif

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

#if FW_TEXT_PROMPT
/* Text bytes as one printable record: \\ \n \r \t and \xNN for other
 * bytes below 0x20 or 0x7f; everything else (UTF-8 included) as is. */
static void put_escaped(const char *s, size_t n) {
    char buf[64 + 4];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (k > 64) {
            fw_write(buf, k);
            k = 0;
        }
        if (c == '\\') { buf[k++] = '\\'; buf[k++] = '\\'; }
        else if (c == '\n') { buf[k++] = '\\'; buf[k++] = 'n'; }
        else if (c == '\r') { buf[k++] = '\\'; buf[k++] = 'r'; }
        else if (c == '\t') { buf[k++] = '\\'; buf[k++] = 't'; }
        else if (c < 0x20 || c == 0x7f) {
            static const char digits[] = "0123456789abcdef";
            buf[k++] = '\\'; buf[k++] = 'x';
            buf[k++] = digits[c >> 4]; buf[k++] = digits[c & 15u];
        } else {
            buf[k++] = (char)c;
        }
    }
    fw_write(buf, k);
}

static void put_text(uint32_t prompt, const char *s, size_t n) {
    if (!n) return;
    put("text ");
    put_u32(prompt);
    put(" ");
    put_escaped(s, n);
    put("\n");
}
#endif

static colibri_sample_params sample_params(void) {
    colibri_sample_params sp = colibri_sample_defaults();
    sp.temperature = FW_SAMPLE_TEMPERATURE;
    sp.top_k = FW_SAMPLE_TOP_K;
    sp.top_p = FW_SAMPLE_TOP_P;
    sp.min_p = FW_SAMPLE_MIN_P;
    sp.repetition_penalty = FW_SAMPLE_REPETITION_PENALTY;
    sp.seed = FW_SAMPLE_SEED;
    return sp;
}

static uint32_t max_seq_len; /* from colibri_get_info */
#if FW_TEXT_PROMPT
static uint32_t model_max_seq_len(void) { return max_seq_len; }
#endif

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

#if FW_TEXT_PROMPT
/* A tokenizer call failed: colibri_tok_strerror knows its codes (-30..-34). */
static int fail_tok(const char *what, int rc) {
    put("error: ");
    put(what);
    put(": ");
    put(colibri_tok_strerror(rc));
    put(" (");
    put_int(rc);
    put(")\n");
    return 1;
}
#endif

/* Prefill ids[0..len) in chunks of FW_MAX_ROWS rows, printing every row;
 * leaves the last row's logits in `last` ([FW_VOCAB]). */
static int prefill(uint32_t p, const int32_t *ids, uint32_t len, uint32_t *h, float *last) {
    for (uint32_t off = 0; off < len; off += FW_MAX_ROWS) {
        uint32_t rows = len - off < FW_MAX_ROWS ? len - off : FW_MAX_ROWS;
        int rc = colibri_infer(&model, ids + off, NULL, 1, rows, off, logits);
        if (rc) return fail("colibri_infer (prefill)", COLIBRI_CALL_INFER, rc);
        for (uint32_t r = 0; r < rows; r++) put_row(p, off + r, logits + (size_t)r * FW_VOCAB);
        *h = fnv1a(*h, logits, rows * FW_VOCAB);
        if (off + rows == len) memcpy(last, logits + (size_t)(rows - 1) * FW_VOCAB,
                                      FW_VOCAB * sizeof(float));
    }
    return 0;
}

/* Prompt ids[0..len) with room for FW_N_GENERATE more after it (the history
 * colibri_sample reads). n_text: ids >= n_text have no text (a vocabulary
 * padded past the tokenizer's) and are never chosen. */
static int run_prompt(uint32_t p, int32_t *ids, uint32_t len, uint32_t n_text,
                      colibri_detok *detok) {
    static float row[FW_VOCAB];
    const colibri_sample_params sp = sample_params();
    uint32_t h = 2166136261u;
    int32_t *generated = ids + len;

    put("prompt ");
    put_u32(p);
    put(" ");
    for (uint32_t i = 0; i < len; i++) {
        if (i) put(",");
        put_int(ids[i]);
    }
    put("\n");

    /* An encoder-decoder encodes the prompt; its decoder starts from the
     * start token, so the rows and positions are the decoder's. */
    int32_t start = colibri_decoder_start(&model);
    const int32_t *dec = ids;
    uint32_t dec_len = len;
    int rc;
    if (start >= 0) {
        rc = colibri_encode(&model, ids, NULL, 1, len);
        if (rc) return fail("colibri_encode", COLIBRI_CALL_INFER, rc);
        dec = &start;
        dec_len = 1;
    }
    rc = prefill(p, dec, dec_len, &h, row);
    if (rc) return rc;
    for (uint32_t g = 0; g < FW_N_GENERATE; g++) {
        if (g) {
            rc = colibri_infer(&model, &generated[g - 1], NULL, 1, 1, dec_len + g - 1, row);
            if (rc) return fail("colibri_infer (decode)", COLIBRI_CALL_INFER, rc);
            put_row(p, dec_len + g - 1, row);
            h = fnv1a(h, row, FW_VOCAB);
        }
        for (uint32_t i = n_text; i < FW_VOCAB; i++) row[i] = -__builtin_inff();
        rc = colibri_sample(row, FW_VOCAB, &sp, ids, len + g, g, sample_scratch,
                            sizeof sample_scratch, &generated[g]);
        if (rc) return fail("colibri_sample", COLIBRI_CALL_INFER, rc);
#if FW_TEXT_PROMPT
        char text[COLIBRI_DETOK_HOLD + 256];
        size_t k = 0;
        rc = colibri_detok_push(detok, generated[g], text, sizeof text, &k);
        if (rc) return fail_tok("colibri_detok_push", rc);
        put_text(p, text, k);
#else
        (void)detok;
#endif
    }
#if FW_TEXT_PROMPT
    {
        char text[COLIBRI_DETOK_HOLD + 8];
        size_t k = 0;
        rc = colibri_detok_finish(detok, text, sizeof text, &k);
        if (rc) return fail_tok("colibri_detok_finish", rc);
        put_text(p, text, k);
    }
#endif

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

#if FW_TEXT_PROMPT
/* Text mode: tokenise the prompt on the device, then run it. */
static int run_text(void) {
    int rc = colibri_tokenizer_init(&tokenizer, &model);
    if (rc) return fail_tok("colibri_tokenizer_init", rc);
    colibri_tokenizer_info ti;
    rc = colibri_tokenizer_get_info(&tokenizer, &ti);
    if (rc) return fail_tok("colibri_tokenizer_get_info", rc);
    size_t n = 0;
    rc = colibri_tokenize(&tokenizer, fw_prompt_text, FW_PROMPT_TEXT_BYTES, text_ids,
                          FW_PROMPT_ID_CAP, &n, FW_TOK_FLAGS);
    if (rc) return fail_tok("colibri_tokenize", rc);
    if (n == 0 || n + FW_N_GENERATE - 1 > model_max_seq_len()) {
        put("error: the prompt is ");
        put_u32((uint32_t)n);
        put(" tokens; with the tokens to generate it must fit the model's context\n");
        return 1;
    }
    colibri_detok detok;
    colibri_detok_init(&detok, &tokenizer, COLIBRI_DETOK_SKIP_SPECIAL);
    uint32_t n_text = ti.n_vocab < FW_VOCAB ? ti.n_vocab : FW_VOCAB;
    return run_prompt(0, text_ids, (uint32_t)n, n_text, &detok);
}
#else
static int run_ids(void) {
    static int32_t ids[FW_MAX_PROMPT + FW_N_GENERATE];
    for (uint32_t p = 0; p < FW_N_PROMPTS; p++) {
        memcpy(ids, fw_prompt_tokens + fw_prompt_start[p], fw_prompt_len[p] * sizeof(int32_t));
        int rc = run_prompt(p, ids, fw_prompt_len[p], FW_VOCAB, NULL);
        if (rc) return rc;
    }
    return 0;
}
#endif

int main(void) {
    colibri_options opt = colibri_options_default();
    opt.kv_dtype = FW_KV_DTYPE;
    size_t need = 0;
    int rc = colibri_arena_size_ex(colibri_model_blob, colibri_model_blob_size, &opt, &need);

    put("colibri-fw target=" FW_TARGET " model_bytes=");
    put_u32(colibri_model_blob_size);
    put(" arena_bytes=");
    put_u32((uint32_t)sizeof arena);
    put(" arena_needed=");
    put_u32((uint32_t)need);
    put(" kv=" FW_KV_NAME "\n");
    /* Refuse a model corrupted in flash before anything parses it. */
    int bad = colibri_fw_model_check(colibri_model_blob, colibri_model_blob_size, NULL);
    if (bad) return bad;
    if (rc) {
        /* colibri_arena_size has no model to keep a detail in; init refuses
         * the same blob with the same reason and writes it (e.g. an ENC_DEC
         * model on an encdec=0 build: "... (built with encdec=0)"). */
        (void)colibri_init_from_memory_ex(&model, colibri_model_blob,
                                          colibri_model_blob_size, arena, sizeof arena, &opt);
        return fail("colibri_arena_size_ex", COLIBRI_CALL_INIT, rc);
    }
    if (need > sizeof arena) {
        put("error: the runtime needs an arena of ");
        put_u32((uint32_t)need);
        put(" bytes, the build reserved ");
        put_u32((uint32_t)sizeof arena);
        put(" (FW_ARENA_BYTES): colibri/buildsteps/blob.py arena_bytes is short for this runtime\n");
        return 2;
    }
    rc = colibri_init_from_memory_ex(&model, colibri_model_blob, colibri_model_blob_size,
                                     arena, sizeof arena, &opt);
    if (rc) return fail("colibri_init_from_memory_ex", COLIBRI_CALL_INIT, rc);
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

    max_seq_len = info.shape.max_seq_len;
#if FW_TEXT_PROMPT
    rc = run_text();
#else
    rc = run_ids();
#endif
    if (rc) {
        colibri_free(&model);
        return rc;
    }
    colibri_free(&model);
    put("done\n");
    return 0;
}
