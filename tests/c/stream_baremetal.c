/*
 * stream_baremetal.c - a model whose experts stay in (simulated) external
 * flash on a bare-metal target (Cortex-M under qemu-system-arm): the file
 * is a const array standing for a QSPI device that the program reads only
 * through colibri_reader (memcpy, as a QSPI driver's read would), the arena
 * is a static buffer, the experts live in STREAM_SLOTS slots. The calls and
 * the all-resident host run's logits (ref kernels, the same bits) come from
 * stream_cases.h (tests/test_stream_baremetal.py writes it). Prints
 * "stream: ok ..." with the arena, the model's size and the counters and
 * exits 0, or names the first difference.
 */
#include <stdio.h>
#include <string.h>

#include "colibri.h"
#include "platform.h"

#include "stream_cases.h"

/* The streamed instance's arena: resident sections, plan, buffers, KV
 * cache and slots; the all-resident instance's (the file used in place). */
static unsigned char arena[ARENA_CAP] __attribute__((aligned(COLIBRI_ARENA_ALIGN)));
static unsigned char resident_arena[RESIDENT_CAP] __attribute__((aligned(COLIBRI_ARENA_ALIGN)));
static float logits[MAX_ROWS * VOCAB];
static float streamed[N_ROWS * VOCAB], resident[N_ROWS * VOCAB];
static unsigned reads;

static int flash_read(void *user, uint64_t offset, void *dst, size_t n)
{
    (void)user;
    if (offset > sizeof model_file || n > sizeof model_file - offset) return -1;
    memcpy(dst, model_file + offset, n);
    reads++;
    return 0;
}

static void say(const char *s)
{
    fw_write(s, strlen(s));
}

static void fail(const char *what, int rc)
{
    char line[128];
    snprintf(line, sizeof line, "FAIL %s: %d %s\n", what, rc, colibri_strerror(rc));
    say(line);
    fw_exit(1);
}

/* Every call of stream_cases.h; all logits rows into out[]. */
static void run_calls(colibri_model *m, float *out)
{
    size_t row = 0;
    for (unsigned c = 0; c < N_CALLS; c++) {
        int rc = colibri_infer(m, call_tokens + call_at[c], NULL, 1, call_len[c], call_past[c],
                               logits);
        if (rc) fail("colibri_infer", rc);
        memcpy(out + row, logits, (size_t)call_len[c] * VOCAB * sizeof *out);
        row += (size_t)call_len[c] * VOCAB;
    }
}

int main(void)
{
    /* The judge: the all-resident instance of the same file on this device. */
    static colibri_model r;
    int rc = colibri_init_from_memory(&r, model_file, sizeof model_file, resident_arena,
                                      sizeof resident_arena);
    if (rc) fail("colibri_init_from_memory", rc);
    run_calls(&r, resident);
    colibri_free(&r);

    colibri_reader rd = { flash_read, NULL, sizeof model_file };
    colibri_options opt = colibri_options_default();
    opt.expert_slots = STREAM_SLOTS;
    /* A static-workbuf build cannot size the arena beforehand (that needs
     * memory for the table): init takes the arena there is and says what
     * it lacks. */
    size_t need = 0;
    if (colibri_stream_arena_size(&rd, &opt, &need, NULL) != COLIBRI_E_UNSUPPORTED)
        fail("colibri_stream_arena_size in a static build", 0);
    static colibri_model m;
    rc = colibri_init_stream(&m, &rd, arena, sizeof arena, &opt);
    if (rc) {
        say(colibri_error_detail(&m));
        fail("colibri_init_stream", rc);
    }
    unsigned init_reads = reads;
    run_calls(&m, streamed);
    char line[400];
    for (size_t i = 0; i < (size_t)N_ROWS * VOCAB; i++) {
        uint32_t a, b;
        memcpy(&a, &streamed[i], 4);
        memcpy(&b, &resident[i], 4);
        if (a != b) {
            snprintf(line, sizeof line, "FAIL logit %u: streamed 0x%08lx, resident 0x%08lx\n",
                     (unsigned)i, (unsigned long)a, (unsigned long)b);
            say(line);
            fw_exit(1);
        }
    }
    /* Against the host's run (other compiler, other libm): a tolerance. */
    float worst = 0.0f, top = 0.0f;
    for (size_t i = 0; i < (size_t)N_ROWS * VOCAB; i++) {
        float d = streamed[i] - host_logits[i];
        if (d < 0) d = -d;
        if (d > worst) worst = d;
        float h = host_logits[i] < 0 ? -host_logits[i] : host_logits[i];
        if (h > top) top = h;
    }
    colibri_stream_stats st;
    rc = colibri_get_stream_stats(&m, &st, 0);
    if (rc) fail("colibri_get_stream_stats", rc);
    /* (no float formatting in newlib-nano's printf: parts per billion) */
    unsigned long ppb = top > 0 ? (unsigned long)(worst / top * 1e9f) : 0;
    snprintf(line, sizeof line, "stream: ok %lu logits bit-identical to all-resident; host "
             "within %lu ppb of the largest logit; model %lu bytes, arena %lu bytes, %lu slots of %lu bytes; "
             "%lu misses, %lu hits, %lu bytes read in infer; %u reads at init\n",
             (unsigned long)(N_ROWS * VOCAB), ppb,
             (unsigned long)sizeof model_file, (unsigned long)sizeof arena,
             (unsigned long)st.slots, (unsigned long)st.slot_bytes, (unsigned long)st.misses,
             (unsigned long)st.hits, (unsigned long)st.bytes_read, init_reads);
    say(line);
    colibri_free(&m);
    fw_exit(0);
}
