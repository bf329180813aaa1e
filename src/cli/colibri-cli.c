/*
 * colibri-cli - inspect, verify and run a .colibri model with the C runtime.
 *
 *   colibri-cli --model F --info
 *   colibri-cli --model F --verify
 *   colibri-cli --model F --dump-router-lut
 *   colibri-cli --model F --tokens 1,2,3 [--generate N] [--logits-out OUT]
 *   colibri-cli --model F --encoder-tokens 1,2,3 --tokens 0 [--generate N] ...
 *   colibri-cli --model F --bench N [--tokens 1,2,3]
 *
 * Errors: one line "colibri-cli: FILE: <error> (<detail>): <what to do>" on
 * stderr and exit status 1 (2 for usage errors). --verify lists what fails
 * on stdout ("FAIL ...") and ends with that one line; its exit status is 0
 * intact, 1 damaged (the file was read but is not a valid .colibri file:
 * CRC mismatch, truncated, malformed), 2 cannot check (the file cannot be
 * read, its format version is newer than this runtime, or a usage error).
 * stdout is flushed before an error is written, so with both streams on
 * one pipe (2>&1) the error line still comes after what it refers to.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_sample.h"
#include "colibri_tokenizer.h"

static const char *usage_text =
    "usage: colibri-cli --model FILE ACTION [options]\n"
    "\n"
    "actions (exactly one):\n"
    "  --info              print the model's shape, dtypes, arena size, kernels\n"
    "  --verify            check every CRC; names each failing section\n"
    "                      (exit status 0 intact, 1 damaged, 2 cannot read)\n"
    "  --dump-router-lut   print every router weight as the runtime uses it\n"
    "                      (int16 rows dequantised: q * scale), one number per\n"
    "                      line, in the order layer, expert, hidden column\n"
    "                      (layer 0 expert 0 column 0, column 1, ...)\n"
    "  --tokens 1,2,3      run the prompt; print each position's greedy token\n"
    "  --tokenize TEXT     print the ids of TEXT (the file's tokenizer)\n"
    "  --prompt TEXT       tokenize TEXT (bos as the tokenizer's template), then\n"
    "                      generate --generate N tokens (default 32), printing\n"
    "                      the text as it comes; ids and tokens/s on stderr. An\n"
    "                      encoder-decoder encodes TEXT (eos as the template)\n"
    "                      and prints the decoder's text\n"
    "  --bench N           time N single-token decode steps after a prompt\n"
    "                      (--tokens, default 1,2,3,4); prints mean, p50, p99\n"
    "                      and standard deviation in microseconds\n"
    "\n"
    "options:\n"
    "  --encoder-tokens 1,2,3  an encoder-decoder's input: colibri_encode runs it,\n"
    "                      then --tokens are the decoder's (from its start token)\n"
    "  --generate N        with --tokens: greedily generate N tokens (prefill and\n"
    "                      decode tokens/s on stderr)\n"
    "  --kv f32|i8         the KV cache: float32 (default) or 8-bit with a scale\n"
    "                      per head vector (about a quarter of the bytes)\n"
    "  --ram SIZE          a memory budget (bytes, or with K, M, G: 512M, 2G):\n"
    "                      the routed experts stay in the file and are read\n"
    "                      into as many expert slots as the budget holds;\n"
    "                      a budget that holds the whole model loads it all\n"
    "  --slots N           N expert slots (instead of --ram's count)\n"
    "  --policy reuse|freq|lru  which expert a full slot cache gives up: the\n"
    "                      least expected reuse before its layer runs again\n"
    "                      (default), the least often chosen, or the least\n"
    "                      recently used (the logits are the same bits)\n"
    "  --prefetch N        with --ram or --slots: read up to N of a layer's\n"
    "                      experts predicted before its attention, while it\n"
    "                      runs (default 8, at most top_k; 0: none)\n"
    "  --route-trace OUT   with --tokens or --prompt: write the routing of every\n"
    "                      MoE layer pass to OUT (a text line each: layer, then\n"
    "                      expert:tokens; `colibri plan FILE --trace OUT`\n"
    "                      replays it under each slot policy)\n"
    "  --threads N         compute each infer on N threads (colibri_set_threads;\n"
    "                      the logits are the same bits for every N)\n"
    "  --spin              with --threads: workers spin, never park (no system\n"
    "                      call inside colibri_infer; keeps the cores busy)\n"
    "  --logits-out OUT    with --tokens: write little-endian float32 logits,\n"
    "                      one row of vocab values per prompt position, then\n"
    "                      one row per generated token fed back (N - 1 rows:\n"
    "                      the last generated token is not fed back); the\n"
    "                      same format as `colibri run --logits-out`\n"
    "  --temperature T, --top-k K, --top-p P, --min-p M, --repetition-penalty R,\n"
    "  --seed S            with --prompt: sampling (colibri_sample.h); greedy\n"
    "                      unless T > 0\n"
    "  --help              this text\n";

static const char *model_path; /* NULL until --model */

/* --route-trace: the routing of every MoE layer pass (colibri_route_fn),
 * one line each: "layer e:count e:count ...", experts with tokens only, in
 * expert order; a first line "# colibri route trace ..." says the shape.
 * A failed write is remembered and reported after the run. */
typedef struct { FILE *f; int failed; } route_trace;

static void write_route(void *user, uint32_t layer, const uint32_t *counts,
                        uint32_t n_experts)
{
    route_trace *t = (route_trace *)user;
    if (fprintf(t->f, "%u", (unsigned)layer) < 0)
        t->failed = 1;
    for (uint32_t e = 0; e < n_experts; e++)
        if (counts[e] && fprintf(t->f, " %u:%u", (unsigned)e, (unsigned)counts[e]) < 0)
            t->failed = 1;
    if (fputc('\n', t->f) == EOF)
        t->failed = 1;
}
static colibri_options options; /* --kv, --ram, --slots, --policy, --prefetch */

/* 1 if the model file starts with GGUF's magic (llama.cpp's format). */
static int is_gguf(void)
{
    char magic[4] = { 0 };
    FILE *f = model_path ? fopen(model_path, "rb") : NULL;
    if (!f)
        return 0;
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    return got == 4 && !memcmp(magic, "GGUF", 4);
}

/* What the user can do about an error code returned by `call` (-1 means a
 * bad file from init, too much input from infer: colibri.h). */
static const char *advice(int rc, colibri_call call)
{
    switch (rc) {
    case COLIBRI_E_BAD_FORMAT: /* == COLIBRI_E_INPUT_TOO_LARGE */
        if (call == COLIBRI_CALL_INFER)
            return "shorten the input, or re-convert with a larger "
                   "--max-seq-len/--max-batch";
        /* copying a GGUF file again would not help (the library's words) */
        return is_gguf() ? "convert it with `colibri convert FILE.gguf -o FILE.colibri`"
                         : "copy it again, or re-create it with `colibri convert`";
    case COLIBRI_E_ARG:
        /* streaming options the file cannot take (too many slots, an
         * encoder-decoder): the detail says which */
        return options.ram_bytes || options.expert_slots
                   ? "change --ram/--slots, or leave them out to load every weight"
                   : "see colibri-cli --help";
    /* The code's text already says the file is corrupted: say it once. */
    case COLIBRI_E_CRC: return "copy or convert the file again";
    case COLIBRI_E_VERSION: return "upgrade colibri";
    case COLIBRI_E_IO: return "check the path and permissions";
    case COLIBRI_E_NO_MEMORY:
        return options.ram_bytes ? "raise --ram to at least the size above"
                                 : "free memory, use a smaller model, or stream its "
                                   "experts with --ram";
    case COLIBRI_E_BYTE_ORDER:
        return "convert with `colibri convert --byte-order` for this host";
    case COLIBRI_E_TOKEN: return "use token ids below the model's vocab";
    default: return "see colibri-cli --help";
    }
}

/* The one error line; `call` says which library call returned rc, which
 * picks the text of -1. stdout first: on a shared pipe (2>&1) the error
 * then follows the lines it refers to (--verify's FAIL lines). Advice the
 * detail already gives is not said twice. */
static int fail(int rc, colibri_call call, const colibri_model *m, const char *what)
{
    const char *detail = what ? what : (m ? colibri_error_detail(m) : "");
    const char *fix = advice(rc, call);
    if (strstr(detail, fix))
        fix = "";
    fflush(stdout);
    fprintf(stderr, "colibri-cli: %s: %s%s%s%s%s%s\n", model_path,
            colibri_strerror_for(rc, call), *detail ? " (" : "", detail,
            *detail ? ")" : "", *fix ? ": " : "", fix);
    return 1;
}

static int usage_error(const char *msg)
{
    fflush(stdout);
    if (model_path)
        fprintf(stderr, "colibri-cli: %s: %s: see colibri-cli --help\n", model_path, msg);
    else
        fprintf(stderr, "colibri-cli: %s: see colibri-cli --help\n", msg);
    return 2;
}

/* Read the whole file into a 64-byte aligned buffer (*base to free). On
 * COLIBRI_E_IO, errno says why (0 when the size was the problem). */
static int read_file(const char *path, void **base, uint8_t **data, size_t *size)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return COLIBRI_E_IO;
    if (!S_ISREG(st.st_mode)) {
        /* A directory would open, then size as nonsense. */
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return COLIBRI_E_IO;
    }
    errno = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return COLIBRI_E_IO;
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return COLIBRI_E_IO;
    }
    *base = malloc((size_t)end + 64);
    if (!*base) {
        fclose(f);
        return COLIBRI_E_NO_MEMORY;
    }
    *data = (uint8_t *)(((uintptr_t)*base + 63) & ~(uintptr_t)63);
    errno = 0;
    *size = fread(*data, 1, (size_t)end, f);
    fclose(f);
    return *size == (size_t)end ? COLIBRI_OK : COLIBRI_E_IO;
}

/* Load the model: colibri_init, or (static work-buffer builds, where the
 * library cannot allocate) the file read here plus an arena of the size the
 * header asks for. */
static void *file_base, *arena_base;

static int load(colibri_model *m)
{
    if (!(colibri_build_flags() & COLIBRI_BUILD_STATIC_WORKBUF))
        return colibri_init_ex(m, model_path, &options);
    uint8_t *data;
    size_t size, need;
    memset(m, 0, sizeof *m);
    int rc = read_file(model_path, &file_base, &data, &size);
    if (rc == COLIBRI_OK)
        rc = colibri_arena_size_ex(data, size, &options, &need);
    if (rc == COLIBRI_OK) {
        arena_base = malloc(need + 64);
        if (!arena_base)
            return COLIBRI_E_NO_MEMORY;
        void *arena = (void *)(((uintptr_t)arena_base + 63) & ~(uintptr_t)63);
        rc = colibri_init_from_memory_ex(m, data, size, arena, need, &options);
    }
    return rc;
}

static void unload(colibri_model *m)
{
    colibri_free(m);
    free(file_base);
    free(arena_base);
    file_base = arena_base = NULL;
}

static const char *dtype_name(unsigned d)
{
    return d == COLIBRI_DTYPE_F32 ? "f32" : d == COLIBRI_DTYPE_I8_GROUP ? "i8_group"
         : d == COLIBRI_DTYPE_I16_ROW ? "i16_row" : d == COLIBRI_DTYPE_Q4_0 ? "q4_0"
         : d == COLIBRI_DTYPE_Q4_K ? "q4_k" : d == COLIBRI_DTYPE_Q6_K ? "q6_k"
         : d == COLIBRI_DTYPE_Q5_0 ? "q5_0" : d == COLIBRI_DTYPE_Q5_K ? "q5_k"
         : d == COLIBRI_DTYPE_Q8_0 ? "q8_0" : "?";
}

/* The storage types of a part (bits 1 << COLIBRI_DTYPE_*) as "q4_k+q6_k". */
static const char *dtype_list(uint32_t bits, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (unsigned d = 0; d <= COLIBRI_DTYPE_MAX && at < cap; d++)
        if (bits & (1u << d))
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? "+" : "",
                                   dtype_name(d));
    return at ? buf : "-";
}

/* The arena colibri_init_ex would allocate for this file with cache type
 * kv, from this instance's (`in`): the library's arena for a caller
 * (colibri_arena_size_ex, its small chunk) with each type differs by
 * exactly what the type changes, which is not only the KV cache (an
 * encoder-decoder keeps its cross-attention cache in the same type) and
 * does not depend on the chunk. The file is mapped, not read: the library
 * reads its header and description alone. 0, or -1 if it cannot say. */
static int arena_for_kv(const colibri_info *in, unsigned kv, uint64_t *arena)
{
    int fd = open(model_path, O_RDONLY);
    if (fd < 0)
        return -1;
    size_t size = (size_t)in->file_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return -1;
    colibri_options o = options;
    o.expert_slots = 0;
    o.ram_bytes = 0;
    size_t now = 0, other = 0;
    o.kv_dtype = in->kv_dtype;
    int rc = colibri_arena_size_ex(map, size, &o, &now);
    o.kv_dtype = kv;
    if (rc == 0)
        rc = colibri_arena_size_ex(map, size, &o, &other);
    munmap(map, size);
    if (rc)
        return -1;
    *arena = in->arena_bytes - now + other;
    return 0;
}

/* What a run holds resident: the file's sections by part, the arena with
 * its KV cache, for this instance's cache type and the other one. */
static int print_memory(colibri_model *m, const colibri_info *in)
{
    static const char *const parts[COLIBRI_PART_COUNT] = {
        "embedding", "attention", "router", "routed_experts", "shared_dense_ffn",
        "norms", "lm_head", "other_sections" };
    colibri_weight_bytes wb;
    int rc = colibri_get_weight_bytes(m, &wb);
    if (rc)
        return fail(rc, COLIBRI_CALL_INIT, m, NULL);
    uint64_t sum = 0;
    char buf[64];
    for (unsigned i = 0; i < COLIBRI_PART_COUNT; i++) {
        printf("weights_%s: %llu bytes (%u tensors, %s)\n", parts[i],
               (unsigned long long)wb.bytes[i], (unsigned)wb.tensors[i],
               i == COLIBRI_PART_OTHER ? "desc, tokenizer"
                                       : dtype_list(wb.dtypes[i], buf, sizeof buf));
        sum += wb.bytes[i];
    }
    printf("file_header_table_padding: %llu bytes\n",
           (unsigned long long)(in->file_size - sum));
    uint64_t tok[2], all[2];
    colibri_kv_size(&in->shape, COLIBRI_KV_F32, &tok[0], &all[0]);
    colibri_kv_size(&in->shape, COLIBRI_KV_I8, &tok[1], &all[1]);
    for (unsigned k = 0; k < 2; k++)
        printf("kv_%s: %llu bytes per token, %llu at max_seq_len %u x max_batch %u%s\n",
               k ? "i8" : "f32", (unsigned long long)tok[k], (unsigned long long)all[k],
               (unsigned)in->shape.max_seq_len, (unsigned)in->shape.max_batch,
               k == in->kv_dtype ? " (this run)" : "");
    uint64_t rest = in->arena_bytes - in->kv_bytes;
    printf("kv_cache: %s\n", in->kv_dtype == COLIBRI_KV_I8 ? "i8" : "f32");
    printf("arena_without_kv: %llu bytes\n", (unsigned long long)rest);
    colibri_stream_stats st;
    if (!strcmp(in->load_mode, "stream") && colibri_get_stream_stats(m, &st, 0) == 0) {
        /* the arena holds slots and KV cache, and the resident sections
         * unless they are used from the mapped file */
        if (st.resident_mapped)
            printf("resident_total: %llu bytes (resident weights mapped from the "
                   "file %llu + the arena's expert slots and kv cache %llu)\n",
                   (unsigned long long)(st.resident_bytes + in->arena_bytes),
                   (unsigned long long)st.resident_bytes,
                   (unsigned long long)in->arena_bytes);
        else
            printf("resident_total: %llu bytes (the arena: resident weights, expert "
                   "slots, kv cache)\n", (unsigned long long)in->arena_bytes);
        return 0;
    }
    for (unsigned k = 0; k < 2; k++) {
        uint64_t arena = in->arena_bytes;
        if (k != in->kv_dtype && arena_for_kv(in, k, &arena))
            continue; /* the file cannot be mapped again: this run's alone */
        printf("resident_total_kv_%s: %llu bytes (file %llu + arena %llu)%s\n",
               k ? "i8" : "f32", (unsigned long long)(in->file_size + arena),
               (unsigned long long)in->file_size, (unsigned long long)arena,
               k == in->kv_dtype ? " (this run)" : "");
    }
    return 0;
}

/* A group's dtypes for --info: the named tensor's dtype (WQ's, W1's) first,
 * then any other the group uses (`mask`: bits 1 << COLIBRI_DTYPE_*), comma
 * separated: "q4_k,q6_k" for --quant q4's attention (WV in Q6_K). */
static const char *dtype_group(char *buf, size_t cap, unsigned first, unsigned mask)
{
    int n = snprintf(buf, cap, "%s", dtype_name(first));
    for (unsigned d = 0; d < 16; d++)
        if ((mask >> d & 1u) && d != first && n > 0 && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, ",%s", dtype_name(d));
    return buf;
}

/* "512M" -> 536870912: bytes with an optional K, M or G (powers of 1024);
 * colibri.runtime.parse_size takes the same strings. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* a decimal number only, as Model(ram=) takes it: no hex, inf or nan */
    if (strspn(s, "+.0123456789eE") < (size_t)(end - s))
        return -1;
    double unit = 1.0;
    if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') unit = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') unit = 1073741824.0, end++;
    /* 512MiB, 512MB, 4096B: powers of 1024 either way, as Model(ram=) takes them */
    if (unit > 1.0 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    /* at least one byte: a budget of 0 would mean none at all */
    if (end == s || *end || errno || !(v * unit >= 1.0) || v * unit > 1.8e19)
        return -1;
    *out = (uint64_t)(v * unit);
    return 0;
}

/* A streamed instance's slots and what they did (nothing for an
 * all-resident one): --info's lines, or one line after a run. */
static void print_stream(colibri_model *m, FILE *to, int info)
{
    colibri_stream_stats st;
    if (colibri_get_stream_stats(m, &st, 0) || st.slots == 0) {
        if (info)
            fprintf(to, "expert_slots: 0 (every weight resident)\n");
        return;
    }
    if (info) {
        fprintf(to, "expert_slots: %u of %llu bytes (policy %s)\n", (unsigned)st.slots,
                (unsigned long long)st.slot_bytes,
                st.policy == COLIBRI_SLOTS_LRU    ? "lru"
                : st.policy == COLIBRI_SLOTS_FREQ ? "freq"
                                                  : "reuse");
        fprintf(to, "resident_weights: %llu bytes (every section but the routed "
                "experts%s)\n", (unsigned long long)st.resident_bytes,
                st.resident_mapped ? "; mapped from the file, in the page cache" : "");
        fprintf(to, "prefetch: %u experts a layer%s\n", (unsigned)st.prefetch,
                st.prefetch ? "" : " (none)");
        return;
    }
    uint64_t uses = st.hits + st.misses;
    fprintf(to, "experts: %u slots, %llu uses, %llu hits (%.1f%%), %llu read "
            "(%.1f MB, %.1f ms in reads, %.1f ms waited)", (unsigned)st.slots,
            (unsigned long long)uses, (unsigned long long)st.hits,
            uses ? 100.0 * (double)st.hits / (double)uses : 0.0,
            (unsigned long long)(st.misses + st.prefetched - st.prefetch_cancelled),
            (double)st.bytes_read / 1e6, (double)st.read_ns / 1e6, (double)st.wait_ns / 1e6);
    if (st.mapped) /* no bytes read for them: used where the page cache has them */
        fprintf(to, ", %llu of them mapped from the page cache", (unsigned long long)st.mapped);
    if (st.prefetch)
        fprintf(to, ", prefetch %u a layer: %llu read, %llu hit, %llu cancelled",
                (unsigned)st.prefetch, (unsigned long long)st.prefetched,
                (unsigned long long)st.prefetch_hits,
                (unsigned long long)st.prefetch_cancelled);
    fputc('\n', to);
}

static int do_info(colibri_model *m)
{
    colibri_info in;
    int rc = colibri_get_info(m, &in);
    if (rc)
        return fail(rc, COLIBRI_CALL_INIT, m, NULL);
    const colibri_shape *s = &in.shape;
    printf("format_version: %u\n", (unsigned)in.format_version);
    printf("byte_order: %s%s\n", in.file_big_endian ? "big" : "little",
           in.byte_swapped ? " (swapped in memory)" : "");
    printf("file_size: %llu\n", (unsigned long long)in.file_size);
    printf("vocab: %u\nhidden: %u\nintermediate: %u\nmax_seq_len: %u\n",
           s->vocab, s->hidden, s->intermediate, s->max_seq_len);
    printf("n_layers: %u\nn_heads: %u\nn_kv_heads: %u\nhead_dim: %u\n",
           s->n_layers, s->n_heads, s->n_kv_heads, s->head_dim);
    printf("n_experts: %u\ntop_k: %u\nmax_batch: %u\ngroup_size: %u\n",
           s->n_experts, s->top_k, s->max_batch, s->group_size);
    printf("rope_theta: %.9g\nrms_eps: %.9g\nn_tensors: %u\n",
           (double)s->rope_theta, (double)s->rms_eps, s->n_tensors);
    printf("unknown_sections: %u\nparameters: %llu\n", in.n_unknown_sections,
           (unsigned long long)in.n_params);
    char attn[64], experts[64];
    printf("dtype_embed: %s\ndtype_attention: %s\ndtype_router: %s\n"
           "dtype_experts: %s\ndtype_lm_head: %s\n", dtype_name(in.dtype_embed),
           dtype_group(attn, sizeof attn, in.dtype_attn, in.dtypes_attn),
           dtype_name(in.dtype_router),
           dtype_group(experts, sizeof experts, in.dtype_expert, in.dtypes_expert),
           dtype_name(in.dtype_lm_head));
    printf("arena_bytes: %llu\nchunk_tokens: %u\nkernels: %s\nload: %s\n"
           "huge_pages: %s\n", (unsigned long long)in.arena_bytes, in.chunk_tokens,
           in.kernels, in.load_mode, in.huge_pages_advised ? "advised" : "no");
    printf("threads: %u%s\n", (unsigned)in.n_threads,
           in.thread_flags & COLIBRI_THREADS_SPIN ? " (spin)" : "");
    print_stream(m, stdout, 1);
    return print_memory(m, &in);
}

static void on_bad(void *user, int index, const char *what)
{
    (void)user;
    if (index == -3)
        printf("FAIL structure: %s\n", what);
    else if (index == -2)
        printf("FAIL header: %s\n", what);
    else if (index == -1)
        printf("FAIL tensor table: %s\n", what);
    else
        printf("FAIL section %d: %s\n", index, what);
}

/* Exit status 0 intact, 1 damaged, 2 cannot check (see the top comment). */
static int do_verify(void)
{
    void *base = NULL;
    uint8_t *data;
    size_t size;
    int rc = read_file(model_path, &base, &data, &size);
    if (rc) {
        const char *why = errno ? strerror(errno) : "cannot read the file";
        free(base);
        fail(rc, COLIBRI_CALL_INIT, NULL, why);
        return 2;
    }
    uint32_t nbad = 0;
    rc = colibri_verify(data, size, on_bad, NULL, &nbad);
    free(base);
    if (rc) {
        char what[64];
        if (rc == COLIBRI_E_CRC)
            snprintf(what, sizeof what, "%u part%s listed above", (unsigned)nbad,
                     nbad == 1 ? "" : "s");
        else
            snprintf(what, sizeof what, "listed above");
        fail(rc, COLIBRI_CALL_INIT, NULL, what);
        /* A newer format, or no memory to check it, is not damage. */
        return rc == COLIBRI_E_BAD_FORMAT || rc == COLIBRI_E_CRC ? 1 : 2;
    }
    printf("OK: header, table and every section CRC verified\n");
    return 0;
}

static int do_dump_router(colibri_model *m)
{
    colibri_info in;
    int rc = colibri_get_info(m, &in);
    if (rc)
        return fail(rc, COLIBRI_CALL_INIT, m, NULL);
    size_t n = (size_t)in.shape.n_experts * in.shape.hidden;
    float *w = (float *)malloc(n * sizeof(float));
    if (!w)
        return fail(COLIBRI_E_NO_MEMORY, COLIBRI_CALL_INIT, m, NULL);
    for (uint32_t l = 0; l < in.shape.n_layers; l++) {
        rc = colibri_router_weights(m, l, w);
        if (rc == COLIBRI_E_ARG)
            continue; /* a dense layer (format version 2) has no router */
        if (rc) {
            free(w);
            return fail(rc, COLIBRI_CALL_INIT, m, NULL);
        }
        for (size_t i = 0; i < n; i++)
            printf("%.9g\n", (double)w[i]);
    }
    free(w);
    return 0;
}

/* "1,2,3" -> ids; returns the count or -1. */
static long parse_tokens(const char *s, int32_t **out)
{
    size_t cap = 1;
    for (const char *c = s; *c; c++)
        cap += *c == ',';
    *out = (int32_t *)malloc(cap * sizeof(int32_t));
    if (!*out)
        return -1;
    long n = 0;
    const char *c = s;
    while (*c) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (end == c || errno || v < INT32_MIN || v > INT32_MAX)
            return -1;
        (*out)[n++] = (int32_t)v;
        c = end;
        if (*c == ',')
            c++;
        else if (*c)
            return -1;
    }
    return n;
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Append rows of float32 as little-endian bytes whatever the host. */
static int write_le(FILE *f, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        unsigned char b[4] = { (unsigned char)u, (unsigned char)(u >> 8),
                               (unsigned char)(u >> 16), (unsigned char)(u >> 24) };
        if (fwrite(b, 1, 4, f) != 4)
            return -1;
    }
    return 0;
}

static double now_us(void);

/* 1 (the one line said so) when n prompt tokens and `generate` more need
 * more positions than the model has: the prompt's, then generate - 1 fed
 * back (the last generated token is printed, not fed back). Checked before
 * any infer, so that a long --generate fails at once, not at its end. */
static int too_long(size_t n, long generate, uint32_t max_seq_len)
{
    if ((uint64_t)n + (uint64_t)(generate ? generate - 1 : 0) <= max_seq_len)
        return 0;
    char gen[48] = "";
    if (generate)
        snprintf(gen, sizeof gen, " + %ld to generate", generate);
    fflush(stdout);
    fprintf(stderr, "colibri-cli: %s: %s (%zu prompt tokens%s exceed the model's "
            "max_seq_len %u): shorten the prompt%s, or re-convert with a larger "
            "--max-seq-len\n", model_path,
            colibri_strerror_for(COLIBRI_E_INPUT_TOO_LARGE, COLIBRI_CALL_INFER), n, gen,
            (unsigned)max_seq_len, generate ? " or --generate" : "");
    return 1;
}

static int do_tokens(colibri_model *m, const int32_t *ids, uint32_t n,
                     long generate, const char *logits_out)
{
    colibri_info in;
    colibri_get_info(m, &in);
    uint32_t V = in.shape.vocab;
    if (too_long(n, generate, in.shape.max_seq_len))
        return 1;
    float *logits = (float *)malloc((size_t)n * V * sizeof(float));
    if (!logits)
        return fail(COLIBRI_E_NO_MEMORY, COLIBRI_CALL_INIT, m, NULL);
    FILE *out = NULL;
    if (logits_out && !(out = fopen(logits_out, "wb"))) {
        free(logits);
        return fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, m,
                    "cannot create the --logits-out file");
    }
    double t0 = now_us();
    int rc = colibri_infer(m, ids, NULL, 1, n, 0, logits);
    double t_prefill = now_us() - t0;
    int status = 0;
    if (rc) {
        status = fail(rc, COLIBRI_CALL_INFER, m, NULL);
        goto done;
    }
    for (uint32_t t = 0; t < n; t++) {
        uint32_t a = argmax(logits + (size_t)t * V, V);
        printf("position %u: token %d -> next %u (logit %.6g)\n", t, (int)ids[t],
               a, (double)logits[(size_t)t * V + a]);
    }
    if (out && write_le(out, logits, (size_t)n * V)) {
        status = fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, m,
                      "cannot write the --logits-out file");
        goto done;
    }
    if (generate > 0) {
        int32_t next = (int32_t)argmax(logits + (size_t)(n - 1) * V, V);
        double t_decode = 0.0;
        printf("generated:");
        for (long g = 0; g < generate; g++) {
            printf(" %d", (int)next);
            if (g == generate - 1)
                break; /* the last token is printed, not fed back */
            double ts = now_us();
            rc = colibri_infer(m, &next, NULL, 1, 1, n + (uint32_t)g, logits);
            t_decode += now_us() - ts;
            if (rc) {
                printf("\n");
                status = fail(rc, COLIBRI_CALL_INFER, m, NULL);
                goto done;
            }
            if (out && write_le(out, logits, V)) {
                status = fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, m,
                              "cannot write the --logits-out file");
                goto done;
            }
            next = (int32_t)argmax(logits, V);
        }
        printf("\n");
        /* wall time of the infer calls alone; all prompt rows' logits */
        fprintf(stderr, "prefill: %u tokens, %.1f tokens/s; decode: %ld steps, "
                "%.1f tokens/s\n", (unsigned)n,
                t_prefill > 0 ? n * 1e6 / t_prefill : 0.0, generate - 1,
                t_decode > 0 ? (double)(generate - 1) * 1e6 / t_decode : 0.0);
    }
done:
    if (out && fclose(out) != 0 && status == 0)
        status = fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, m,
                      "cannot write the --logits-out file");
    free(logits);
    return status;
}

/* An encoder-decoder's --encoder-tokens through colibri_encode (batch 1);
 * 0 for a decoder-only model without them. */
static int encode_input(colibri_model *m, const char *enc_tokens)
{
    int32_t start = colibri_decoder_start(m);
    if (!enc_tokens) {
        if (start < 0)
            return 0;
        fprintf(stderr, "colibri-cli: %s is an encoder-decoder: give its input with "
                "--encoder-tokens IDS and the decoder's tokens (from start token %d) "
                "with --tokens\n", model_path, (int)start);
        return 2;
    }
    int32_t *enc = NULL;
    long ne = parse_tokens(enc_tokens, &enc);
    if (ne < 1) {
        free(enc);
        return usage_error("--encoder-tokens needs comma-separated integers, e.g. 1,2,3");
    }
    int rc = colibri_encode(m, enc, NULL, 1, (uint32_t)ne);
    free(enc);
    if (rc)
        return fail(rc, COLIBRI_CALL_INFER, m, NULL);
    printf("encoded %ld tokens; decoder start token %d\n", ne, (int)start);
    return 0;
}

/* --tokenize / --prompt: the file's tokenizer, or a one-line error. */
static int open_tokenizer(colibri_model *m, colibri_tokenizer *tok)
{
    int rc = colibri_tokenizer_init(tok, m);
    if (rc) {
        fflush(stdout);
        fprintf(stderr, "colibri-cli: %s: %s\n", model_path, colibri_tok_strerror(rc));
        return 1;
    }
    return 0;
}

/* Text -> a malloc'd id array (the CLI may allocate; the library does not):
 * asks colibri_tokenize for the count first when the guess is too small. */
static int tokenize_text(const colibri_tokenizer *tok, const char *text, unsigned flags,
                         int32_t **ids, size_t *n)
{
    size_t len = strlen(text), cap = len + 2;
    for (int attempt = 0; attempt < 2; attempt++) {
        *ids = (int32_t *)malloc((cap ? cap : 1) * sizeof **ids);
        if (!*ids) return COLIBRI_E_NO_MEMORY;
        int rc = colibri_tokenize(tok, text, len, *ids, cap, n, flags);
        if (rc != COLIBRI_E_TOK_BUFFER) return rc;
        free(*ids);
        *ids = NULL;
        cap = *n;
    }
    return COLIBRI_E_TOK_BUFFER;
}

static int do_tokenize(colibri_model *m, const char *text)
{
    colibri_tokenizer tok;
    if (open_tokenizer(m, &tok)) return 1;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenize_text(&tok, text, COLIBRI_TOK_PARSE_SPECIAL, &ids, &n);
    if (rc) {
        free(ids);
        fprintf(stderr, "colibri-cli: --tokenize: %s\n", colibri_tok_strerror(rc));
        return 1;
    }
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return 0;
}


static int do_prompt(colibri_model *m, const char *text, long generate,
                     const colibri_sample_params *sp)
{
    colibri_tokenizer tok;
    if (open_tokenizer(m, &tok)) return 1;
    colibri_tokenizer_info ti;
    colibri_tokenizer_get_info(&tok, &ti);
    colibri_info in;
    colibri_get_info(m, &in);
    uint32_t V = in.shape.vocab;
    /* Ids past the tokenizer's (a padded vocabulary) have no text. */
    uint32_t n_text = ti.n_vocab < V ? ti.n_vocab : V;
    /* bos when the template adds it: what `colibri generate` does. An
     * encoder-decoder's text is the encoder's input, with eos last when the
     * template puts it there (T5's "$A </s>"), as transformers' tokenizer
     * call does; its decoder starts from the start token. */
    const int32_t start = colibri_decoder_start(m);
    int32_t *ids = NULL;
    size_t n = 0;
    unsigned flags = COLIBRI_TOK_PARSE_SPECIAL;
    if (ti.bos_id >= 0 && ti.template_bos)
        flags |= COLIBRI_TOK_ADD_BOS;
    if (start >= 0 && ti.eos_id >= 0 && ti.template_eos)
        flags |= COLIBRI_TOK_ADD_EOS;
    int rc = tokenize_text(&tok, text, flags, &ids, &n);
    if (rc || n == 0) {
        free(ids);
        fprintf(stderr, "colibri-cli: --prompt: %s\n",
                rc ? colibri_tok_strerror(rc) : "the prompt has no tokens");
        return rc ? 1 : 2;
    }
    if (start >= 0) {
        if (too_long(n, 0, in.shape.max_seq_len)) { /* the encoder's input */
            free(ids);
            return 1;
        }
        rc = colibri_encode(m, ids, NULL, 1, (uint32_t)n);
        if (rc) {
            free(ids);
            return fail(rc, COLIBRI_CALL_INFER, m, NULL);
        }
        fprintf(stderr, "encoded %zu prompt tokens; the decoder starts from token %d\n", n,
                (int)start);
        ids[0] = start;      /* the decoder's prompt: its start token */
        n = 1;
    }
    if (too_long(n, generate, in.shape.max_seq_len)) {
        free(ids);
        return 1;
    }
    size_t total = n + (size_t)generate;
    float *logits = (float *)malloc((size_t)n * V * sizeof(float));
    int32_t *hist = (int32_t *)malloc(total * sizeof *hist);
    size_t scratch_size = colibri_sample_scratch_size(V);
    double *scratch = (double *)malloc(scratch_size ? scratch_size : 8);
    if (!logits || !hist || !scratch) {
        free(logits); free(hist); free(scratch); free(ids);
        return fail(COLIBRI_E_NO_MEMORY, COLIBRI_CALL_INIT, m, NULL);
    }
    memcpy(hist, ids, n * sizeof *ids);
    if (start < 0) {          /* a decoder-only model continues the prompt */
        fputs(text, stdout);
        fflush(stdout);
    }
    double t0 = now_us();
    /* only the last position's logits are sampled from */
    rc = colibri_infer_ex(m, ids, NULL, 1, (uint32_t)n, 0, COLIBRI_LOGITS_LAST, logits);
    float *row = logits;
    colibri_detok d;
    colibri_detok_init(&d, &tok, COLIBRI_DETOK_SKIP_SPECIAL);
    char buf[512];
    size_t k, made = 0;
    int status = 0;
    for (long g = 0; g < generate && rc == 0; g++) {
        int32_t next;
        for (uint32_t i = n_text; i < V; i++) row[i] = -INFINITY;
        rc = colibri_sample(row, V, sp, hist, n + made, (uint64_t)g, scratch, scratch_size,
                            &next);
        if (rc) break;
        hist[n + made++] = next;
        if (colibri_detok_push(&d, next, buf, sizeof buf, &k) == 0) fwrite(buf, 1, k, stdout);
        fflush(stdout);
        if (next == ti.eos_id || g == generate - 1) break;
        rc = colibri_infer(m, &next, NULL, 1, 1, (uint32_t)(n + made - 1), logits);
        row = logits;
    }
    double t1 = now_us();
    if (colibri_detok_finish(&d, buf, sizeof buf, &k) == 0) fwrite(buf, 1, k, stdout);
    printf("\n");
    if (rc) {
        status = fail(rc, COLIBRI_CALL_INFER, m, NULL);
    } else {
        fprintf(stderr, "generated ids:");
        for (size_t i = 0; i < made; i++) fprintf(stderr, i ? ",%d" : " %d", (int)hist[n + i]);
        fprintf(stderr, "\n%zu prompt tokens, %zu generated, %.1f tokens/s\n", n, made,
                t1 > t0 ? (double)(n + made) * 1e6 / (t1 - t0) : 0.0);
    }
    free(logits); free(hist); free(scratch); free(ids);
    return status;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Decode latency: prompt once, then N single-token steps at positions
 * P, P+1, ... wrapping back to P (a rewind) when the cache is full. */
static int do_bench(colibri_model *m, const int32_t *ids, uint32_t n, long steps)
{
    colibri_info in;
    colibri_get_info(m, &in);
    uint32_t V = in.shape.vocab, S = in.shape.max_seq_len;
    if (n >= S)
        return usage_error("the --bench prompt must be shorter than max_seq_len");
    float *logits = (float *)malloc((size_t)n * V * sizeof(float));
    double *t = (double *)malloc((size_t)steps * sizeof(double));
    if (!logits || !t) {
        free(logits);
        free(t);
        return fail(COLIBRI_E_NO_MEMORY, COLIBRI_CALL_INIT, m, NULL);
    }
    int rc = colibri_infer_ex(m, ids, NULL, 1, n, 0, COLIBRI_LOGITS_LAST, logits);
    int32_t next = (int32_t)argmax(logits, V);
    for (long i = 0; rc == 0 && i < steps; i++) {
        uint32_t pos = n + (uint32_t)(i % (S - n));
        double t0 = now_us();
        rc = colibri_infer(m, &next, NULL, 1, 1, pos, logits);
        t[i] = now_us() - t0;
        next = (int32_t)argmax(logits, V);
    }
    if (rc) {
        free(logits);
        free(t);
        return fail(rc, COLIBRI_CALL_INFER, m, NULL);
    }
    double sum = 0, sq = 0;
    for (long i = 0; i < steps; i++)
        sum += t[i];
    double mean = sum / (double)steps;
    for (long i = 0; i < steps; i++)
        sq += (t[i] - mean) * (t[i] - mean);
    qsort(t, (size_t)steps, sizeof(double), cmp_double);
    size_t p50 = (size_t)((double)(steps - 1) * 0.50 + 0.5);
    size_t p99 = (size_t)((double)(steps - 1) * 0.99 + 0.5);
    printf("decode steps: %ld (prompt %u tokens, kernels %s)\n", steps, n, in.kernels);
    printf("mean_us: %.3f\np50_us: %.3f\np99_us: %.3f\nstddev_us: %.3f\n",
           mean, t[p50], t[p99], sqrt(sq / (double)steps));
    free(logits);
    free(t);
    return 0;
}

static int parse_count(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > 100000000)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *tokens = NULL, *logits_out = NULL, *tokenize = NULL, *prompt = NULL;
    const char *enc_tokens = NULL, *trace_path = NULL;
    colibri_sample_params sp = colibri_sample_defaults();
    int sampling_flags = 0;
    int slot_flags = 0; /* --policy or --prefetch given */
    int info = 0, verify = 0, dump = 0, have_model = 0;
    long generate = 0, bench = 0, threads = 1;
    int spin = 0;
    options = colibri_options_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--model") && has_val) {
            model_path = argv[++i];
            have_model = 1;
        } else if (!strcmp(a, "--info")) {
            info = 1;
        } else if (!strcmp(a, "--verify")) {
            verify = 1;
        } else if (!strcmp(a, "--dump-router-lut")) {
            dump = 1;
        } else if (!strcmp(a, "--tokens") && has_val) {
            tokens = argv[++i];
        } else if (!strcmp(a, "--encoder-tokens") && has_val) {
            enc_tokens = argv[++i];
        } else if (!strcmp(a, "--tokenize") && has_val) {
            tokenize = argv[++i];
        } else if (!strcmp(a, "--prompt") && has_val) {
            prompt = argv[++i];
        } else if ((!strcmp(a, "--temperature") || !strcmp(a, "--top-p") ||
                    !strcmp(a, "--min-p") || !strcmp(a, "--repetition-penalty")) && has_val) {
            char *end;
            float v = strtof(argv[++i], &end);
            if (end == argv[i] || *end) return usage_error("sampling options take numbers");
            if (!strcmp(a, "--temperature")) sp.temperature = v;
            else if (!strcmp(a, "--top-p")) sp.top_p = v;
            else if (!strcmp(a, "--min-p")) sp.min_p = v;
            else sp.repetition_penalty = v;
            sampling_flags = 1;
        } else if ((!strcmp(a, "--top-k") || !strcmp(a, "--seed")) && has_val) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (end == argv[i] || *end || errno || argv[i][0] == '-')
                return usage_error("--top-k and --seed take whole numbers >= 0");
            if (!strcmp(a, "--top-k")) sp.top_k = (uint32_t)v;
            else sp.seed = (uint64_t)v;
            sampling_flags = 1;
        } else if (!strcmp(a, "--logits-out") && has_val) {
            logits_out = argv[++i];
        } else if (!strcmp(a, "--route-trace") && has_val) {
            trace_path = argv[++i];
        } else if (!strcmp(a, "--generate") && has_val) {
            if (parse_count(argv[++i], &generate))
                return usage_error("--generate needs a count >= 1");
        } else if (!strcmp(a, "--threads") && has_val) {
            if (parse_count(argv[++i], &threads) || threads > (long)COLIBRI_MAX_THREADS)
                return usage_error("--threads needs a count from 1 to 64");
        } else if (!strcmp(a, "--kv") && has_val) {
            const char *k = argv[++i];
            if (!strcmp(k, "f32")) options.kv_dtype = COLIBRI_KV_F32;
            else if (!strcmp(k, "i8")) options.kv_dtype = COLIBRI_KV_I8;
            else return usage_error("--kv takes f32 or i8");
        } else if (!strcmp(a, "--ram") && has_val) {
            if (parse_size(argv[++i], &options.ram_bytes))
                return usage_error("--ram takes a size: bytes, or 512M, 2G");
        } else if (!strcmp(a, "--slots") && has_val) {
            long v;
            if (parse_count(argv[++i], &v) || v > 0x7fffffffL)
                return usage_error("--slots needs a count >= 1");
            options.expert_slots = (uint32_t)v;
        } else if (!strcmp(a, "--policy") && has_val) {
            const char *k = argv[++i];
            if (!strcmp(k, "reuse")) options.slot_policy = COLIBRI_SLOTS_REUSE;
            else if (!strcmp(k, "freq")) options.slot_policy = COLIBRI_SLOTS_FREQ;
            else if (!strcmp(k, "lru")) options.slot_policy = COLIBRI_SLOTS_LRU;
            else return usage_error("--policy takes reuse, freq or lru");
            slot_flags = 1;
        } else if (!strcmp(a, "--prefetch") && has_val) {
            long v = 0;
            const char *k = argv[++i];
            if (strcmp(k, "0") && (parse_count(k, &v) || v > 1024))
                return usage_error("--prefetch needs a count from 0 to 1024");
            options.prefetch = (uint32_t)v;
            slot_flags = 1;
        } else if (!strcmp(a, "--spin")) {
            spin = 1;
        } else if (!strcmp(a, "--bench") && has_val) {
            if (parse_count(argv[++i], &bench))
                return usage_error("--bench needs a count >= 1");
        } else {
            fprintf(stderr, "colibri-cli: unknown or incomplete option '%s': "
                    "see colibri-cli --help\n", a);
            return 2;
        }
    }
    if (!have_model)
        return usage_error("--model FILE is required");
    int actions = info + verify + dump + (bench > 0) + (tokens && !bench) + !!tokenize +
                  !!prompt;
    if (actions != 1)
        return usage_error("give exactly one of --info, --verify, "
                           "--dump-router-lut, --tokens, --bench, --tokenize, --prompt");
    if (logits_out && (!tokens || bench))
        return usage_error("--logits-out goes with --tokens");
    if (trace_path && ((!tokens && !prompt) || bench))
        return usage_error("--route-trace goes with --tokens or --prompt");
    if (enc_tokens && (!tokens || bench))
        return usage_error("--encoder-tokens goes with --tokens (the decoder's)");
    if (generate && !tokens && !prompt)
        return usage_error("--generate goes with --tokens or --prompt");
    if (sampling_flags && !prompt)
        return usage_error("sampling options go with --prompt");
    if (slot_flags && !options.ram_bytes && !options.expert_slots)
        return usage_error("--policy and --prefetch go with --ram or --slots (streamed "
                           "experts)");
    if (!(sp.temperature >= 0.0f) || !(sp.top_p >= 0.0f) || !(sp.min_p >= 0.0f) ||
        !(sp.repetition_penalty > 0.0f) || isinf(sp.temperature) ||
        isinf(sp.repetition_penalty))
        return usage_error("--temperature, --top-p and --min-p must be >= 0 and "
                           "--repetition-penalty > 0");
    if (verify)
        return do_verify();

    int32_t *ids = NULL;
    long n = 0;
    if (tokens || bench) {
        n = parse_tokens(tokens ? tokens : "1,2,3,4", &ids);
        if (n < 1) {
            free(ids);
            return usage_error("--tokens needs comma-separated integers, e.g. 1,2,3");
        }
    }
    colibri_model m;
    int rc = load(&m);
    int status;
    if (rc == 0 && (threads > 1 || spin))
        rc = colibri_set_threads(&m, (uint32_t)threads, spin ? COLIBRI_THREADS_SPIN : 0);
    route_trace trace = { NULL, 0 };
    if (rc == 0 && trace_path) {
        colibri_info in;
        colibri_get_info(&m, &in);
        trace.f = fopen(trace_path, "w");
        if (!trace.f) {
            char why[512];
            snprintf(why, sizeof why, "cannot create the --route-trace file %s: %s",
                     trace_path, strerror(errno));
            unload(&m);
            free(ids);
            return fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, NULL, why);
        }
        if (fprintf(trace.f, "# colibri route trace: n_layers %u n_experts %u top_k %u\n",
                    (unsigned)in.shape.n_layers, (unsigned)in.shape.n_experts,
                    (unsigned)in.shape.top_k) < 0)
            trace.failed = 1;
        rc = colibri_set_route_observer(&m, write_route, &trace);
    }
    if (rc) {
        status = fail(rc, COLIBRI_CALL_INIT, &m, NULL);
    } else if (info) {
        status = do_info(&m);
    } else if (dump) {
        status = do_dump_router(&m);
    } else if (tokenize) {
        status = do_tokenize(&m, tokenize);
    } else if (prompt) {
        status = do_prompt(&m, prompt, generate ? generate : 32, &sp);
    } else if (bench) {
        status = do_bench(&m, ids, (uint32_t)n, bench);
    } else {
        status = encode_input(&m, enc_tokens);
        if (status == 0)
            status = do_tokens(&m, ids, (uint32_t)n, generate, logits_out);
    }
    if (rc == 0 && !info)
        print_stream(&m, stderr, 0);
    if (trace.f && (fclose(trace.f) != 0 || trace.failed) && status == 0)
        status = fail(COLIBRI_E_IO, COLIBRI_CALL_INIT, NULL,
                      "cannot write the --route-trace file");
    unload(&m);
    free(ids);
    return status;
}
