/*
 * tokenizer.c - the tokenizer section (docs/FORMAT.md section 7) used in
 * place: byte-level BPE with the GPT-2 / Qwen2 / Llama-3 pre-tokenizer
 * regexes, SentencePiece-style BPE with byte fallback, and streaming
 * detokenising. The steps follow Hugging Face `tokenizers` 0.23 (the judge
 * of tests/test_tokenizer_c.py) and colibri/text/tokenizer.py line for line:
 * added tokens split first (leftmost-longest), then the pre-tokenizer, then
 * BPE per word (lowest merge rank first, leftmost on ties).
 *
 * No allocation: every table is read from the section through ld32 in the
 * section's byte order (so a byte-swapped or flash-resident file needs no
 * copy); a word's symbols live in the caller's id buffer, or in a small stack
 * scratch when that is full. Every id and offset read from the section was
 * bounds-checked once in colibri_tokenizer_init, so the hot paths do not
 * check again.
 */
#include "colibri_tokenizer.h"

#include <string.h>

#ifdef COLIBRI_NO_TOKENIZER
/* The build switch: the API stays, the code goes. */
int colibri_tokenizer_init(colibri_tokenizer *t, const colibri_model *m)
{ (void)t; (void)m; return COLIBRI_E_UNSUPPORTED; }
int colibri_tokenizer_init_from_section(colibri_tokenizer *t, const void *s, size_t n)
{ (void)t; (void)s; (void)n; return COLIBRI_E_UNSUPPORTED; }
int colibri_tokenizer_get_info(const colibri_tokenizer *t, colibri_tokenizer_info *o)
{ (void)t; (void)o; return COLIBRI_E_UNSUPPORTED; }
int colibri_tokenize(const colibri_tokenizer *t, const char *x, size_t l, int32_t *i,
                     size_t c, size_t *n, unsigned f)
{ (void)t; (void)x; (void)l; (void)i; (void)c; (void)f; if (n) *n = 0;
  return COLIBRI_E_UNSUPPORTED; }
void colibri_detok_init(colibri_detok *d, const colibri_tokenizer *t, unsigned f)
{ if (d) { memset(d, 0, sizeof *d); d->t = t; d->flags = f; } }
int colibri_detok_push(colibri_detok *d, int32_t id, char *o, size_t c, size_t *n)
{ (void)d; (void)id; (void)o; (void)c; if (n) *n = 0; return COLIBRI_E_UNSUPPORTED; }
int colibri_detok_finish(colibri_detok *d, char *o, size_t c, size_t *n)
{ (void)d; (void)o; (void)c; if (n) *n = 0; return COLIBRI_E_UNSUPPORTED; }
int colibri_detokenize(const colibri_tokenizer *t, const int32_t *i, size_t k, char *o,
                       size_t c, size_t *n, unsigned f)
{ (void)t; (void)i; (void)k; (void)o; (void)c; (void)f; if (n) *n = 0;
  return COLIBRI_E_UNSUPPORTED; }
const char *colibri_tok_strerror(int code)
{ return code == COLIBRI_E_UNSUPPORTED ? "built without the tokenizer "
                                         "(COLIBRI_NO_TOKENIZER)" : colibri_strerror(code); }
#else

#include "unicode_tables.h"

/* FORMAT.md section 7 constants (colibri/text/tokenizer.py has the same). */
#define KIND_TOKENIZER 0x0100u
#define HDR 96u
#define NO_ID 0xFFFFFFFFu
#define M_BYTE_LEVEL 1u
#define M_SENTENCEPIECE 2u
#define M_UNIGRAM 3u                /* version 3: SentencePiece Unigram (T5) */
#define F_ADD_PREFIX_SPACE (1u << 0)
#define F_IGNORE_MERGES (1u << 1)
#define F_BYTE_FALLBACK (1u << 2)
#define F_FUSE_UNK (1u << 3)
#define F_SP_PREPEND (1u << 4)
#define F_SP_PREPEND_FIRST (1u << 5)
#define F_SP_STRIP (1u << 6)
#define F_SP_PREPEND_UNLESS (1u << 7)
#define F_TEMPLATE_BOS (1u << 8)
#define F_NFC (1u << 9)             /* version 2: text runs are NFC-normalised */
#define F_SP_SPLIT (1u << 10)       /* version 3: Metaspace split: cut before ▁ */
#define F_WS_SPLIT (1u << 11)       /* ... WhitespaceSplit before Metaspace */
#define F_DEC_METASPACE (1u << 12)  /* ... decoder Metaspace (no byte fallback) */
#define F_DEC_DROP_FIRST (1u << 13) /* ... its first token loses every ▁ */
#define F_TEMPLATE_EOS (1u << 14)   /* ... the template puts eos last */
#define F_NFKC (1u << 15)           /* ... text runs are NFKC-normalised (stored map) */
#define F_NORM_PROG (1u << 16)      /* ... then the stored normaliser program */
#define KNOWN_FLAGS_V2 0x3FFu
#define KNOWN_FLAGS 0x1FFFFu
#define EXT_SCORES 1u               /* version 3 extensions (FORMAT.md 7.3) */
#define EXT_NFKC_MAP 2u
#define EXT_NFKC_POOL 3u
#define EXT_NORM 4u                 /* the normaliser program (FORMAT.md 7.4) */
#define EXT_LOWER 5u                /* {cp, lowercase, second or 0} by cp */
#define EXT_CHARSMAP 6u             /* Precompiled: SentencePiece's map (FORMAT.md 7.5) */
#define EXT_GRAPHEMES 7u            /* ... and the grapheme cluster table */
#define MAX_EXT 7u
#define NORM_STRIP 1u               /* normaliser program ops */
#define NORM_REPLACE 2u
#define NORM_PREPEND 3u
#define NORM_LOWERCASE 4u
#define NORM_PRECOMPILED 5u
#define MAX_NORM_CONTENT 64u
#define MAX_GRAPHEME_RUNS 8192u
/* Grapheme_Cluster_Break values (props bits 0-3; colibri/text/grapheme.py) */
enum { GC_OTHER, GC_CR, GC_LF, GC_CONTROL, GC_EXTEND, GC_ZWJ, GC_RI, GC_PREPEND,
       GC_SPACING, GC_L, GC_V, GC_T, GC_LV, GC_LVT };
#define GC_PICT 16u                 /* Extended_Pictographic */
#define INCB_LINKER 1u              /* Indic_Conjunct_Break (props >> 5) */
#define INCB_CONSONANT 2u
#define INCB_EXTEND 3u
#define PC_CLUSTER_BYTES 6u         /* a cluster this long goes by character */
#define NFKC_MAX_LEN 18u
#define MAX_UNIGRAM_PIECE 255u      /* the Viterbi's way back: a byte a position */
#define ID_ADDED 1u
#define ID_SPECIAL 2u
#define ID_BYTE 4u
#define ID_IN_VOCAB 8u
#define MAX_VOCAB (1u << 22)
#define PRETOK_PROGRAM 4u
#define MAX_STEPS 8u
#define STEP_BYTES (1u << 9)        /* a step that matches over the byte alphabet */
#define MAX_PROG_WORDS 4096u

typedef struct colibri_tokenizer_private_ tokp;

/* The init-time checks of version 3 run once: kept out of line, because
 * gcc inlines them into colibri_tokenizer_init_from_section and versions
 * their loops per byte order, 9 KiB more on ppc. */
#if defined(__GNUC__)
#define COLD_CHECK __attribute__((noinline))
#else
#define COLD_CHECK
#endif

static uint32_t ld32(const uint8_t *p, int be)
{
    return be ? ((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3])
              : ((uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]);
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* Decode one code point at p (n > 0 bytes left). Invalid input yields U+FFFD
 * for each maximal subpart of an ill-formed sequence (Unicode 3.9, what
 * Rust's from_utf8_lossy and Python's decode(errors="replace") do); *bad is
 * set. Returns the bytes consumed (>= 1). */
static size_t u8_next(const uint8_t *p, size_t n, uint32_t *cp, int *bad)
{
    uint8_t c = p[0];
    *bad = 0;
    if (c < 0x80) { *cp = c; return 1; }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else { *cp = 0xFFFD; *bad = 1; return 1; }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n || p[i] < lo || p[i] > hi) { *cp = 0xFFFD; *bad = 1; return i; }
        v = v << 6 | (p[i] & 0x3F);
        lo = 0x80; hi = 0xBF;
    }
    *cp = v;
    return i;
}

static size_t u8_put(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | cp >> 6); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12); o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18); o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)); o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) are U+0100.. in byte order. */
static uint32_t byte_char(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xA0) return 0x100u + 33u + (b - 0x7Fu);
    return 0x100u + 67u; /* 0xAD */
}

static int char_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp > 0x143) return -1;
    cp -= 0x100;
    return cp < 33 ? (int)cp : cp < 67 ? (int)(0x7F + cp - 33) : 0xAD;
}

/* ---- character classes (Unicode 16.0, as tokenizers' Oniguruma) -------- */

#ifndef COLIBRI_TOK_GC_GROUPS
/* General_Category index of cp (colibri/text/unicode_tables.py GC_NAMES). */
static unsigned gc_of(uint32_t cp)
{
    uint32_t lo = 0, hi = COLIBRI_GC_RUNS_N;   /* last run starting <= cp */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((colibri_gc_runs[mid] >> 5) <= cp) lo = mid; else hi = mid;
    }
    return colibri_gc_runs[lo] & 31u;
}

/* cp's category is in the mask (bit g = category g). */
static int gc_in(uint32_t mask, uint32_t cp) { return (mask >> gc_of(cp)) & 1u; }
#else
/* The small table: the group of cp, as the mask of its categories (every
 * mask a program may hold here is a union of groups: check_prog). */
static const uint32_t GROUP_MASK[8] = {
    0x1u, 0x3Eu, 0x1C0u, 0xE00u, 0x7F000u, 0x780000u, 0x3800000u, 0x3C000000u };

static uint32_t group_mask(uint32_t cp)
{
    const uint8_t *r = colibri_gc_group_runs;
    uint32_t lo = 0, hi = COLIBRI_GC_GROUP_RUNS_N;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t v = (uint32_t)r[3 * mid] << 16 | (uint32_t)r[3 * mid + 1] << 8 | r[3 * mid + 2];
        if ((v >> 3) <= cp) lo = mid; else hi = mid;
    }
    return GROUP_MASK[r[3 * lo + 2] & 7u];
}

static int gc_in(uint32_t mask, uint32_t cp) { return (mask & group_mask(cp)) != 0; }
#endif

#define GC_L_MASK 0x3Eu          /* Lu Ll Lt Lm Lo */
#define GC_N_MASK 0xE00u         /* Nd Nl No */

static int is_L(uint32_t c)
{
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return gc_in(GC_L_MASK, c);
}

static int is_N(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    return gc_in(GC_N_MASK, c);
}

/* \s: Unicode White_Space (not C's isspace, not Python's str.isspace). */
static int is_S(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_other(uint32_t c) { return !is_S(c) && !is_L(c) && !is_N(c); }

/* ---- section access --------------------------------------------------- */

static const uint8_t *piece(const tokp *t, uint32_t id, uint32_t *len)
{
    uint32_t a = ld32(t->piece_off + 4u * id, t->be);
    uint32_t b = ld32(t->piece_off + 4u * id + 4u, t->be);
    *len = b - a;
    return t->strings + a;
}

static int memcmp_len(const uint8_t *a, uint32_t na, const uint8_t *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb;
    int c = n ? memcmp(a, b, n) : 0;
    return c ? c : (na < nb ? -1 : na > nb ? 1 : 0);
}

/* Binary search of the BPE vocabulary by piece bytes: id or NO_ID. */
static uint32_t lookup(const tokp *t, const uint8_t *s, uint32_t n)
{
    uint32_t lo = 0, hi = t->n_sorted;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, id = ld32(t->sorted + 4u * mid, t->be), pl;
        const uint8_t *p = piece(t, id, &pl);
        int c = memcmp_len(p, pl, s, n);
        if (c == 0) return id;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NO_ID;
}

/* The merge of (l, r): its rank (UINT32_MAX if none) and *res. */
static uint32_t merge_rank(const tokp *t, uint32_t l, uint32_t r, uint32_t *res)
{
    uint32_t lo = 0, hi = t->n_merges;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const uint8_t *e = t->merges + 16u * mid;
        uint32_t el = ld32(e, t->be), er = ld32(e + 4, t->be);
        if (el == l && er == r) { *res = ld32(e + 8, t->be); return ld32(e + 12, t->be); }
        if (el < l || (el == l && er < r)) lo = mid + 1; else hi = mid;
    }
    return UINT32_MAX;
}

/* ---- init and validation ---------------------------------------------- */

static int valid_utf8(const uint8_t *p, uint32_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp; int bad;
        i += u8_next(p + i, n - i, &cp, &bad);
        if (bad) return 0;
    }
    return 1;
}

static int is_hex(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); }

/* ---- the pre-tokenizer program (FORMAT.md 7.2, colibri/text/tokregex.py) --- */

enum { OP_CHAR = 1, OP_CLASS, OP_SPAN, OP_SPLIT, OP_JMP, OP_LOOK, OP_LOOKEND, OP_ASSERT,
       OP_MATCH };
enum { A_BOL, A_EOL, A_BOS, A_EOS, A_WORDB, A_NWORDB, A_EOSNL };
#define ITEM_PROP 0x80000000u
#define ITEM_NEG 0x40000000u
#define CL_NEG 1u
#define CL_AND 2u
#define B_REMOVED 0u
#define B_ISOLATED 1u
#define B_MERGED_PREV 2u
#define B_MERGED_NEXT 3u
#define B_CONTIGUOUS 4u

typedef struct { const uint8_t *w; int be; } prog_t;   /* one step's program */

static uint32_t PW(prog_t g, uint32_t i) { return ld32(g.w + 4u * i, g.be); }

/* Words of the instruction at pc; 0 when it does not fit in n words or is
 * not an instruction. */
static uint32_t insn_len(prog_t g, uint32_t pc, uint32_t n)
{
    if (pc >= n) return 0;
    uint32_t w = PW(g, pc), op = w & 0xFFu, len;
    switch (op) {
    case OP_CHAR: case OP_LOOKEND: case OP_ASSERT: case OP_MATCH: len = 1; break;
    case OP_JMP: case OP_LOOK: len = 2; break;
    case OP_SPLIT: len = 3; break;
    case OP_CLASS: len = 1u + 2u * (w >> 16); break;
    case OP_SPAN: {
        uint32_t inner = insn_len(g, pc + 3, n);
        if (!inner || pc + 3 >= n) return 0;
        uint32_t iop = PW(g, pc + 3) & 0xFFu;
        if (iop != OP_CHAR && iop != OP_CLASS) return 0;
        len = 3u + inner;
        break;
    }
    default: return 0;
    }
    return (uint64_t)pc + len <= n ? len : 0;
}

static int valid_item(uint32_t a, uint32_t b)
{
    if (!(a & ITEM_PROP)) return (a & ~ITEM_NEG) <= 0x10FFFFu && b <= 0x10FFFFu;
    uint32_t kind = a & 0xFFu;
    if (a & ~(ITEM_PROP | ITEM_NEG | 0xFFu)) return 0;
    return kind == 0 ? b < (1u << 30) : kind <= 3 && b == 0;
}

/* Can this build match the item? (The small table knows groups only.) */
static int item_in_build(uint32_t a, uint32_t b)
{
#ifdef COLIBRI_TOK_GC_GROUPS
    static const uint32_t groups[8] = {
        0x1u, 0x3Eu, 0x1C0u, 0xE00u, 0x7F000u, 0x780000u, 0x3800000u, 0x3C000000u };
    if ((a & ITEM_PROP) && (a & 0xFFu) == 0)
        for (unsigned g = 0; g < 8; g++)
            if ((b & groups[g]) && (b & groups[g]) != groups[g]) return 0;
    if ((a & ITEM_PROP) && (a & 0xFFu) == 2) return 0;   /* word: needs Nd, Pc */
#else
    (void)a; (void)b;
#endif
    return 1;
}

/* One instruction's own fields (not its jump targets). */
static int valid_insn(prog_t g, uint32_t pc)
{
    uint32_t w = PW(g, pc), op = w & 0xFFu;
    if (op == OP_CHAR) return (w >> 8) <= 0x10FFFFu;
    if (op == OP_CLASS) {
        if ((w >> 8 & 0xFFu) & ~3u) return 0;
        for (uint32_t k = 0; k < (w >> 16); k++)
            if (!valid_item(PW(g, pc + 1 + 2 * k), PW(g, pc + 2 + 2 * k))) return 0;
        return 1;
    }
    if (op == OP_SPAN)
        return (w >> 8) <= 1u && PW(g, pc + 1) <= PW(g, pc + 2) && valid_insn(g, pc + 3);
    if (op == OP_ASSERT) return (w >> 8) <= A_EOSNL;
    if (op == OP_LOOK) return (w >> 8) <= 1u;
    return (w >> 8) == 0;
}

/* A program: instructions tiling [0, n), each valid, the last MATCH, every
 * jump forward to an instruction start (so every path ends: no loops but
 * SPAN's, which consume a character per step). */
static int check_prog(prog_t g, uint32_t n)
{
    uint8_t start[MAX_PROG_WORDS / 8];
    if (n < 1 || n > MAX_PROG_WORDS) return 0;
    memset(start, 0, sizeof start);
    uint32_t pc = 0, last = 0;
    while (pc < n) {
        uint32_t len = insn_len(g, pc, n);
        if (!len || !valid_insn(g, pc)) return 0;
        start[pc / 8] |= (uint8_t)(1u << (pc % 8));
        last = pc;
        pc += len;
    }
    if ((PW(g, last) & 0xFFu) != OP_MATCH) return 0;
#define IS_START(x) ((x) < n && (start[(x) / 8] >> ((x) % 8) & 1u))
    for (pc = 0; pc < n; pc += insn_len(g, pc, n)) {
        uint32_t op = PW(g, pc) & 0xFFu;
        if (op == OP_SPLIT && !(PW(g, pc + 1) > pc && IS_START(PW(g, pc + 1)) &&
                                PW(g, pc + 2) > pc && IS_START(PW(g, pc + 2))))
            return 0;
        if ((op == OP_JMP || op == OP_LOOK) && !(PW(g, pc + 1) > pc && IS_START(PW(g, pc + 1))))
            return 0;
    }
#undef IS_START
    return 1;
}

/* Every class item and assertion of a (checked) program is one this build
 * can match: with the small Unicode table, categories only in whole groups
 * (no \\p{Lu}, \\d), no word class or \\b. */
static int prog_in_build(prog_t g, uint32_t n)
{
    for (uint32_t pc = 0; pc < n; pc += insn_len(g, pc, n)) {
        uint32_t at = (PW(g, pc) & 0xFFu) == OP_SPAN ? pc + 3 : pc, w = PW(g, at);
        if ((w & 0xFFu) == OP_CLASS) {
            for (uint32_t k = 0; k < (w >> 16); k++)
                if (!item_in_build(PW(g, at + 1 + 2 * k), PW(g, at + 2 + 2 * k))) return 0;
        }
#ifdef COLIBRI_TOK_GC_GROUPS
        if ((w & 0xFFu) == OP_ASSERT && ((w >> 8) == A_WORDB || (w >> 8) == A_NWORDB)) return 0;
#endif
    }
    return 1;
}

/* The steps table: n_steps, then per step {behavior | invert << 8, offset,
 * words, 0}; every program inside the blob and valid. */
static int check_pretok(tokp *t)
{
    prog_t b = { t->pretok_prog, t->be };
    uint32_t n = t->n_pretok_words;
    if (n < 1) return COLIBRI_E_TOK_FORMAT;
    uint32_t steps = PW(b, 0);
    if (steps < 1 || steps > MAX_STEPS || n < 1 + 4 * steps) return COLIBRI_E_TOK_FORMAT;
    uint32_t from = steps;             /* the first step over the byte alphabet */
    for (uint32_t k = 0; k < steps; k++) {
        uint32_t mode = PW(b, 1 + 4 * k), off = PW(b, 2 + 4 * k), len = PW(b, 3 + 4 * k);
        /* STEP_BYTES: on every step after one that has it; only in a
         * byte-level model */
        uint32_t in_bytes = from < k, has = (mode & STEP_BYTES) != 0;
        if ((mode & 0xFFu) > B_CONTIGUOUS || (mode >> 8) > 3u || PW(b, 4 + 4 * k) ||
            off < 1 + 4 * steps || off > n || len > n - off ||
            (in_bytes && !has) || (has && t->model != M_BYTE_LEVEL))
            return COLIBRI_E_TOK_FORMAT;
        if (has && from == steps) from = k;
        prog_t g = { t->pretok_prog + 4u * off, t->be };
        if (!check_prog(g, len)) return COLIBRI_E_TOK_FORMAT;
        if (!prog_in_build(g, len)) return COLIBRI_E_UNSUPPORTED;
    }
    t->n_steps = steps;
    t->bytes_from = from;
    return COLIBRI_OK;
}

static uint64_t score_bits(const tokp *t, uint32_t id)
{
    const uint8_t *p = t->scores + 8u * id;
    uint64_t lo = ld32(p + (t->be ? 4 : 0), t->be), hi = ld32(p + (t->be ? 0 : 4), t->be);
    return hi << 32 | lo;
}

static double bits_double(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static double score_of(const tokp *t, uint32_t id) { return bits_double(score_bits(t, id)); }

/* Unigram: the scores (one float64 per id, checked in place by
 * check_extensions), no merges, an unk id, vocabulary pieces of at most
 * MAX_UNIGRAM_PIECE bytes; the unknown character's score, tokenizers'
 * min_score - 10. */
COLD_CHECK static int check_scores(tokp *t)
{
    if (t->n_merges || t->unk_id < 0) return COLIBRI_E_TOK_FORMAT;
    /* On the bits, with no float arithmetic until every score is known
     * finite: the exponent field, then the least score in the order of
     * IEEE 754 (a finite double's bits, sign-flipped so that unsigned order
     * is numeric order; -0 sorts below +0, and either gives the same
     * unk_score). */
    uint64_t least = 0, least_bits = 0;
    int any = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint64_t b = score_bits(t, i);
        if ((b >> 52 & 0x7FFu) == 0x7FFu) return COLIBRI_E_TOK_FORMAT;   /* NaN or infinite */
        if (!(t->id_flags[i] & ID_IN_VOCAB)) continue;
        uint32_t pl;
        (void)piece(t, i, &pl);
        if (pl > MAX_UNIGRAM_PIECE) return COLIBRI_E_TOK_FORMAT;
        uint64_t key = (b >> 63) ? ~b : b | (1ull << 63);
        if (!any || key < least) { least = key; least_bits = b; }
        any = 1;
    }
    t->unk_score = bits_double(least_bits) - 10.0;
    return COLIBRI_OK;
}

/* The NFKC map (sorted code points, each with its NFKD in the pool) and its
 * pool: FORMAT.md 7.3. */
COLD_CHECK static int check_nfkc(const tokp *t)
{
    uint32_t prev = 0;
    for (uint32_t i = 0; i < t->n_nfkc; i++) {
        uint32_t w = ld32(t->nfkc_map + 8u * i, t->be), at = ld32(t->nfkc_map + 8u * i + 4, t->be);
        uint32_t cp = w & 0x7FFFFFFFu, len = at & 31u, start = at >> 5;
        if ((i && cp <= prev) || cp > 0x10FFFFu || (cp >= 0xD800u && cp < 0xE000u) ||
            len < 1 || len > NFKC_MAX_LEN || start > t->n_nfkc_pool - len)
            return COLIBRI_E_TOK_FORMAT;
        prev = cp;
    }
    for (uint32_t i = 0; i < t->n_nfkc_pool; i++) {
        uint32_t c = ld32(t->nfkc_pool + 4u * i, t->be);
        if (c > 0x10FFFFu || (c >= 0xD800u && c < 0xE000u)) return COLIBRI_E_TOK_FORMAT;
    }
    return COLIBRI_OK;
}

static int scalar(uint32_t c) { return c <= 0x10FFFFu && (c < 0xD800u || c >= 0xE000u); }

/* The normaliser program (FORMAT.md 7.4): n steps {op | arg << 8, offset,
 * n_prog, n_content}, each one's program and content inside the words, the
 * programs valid, the contents Unicode scalar values; a Lowercase step
 * with its map (sorted code points, each to one or two others) and the map
 * only with one. */
COLD_CHECK static int check_norm(const tokp *t, const uint8_t *prog_at, int have_lower)
{
    prog_t b = { prog_at, t->be };
    uint32_t n = t->n_norm_words, lowers = 0, maps = 0;
    if (n < 1) return COLIBRI_E_TOK_FORMAT;
    uint32_t steps = PW(b, 0);
    if (steps < 1 || steps > MAX_STEPS || n < 1 + 4 * steps) return COLIBRI_E_TOK_FORMAT;
    for (uint32_t k = 0; k < steps; k++) {
        uint32_t mode = PW(b, 1 + 4 * k), off = PW(b, 2 + 4 * k);
        uint32_t np = PW(b, 3 + 4 * k), nc = PW(b, 4 + 4 * k), op = mode & 0xFFu, arg = mode >> 8;
        int shape = op == NORM_STRIP ? arg <= 3u && !np && !nc
                  : op == NORM_REPLACE ? !arg && np >= 1 && np <= MAX_PROG_WORDS
                  : op == NORM_PREPEND ? !arg && !np && nc >= 1
                  : op == NORM_LOWERCASE || op == NORM_PRECOMPILED ? !arg && !np && !nc : 0;
        if (!shape || nc > MAX_NORM_CONTENT || off < 1 + 4 * steps || off > n ||
            np + nc > n - off)
            return COLIBRI_E_TOK_FORMAT;
        if (np) {
            prog_t g = { prog_at + 4u * off, t->be };
            if (!check_prog(g, np)) return COLIBRI_E_TOK_FORMAT;
            if (!prog_in_build(g, np)) return COLIBRI_E_UNSUPPORTED;
        }
        for (uint32_t i = 0; i < nc; i++)
            if (!scalar(PW(b, off + np + i))) return COLIBRI_E_TOK_FORMAT;
        lowers += op == NORM_LOWERCASE;
        maps += op == NORM_PRECOMPILED;
    }
    if ((lowers != 0) != (have_lower != 0) || maps != (t->n_cmap_units != 0u))
        return COLIBRI_E_TOK_FORMAT;
    for (uint32_t i = 0; have_lower && i < t->n_lower; i++) {
        const uint8_t *e = t->lower + 12u * i;
        uint32_t cp = ld32(e, t->be), a = ld32(e + 4, t->be), c = ld32(e + 8, t->be);
        if ((i && cp <= ld32(e - 12, t->be)) || !scalar(cp) || !a || !scalar(a) || !scalar(c))
            return COLIBRI_E_TOK_FORMAT;
    }
    return COLIBRI_OK;
}

/* A Precompiled step's map (FORMAT.md 7.5), as SentencePiece writes it
 * (little-endian whatever the section's order): u32 trie size, the trie's
 * units, then NUL-ended UTF-8 strings. Whole units, at least one and fewer
 * than 2^21 (so no inner unit has bit 31, a leaf's mark); the strings valid
 * UTF-8 ending in NUL; every leaf pointing into them at a character's
 * start. Then the grapheme table: runs from U+0000, strictly increasing,
 * known properties. The map's `size` bytes at `area`: on success, its
 * trie and strings in t->cmap_units / cmap_strings. */
COLD_CHECK static int check_charsmap(tokp *t, const uint8_t *area, uint32_t size)
{
    if (size < 4) return COLIBRI_E_TOK_FORMAT;
    uint32_t trie = ld32(area, 0);
    if (trie % 4u || trie < 4u || trie > size - 4u - 1u || trie / 4u >= (1u << 21))
        return COLIBRI_E_TOK_FORMAT;
    const uint8_t *str = area + 4u + trie;
    uint32_t n_str = size - 4u - trie;
    if (str[n_str - 1u] != 0 || !valid_utf8(str, n_str)) return COLIBRI_E_TOK_FORMAT;
    t->cmap_units = area + 4;
    t->n_cmap_units = trie / 4u;
    t->cmap_strings = str;
    t->n_cmap_strings = n_str;
    for (uint32_t i = 0; i < t->n_cmap_units; i++) {
        uint32_t u = ld32(t->cmap_units + 4u * i, 0), v = u & 0x7FFFFFFFu;
        if ((u >> 31) && (v >= n_str || (str[v] & 0xC0u) == 0x80u)) return COLIBRI_E_TOK_FORMAT;
    }
    uint32_t n = t->n_graphemes;
    if (n < 1 || n > MAX_GRAPHEME_RUNS || (ld32(t->graphemes, t->be) >> 8) != 0)
        return COLIBRI_E_TOK_FORMAT;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t w = ld32(t->graphemes + 4u * i, t->be);
        if ((i && (w >> 8) <= (ld32(t->graphemes + 4u * i - 4u, t->be) >> 8)) ||
            (w >> 8) > 0x10FFFFu || (w & 0x80u) || (w & 15u) > GC_LVT)
            return COLIBRI_E_TOK_FORMAT;
    }
    return COLIBRI_OK;
}

/* Version 3's extension directory at off: n (1..MAX_EXT), then n x {kind,
 * offset, count, 0}; each kind once, aligned, inside the section; the
 * model's and flags' extensions present and no other. */
COLD_CHECK static int check_extensions(tokp *t, uint32_t off, int unigram)
{
    if (off % 4 || off < HDR || off > t->size - 4) return COLIBRI_E_TOK_FORMAT;
    uint32_t n = ld32(t->sec + off, t->be), seen = 0, cmap_bytes = 0;
    const uint8_t *prog_at = t->sec, *cmap = t->sec;
    if (n < 1 || n > MAX_EXT || (uint64_t)off + 4 + 16ull * n > t->size)
        return COLIBRI_E_TOK_FORMAT;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *e = t->sec + off + 4 + 16u * k;
        uint32_t kind = ld32(e, t->be), eoff = ld32(e + 4, t->be), count = ld32(e + 8, t->be);
        uint32_t align = kind == EXT_SCORES || kind == EXT_NFKC_MAP ? 8u : 4u;
        uint32_t unit = kind == EXT_CHARSMAP ? 1u : align;
        uint32_t bit;                   /* a switch: the form EVA proves */
        switch (kind) {
        case EXT_SCORES: bit = 1u; break;
        case EXT_NFKC_MAP: bit = 2u; break;
        case EXT_NFKC_POOL: bit = 4u; break;
        case EXT_NORM: bit = 8u; break;
        case EXT_LOWER: bit = 16u; break;
        case EXT_CHARSMAP: bit = 32u; break;
        case EXT_GRAPHEMES: bit = 64u; break;
        default: bit = 0u; break;
        }
        if (!bit || (seen & bit) || ld32(e + 12, t->be) || eoff % align || eoff < HDR ||
            (uint64_t)eoff + (uint64_t)unit * count > t->size)
            return COLIBRI_E_TOK_FORMAT;
        seen |= bit;
        const uint8_t *at = t->sec + eoff;
        if (kind == EXT_SCORES) {
            if (count != t->n_vocab) return COLIBRI_E_TOK_FORMAT;
            t->scores = at;
        } else if (kind == EXT_NFKC_MAP) {
            t->nfkc_map = at; t->n_nfkc = count;
        } else if (kind == EXT_NFKC_POOL) {
            t->nfkc_pool = at; t->n_nfkc_pool = count;
        } else if (kind == EXT_NORM) {
            t->norm_prog = prog_at = at; t->n_norm_words = count;
        } else if (kind == EXT_CHARSMAP) {
            cmap = at; cmap_bytes = count;
        } else if (kind == EXT_GRAPHEMES) {
            t->graphemes = at; t->n_graphemes = count;
        } else {
            if (count % 3) return COLIBRI_E_TOK_FORMAT;
            t->lower = at; t->n_lower = count / 3;
        }
    }
    int nfkc = (t->flags & F_NFKC) != 0, prog = (t->flags & F_NORM_PROG) != 0;
    if (((seen & 1u) != 0) != (unigram != 0) || ((seen & 2u) != 0) != nfkc ||
        ((seen & 4u) != 0) != nfkc || ((seen & 8u) != 0) != prog ||
        ((seen & 16u) && !prog) || ((seen & 32u) != 0) != ((seen & 64u) != 0) ||
        ((seen & 32u) && !prog))
        return COLIBRI_E_TOK_FORMAT;
    int rc = unigram ? check_scores(t) : COLIBRI_OK;
    if (!rc && (seen & 32u)) rc = check_charsmap(t, cmap, cmap_bytes);
    if (!rc && nfkc) rc = check_nfkc(t);
    if (!rc && prog) rc = check_norm(t, prog_at, (seen & 16u) != 0);
    return rc;
}

int colibri_tokenizer_init_from_section(colibri_tokenizer *tk, const void *section,
                                        size_t size)
{
    if (!tk || !section) return COLIBRI_E_ARG;
    memset(tk, 0, sizeof *tk);
    tokp *t = &tk->priv_;
    const uint8_t *s = (const uint8_t *)section;
    if (size < HDR || size > 0xFFFFFFFFu || memcmp(s, "CTOK", 4) != 0)
        return COLIBRI_E_TOK_FORMAT;
    if (s[6] == 0xFF && s[7] == 0xFE) t->be = 0;
    else if (s[6] == 0xFE && s[7] == 0xFF) t->be = 1;
    else return COLIBRI_E_TOK_FORMAT;
    int be = t->be;
    unsigned version = be ? (unsigned)(s[4] << 8 | s[5]) : (unsigned)(s[5] << 8 | s[4]);
    uint32_t h[22];
    for (unsigned i = 0; i < 22; i++) h[i] = ld32(s + 8 + 4 * i, be);
    /* h: model pretok flags n_vocab n_merges n_added unk bos eos off_pieces
     * off_strings n_string_bytes off_id_flags off_sorted n_sorted off_merges
     * off_added off_byte_ids section_size reserved[3] */
    /* Version 1: reserved[3] are 0. Version 2 (pretok 4): reserved[0..1]
     * are off_pretok and n_pretok_words, the Split steps' programs. */
    /* Version 3: reserved[2] is the extension directory (a Unigram model's
     * scores, the NFKC map), flags 10..15. */
    int has_prog = version >= 2 && h[1] == PRETOK_PROGRAM;
    int unigram = h[0] == M_UNIGRAM;
    int needs_ext = unigram || (h[2] & (F_NFKC | F_NORM_PROG));
    if (version < 1 || version > 3 || h[18] != size ||
        (h[0] != M_BYTE_LEVEL && h[0] != M_SENTENCEPIECE && !unigram) ||
        (unigram && version != 3) ||
        h[1] > PRETOK_PROGRAM || (h[1] == PRETOK_PROGRAM && !has_prog) ||
        (h[2] & ~KNOWN_FLAGS) || (!has_prog && (h[19] || h[20])) || (h[21] != 0) != needs_ext ||
        ((h[2] & F_NFC) && version < 2) || ((h[2] & F_NFC) && (h[2] & F_NFKC)) || ((h[2] & ~KNOWN_FLAGS_V2) && version != 3) ||
        h[3] < 1 || h[3] > MAX_VOCAB)
        return COLIBRI_E_TOK_FORMAT;
    uint32_t n = h[3];
    /* Each array inside the section (64-bit arithmetic: no overflow). */
    struct { uint32_t off; uint64_t bytes; } a[7] = {
        { h[9], 4ull * ((uint64_t)n + 1) }, { h[10], h[11] }, { h[12], n },
        { h[13], 4ull * h[14] }, { h[15], 16ull * h[4] }, { h[16], 4ull * h[5] },
        { h[17], 4ull * 256 } };
    for (unsigned i = 0; i < 7; i++)
        if (a[i].off % 4 || a[i].off < HDR || (uint64_t)a[i].off + a[i].bytes > size)
            return COLIBRI_E_TOK_FORMAT;
    t->sec = s; t->size = (uint32_t)size;
    t->model = (uint8_t)h[0]; t->pretok = (uint8_t)h[1]; t->flags = h[2];
    t->n_vocab = n; t->n_merges = h[4]; t->n_added = h[5]; t->n_sorted = h[14];
    t->unk_id = (int32_t)h[6]; t->bos_id = (int32_t)h[7]; t->eos_id = (int32_t)h[8];
    t->piece_off = s + h[9]; t->strings = s + h[10]; t->id_flags = s + h[12];
    t->sorted = s + h[13]; t->merges = s + h[15]; t->added = s + h[16];
    t->byte_ids = s + h[17];
#ifdef COLIBRI_NO_TOK_NORM
    if (h[2] & (F_NFC | F_NFKC)) return COLIBRI_E_UNSUPPORTED;   /* built without NFC tables */
#endif
    if (has_prog) {
        if (h[19] % 4 || h[19] < HDR || (uint64_t)h[19] + 4ull * h[20] > size)
            return COLIBRI_E_TOK_FORMAT;
        t->pretok_prog = s + h[19];
        t->n_pretok_words = h[20];
        int rc = check_pretok(t);
        if (rc) return rc;
    }
    if (ld32(t->piece_off, be) != 0 || ld32(t->piece_off + 4u * n, be) != h[11])
        return COLIBRI_E_TOK_FORMAT;
    uint32_t n_in_vocab = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t o0 = ld32(t->piece_off + 4u * i, be), o1 = ld32(t->piece_off + 4u * i + 4, be);
        /* o1 <= h[11] before reading: the last offset (== h[11]) is only
         * known to bound them all once every pair has been seen */
        if (o1 < o0 || o1 > h[11]) return COLIBRI_E_TOK_FORMAT;
        uint8_t f = t->id_flags[i];
        if (f & ~0x0Fu || !valid_utf8(t->strings + o0, o1 - o0)) return COLIBRI_E_TOK_FORMAT;
        if (f & ID_BYTE) { /* decoding reads the two hex digits of <0xNN> */
            const uint8_t *p = t->strings + o0;
            if (o1 - o0 != 6 || memcmp(p, "<0x", 3) || !is_hex(p[3]) || !is_hex(p[4]) || p[5] != '>')
                return COLIBRI_E_TOK_FORMAT;
        }
        n_in_vocab += (f & ID_IN_VOCAB) != 0;
    }
    if (n_in_vocab != t->n_sorted) return COLIBRI_E_TOK_FORMAT;
    /* Sorted strictly (binary search is then exact), only vocabulary ids. */
    for (uint32_t i = 0; i < t->n_sorted; i++) {
        uint32_t id = ld32(t->sorted + 4u * i, be);
        if (id >= n || !(t->id_flags[id] & ID_IN_VOCAB)) return COLIBRI_E_TOK_FORMAT;
        if (i) {
            uint32_t pl, ql, prev = ld32(t->sorted + 4u * (i - 1), be);
            const uint8_t *p = piece(t, prev, &pl), *q = piece(t, id, &ql);
            if (memcmp_len(p, pl, q, ql) >= 0) return COLIBRI_E_TOK_FORMAT;
        }
    }
    for (uint32_t i = 0; i < t->n_merges; i++) {
        const uint8_t *e = t->merges + 16u * i;
        uint32_t l = ld32(e, be), r = ld32(e + 4, be), res = ld32(e + 8, be), rank = ld32(e + 12, be);
        if (l >= n || r >= n || res >= n || rank >= t->n_merges) return COLIBRI_E_TOK_FORMAT;
        if (i) {
            uint32_t pl = ld32(e - 16, be), pr = ld32(e - 12, be);
            if (pl > l || (pl == l && pr >= r)) return COLIBRI_E_TOK_FORMAT;
        }
    }
    for (uint32_t i = 0; i < t->n_added; i++) {
        uint32_t id = ld32(t->added + 4u * i, be), pl;
        if (id >= n || !(t->id_flags[id] & ID_ADDED)) return COLIBRI_E_TOK_FORMAT;
        (void)piece(t, id, &pl);
        if (!pl) return COLIBRI_E_TOK_FORMAT;
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t id = ld32(t->byte_ids + 4u * b, be);
        if (id != NO_ID && id >= n) return COLIBRI_E_TOK_FORMAT;
    }
    if (t->unk_id < -1 || t->unk_id >= (int32_t)n || t->bos_id < -1 ||
        t->bos_id >= (int32_t)n || t->eos_id < -1 || t->eos_id >= (int32_t)n)
        return COLIBRI_E_TOK_FORMAT;
    if (needs_ext) {
        int rc = check_extensions(t, h[21], unigram);
        if (rc) return rc;
    }
    t->ok = 1;
    return COLIBRI_OK;
}

int colibri_tokenizer_init(colibri_tokenizer *tk, const colibri_model *m)
{
    if (!tk || !m) return COLIBRI_E_ARG;
    memset(tk, 0, sizeof *tk);
    colibri_info info;
    int rc = colibri_get_info(m, &info);
    if (rc) return rc;
    /* The header and table were validated (and every section CRC checked)
     * by colibri_init; they are in the file's byte order, never swapped. */
    const uint8_t *b = m->priv_.blob;
    int be = b[6] == 0xFE;
    uint32_t nt = ld32(b + 48, be);
    for (uint32_t i = nt; i-- > 0;) {
        const uint8_t *e = b + 64 + 40u * i;
        unsigned kind = be ? (unsigned)(e[0] << 8 | e[1]) : (unsigned)(e[1] << 8 | e[0]);
        if (kind != KIND_TOKENIZER) continue;
        uint64_t off = (uint64_t)ld32(e + 16, be) | (uint64_t)ld32(e + 20, be) << 32;
        uint64_t sz = (uint64_t)ld32(e + 24, be) | (uint64_t)ld32(e + 28, be) << 32;
        if (be) { /* rd64 of the big-endian file: high word first */
            off = (uint64_t)ld32(e + 16, be) << 32 | ld32(e + 20, be);
            sz = (uint64_t)ld32(e + 24, be) << 32 | ld32(e + 28, be);
        }
        if (off > m->priv_.blob_size || sz > m->priv_.blob_size - off)
            return COLIBRI_E_TOK_FORMAT;
        return colibri_tokenizer_init_from_section(tk, b + off, (size_t)sz);
    }
    return COLIBRI_E_TOK_NONE;
}

int colibri_tokenizer_get_info(const colibri_tokenizer *tk, colibri_tokenizer_info *o)
{
    if (!tk || !o || !tk->priv_.ok) return COLIBRI_E_ARG;
    const tokp *t = &tk->priv_;
    o->n_vocab = t->n_vocab; o->bos_id = t->bos_id; o->eos_id = t->eos_id;
    o->model = t->model; o->pretok = t->pretok;
    o->template_bos = (t->flags & F_TEMPLATE_BOS) != 0;
    o->template_eos = (t->flags & F_TEMPLATE_EOS) != 0;
    return COLIBRI_OK;
}

/* ---- a text run as code points ----------------------------------------
 * A run is raw text [p, p+n) with an optional virtual leading character
 * (byte-level ADD_PREFIX_SPACE's space). Positions: 0 .. n + virt; position
 * 0 is the virtual character when there is one. */
/* bytes: the run is read in ByteLevel's byte alphabet (a character a byte,
 * byte_char), as pre-tokenizer steps after a ByteLevel see it (the run is
 * then valid UTF-8: emit_run makes it so). */
typedef struct { const uint8_t *p; size_t n; int virt; uint32_t vcp; int bytes; } run_t;

static size_t run_end(const run_t *r) { return r->n + (size_t)r->virt; }

static uint32_t cp_at(const run_t *r, size_t pos, size_t *next)
{
    if (r->virt && pos == 0) {
        *next = 1;
        return r->bytes ? byte_char((uint8_t)r->vcp) : r->vcp;
    }
    size_t o = pos - (size_t)r->virt;
    if (r->bytes) { *next = pos + 1; return byte_char(r->p[o]); }
    uint32_t cp; int bad;
    *next = pos + u8_next(r->p + o, r->n - o, &cp, &bad);
    return cp;
}

/* ---- the pre-tokenizer regexes, matched by hand -------------------------
 * Each returns the end of the match the regex's leftmost alternative gives
 * at i (every character is matched by some alternative). */
static size_t contraction(const run_t *r, size_t i, int fold)
{
    static const char *const cs[7] = { "s", "t", "re", "ve", "m", "ll", "d" };
    size_t end = run_end(r), j;
    if (cp_at(r, i, &j) != '\'') return 0;
    for (unsigned k = 0; k < 7; k++) {
        size_t q = j;
        const char *c = cs[k];
        for (; *c && q < end; c++) {
            size_t nq;
            uint32_t ch = cp_at(r, q, &nq);
            if (fold) {
                if (ch == 0x17F) ch = 's';            /* LONG S folds to s */
                else if (ch >= 'A' && ch <= 'Z') ch += 32;
            }
            if (ch != (uint32_t)(unsigned char)*c) break;
            q = nq;
        }
        if (!*c) return q;
    }
    return 0;
}

/* \s+(?!\S)|\s+ at i (a whitespace character): the run, less its last
 * character when that is followed by a non-space and the run is longer
 * than one. */
static size_t ws_tail(const run_t *r, size_t i)
{
    size_t end = run_end(r), j = i, prev = i, next, count = 0;
    while (j < end && is_S(cp_at(r, j, &next))) { prev = j; j = next; count++; }
    return (j == end || count == 1) ? j : prev;
}

typedef int (*cls_fn)(uint32_t);

static size_t span(const run_t *r, size_t j, cls_fn f)
{
    size_t end = run_end(r), next;
    while (j < end && f(cp_at(r, j, &next))) j = next;
    return j;
}

static size_t match_gpt2(const run_t *r, size_t i)
{
    size_t e = contraction(r, i, 0), end = run_end(r), i1, k, k1;
    if (e) return e;
    uint32_t c = cp_at(r, i, &i1);
    k = (c == ' ' && i1 < end) ? i1 : i;
    uint32_t ck = cp_at(r, k, &k1);
    if (is_L(ck)) return span(r, k1, is_L);
    if (is_N(ck)) return span(r, k1, is_N);
    if (is_other(ck)) return span(r, k1, is_other);
    return ws_tail(r, i);
}

static size_t match_qwen(const run_t *r, size_t i, unsigned digits)
{
    size_t e = contraction(r, i, 1), end = run_end(r), i1, k, k1, next;
    if (e) return e;
    uint32_t c = cp_at(r, i, &i1);
    k = i;
    if (c != '\r' && c != '\n' && !is_L(c) && !is_N(c) && i1 < end && is_L(cp_at(r, i1, &next)))
        k = i1;
    uint32_t ck = cp_at(r, k, &k1);
    if (is_L(ck)) return span(r, k1, is_L);
    if (is_N(c)) {
        size_t j = i1;
        unsigned cnt = 1;
        while (j < end && cnt < digits && is_N(cp_at(r, j, &next))) { j = next; cnt++; }
        return j;
    }
    k = (c == ' ' && i1 < end) ? i1 : i;
    ck = cp_at(r, k, &k1);
    if (is_other(ck)) {
        size_t j = span(r, k1, is_other);
        while (j < end) {
            uint32_t d = cp_at(r, j, &next);
            if (d != '\r' && d != '\n') break;
            j = next;
        }
        return j;
    }
    /* \s*[\r\n]+ : through the last \r or \n of the whitespace run */
    size_t j = i, last = 0;
    while (j < end) {
        uint32_t d = cp_at(r, j, &next);
        if (!is_S(d)) break;
        if (d == '\r' || d == '\n') last = next;
        j = next;
    }
    if (last) return last;
    return ws_tail(r, i);
}

/* ---- the regex matcher (colibri/text/tokregex.py match_at, step for step) ---- */

/* The position before pos (> lo) in the run: UTF-8 read backwards as u8_next
 * reads it forwards. A byte that is not a continuation byte always starts a
 * code point (or a U+FFFD subpart), so decoding forward from the nearest such
 * byte (at most 4 back), or from the piece start lo, finds the boundary; four
 * continuation bytes in a row end with a lone one. */
static size_t prev_pos(const run_t *r, size_t lo, size_t pos)
{
    size_t v = (size_t)r->virt;
    if (pos == v) return 0;              /* the virtual character */
    if (r->bytes) return pos - 1;
    size_t o = pos - v, lob = lo > v ? lo - v : 0, q = o - 1;
    unsigned k = 1;
    while (q > lob && k < 4 && (r->p[q] & 0xC0u) == 0x80u) { q--; k++; }
    if (q > lob && (r->p[q] & 0xC0u) == 0x80u) return pos - 1;
    size_t last = q;
    while (q < o) {
        uint32_t cp; int bad;
        last = q;
        q += u8_next(r->p + q, r->n - q, &cp, &bad);
    }
    return last + v;
}

static int is_word_cp(uint32_t c)   /* L M Nd Pc (\b; not emitted by the compiler) */
{
    return gc_in(0x13FEu, c);
}

static int item_match(uint32_t a, uint32_t b, uint32_t cp)
{
    int r;
    if (!(a & ITEM_PROP)) {
        r = (a & ~ITEM_NEG) <= cp && cp <= b;
    } else {
        switch (a & 0xFFu) {
        case 0: r = gc_in(b, cp); break;
        case 1: r = is_S(cp); break;
        case 2: r = is_word_cp(cp); break;
        default: r = cp != '\n'; break;
        }
    }
    return r != ((a & ITEM_NEG) != 0);
}

/* The CHAR or CLASS instruction at pc against cp. */
static int one_match(prog_t g, uint32_t pc, uint32_t cp)
{
    uint32_t w = PW(g, pc);
    if ((w & 0xFFu) == OP_CHAR) return (w >> 8) == cp;
    uint32_t flags = w >> 8 & 0xFFu, n = w >> 16, k;
    int any = 0;
    for (k = 0; k < n; k++) {
        int m = item_match(PW(g, pc + 1 + 2 * k), PW(g, pc + 2 + 2 * k), cp);
        if ((flags & CL_AND) ? !m : m) break;
    }
    any = (flags & CL_AND) ? k == n : k < n;
    return any != ((flags & CL_NEG) != 0);
}

static uint32_t one_len(prog_t g, uint32_t pc)
{
    uint32_t w = PW(g, pc);
    return (w & 0xFFu) == OP_CHAR ? 1u : 1u + 2u * (w >> 16);
}

static int rx_assert(const run_t *r, uint32_t kind, size_t lo, size_t hi, size_t i)
{
    size_t nx;
    switch (kind) {
    case A_BOL: return i == lo || cp_at(r, prev_pos(r, lo, i), &nx) == '\n';
    case A_EOL: return i == hi || cp_at(r, i, &nx) == '\n';
    case A_BOS: return i == lo;
    case A_EOS: return i == hi;
    case A_EOSNL:
        if (i == hi) return 1;
        return cp_at(r, i, &nx) == '\n' && nx == hi;
    default: {
        int before = i > lo && is_word_cp(cp_at(r, prev_pos(r, lo, i), &nx));
        int after = i < hi && is_word_cp(cp_at(r, i, &nx));
        return (before != after) == (kind == A_WORDB);
    }
    }
}

enum { E_ALT, E_GREEDY, E_LAZY, E_LOOK };
typedef struct { size_t pos, aux; uint32_t kind, pc; } rx_ent;

/* End of the match of program g at i within the piece [lo, hi) of r; -1 no
 * match; -2 the backtrack stack is full. */
static long long rx_match(prog_t g, const run_t *r, size_t lo, size_t hi, size_t i)
{
    rx_ent st[COLIBRI_TOK_RX_STACK];
    unsigned sp = 0;
    uint32_t pc = 0;
    size_t pos = i, nx;
#define PUSH(K, PC, POS, AUX) do { if (sp == COLIBRI_TOK_RX_STACK) return -2; \
        st[sp].kind = (K); st[sp].pc = (PC); st[sp].pos = (POS); st[sp].aux = (AUX); sp++; } while (0)
    for (;;) {
        uint32_t w = PW(g, pc), op = w & 0xFFu;
        int ok = 1;
        switch (op) {
        case OP_CHAR: case OP_CLASS:
            if (pos < hi && one_match(g, pc, cp_at(r, pos, &nx))) { pos = nx; pc += one_len(g, pc); }
            else ok = 0;
            break;
        case OP_SPAN: {
            uint32_t mn = PW(g, pc + 1), mx = PW(g, pc + 2), item = pc + 3, k = 0;
            uint32_t next = item + one_len(g, item);
            while (k < mn && pos < hi && one_match(g, item, cp_at(r, pos, &nx))) { pos = nx; k++; }
            if (k < mn) { ok = 0; break; }
            if (w >> 8 & 1u) {       /* greedy: all it can, then give back */
                size_t start = pos;
                while (k < mx && pos < hi && one_match(g, item, cp_at(r, pos, &nx))) { pos = nx; k++; }
                if (pos > start) PUSH(E_GREEDY, pc, pos, start);
            } else if (k < mx) {
                PUSH(E_LAZY, pc, pos, k);
            }
            pc = next;
            break;
        }
        case OP_SPLIT: PUSH(E_ALT, PW(g, pc + 2), pos, 0); pc = PW(g, pc + 1); break;
        case OP_JMP: pc = PW(g, pc + 1); break;
        case OP_LOOK: PUSH(E_LOOK, pc, pos, 0); pc += 2; break;
        case OP_LOOKEND:
            while (sp && st[sp - 1].kind != E_LOOK) sp--;
            if (!sp) return -1;          /* a LOOKEND outside a look-ahead */
            sp--;
            if (PW(g, st[sp].pc) >> 8 & 1u) ok = 0;   /* (?!...) matched */
            else { pos = st[sp].pos; pc = PW(g, st[sp].pc + 1); }
            break;
        case OP_ASSERT:
            if (rx_assert(r, w >> 8, lo, hi, pos)) pc++; else ok = 0;
            break;
        default: /* OP_MATCH (check_prog allows nothing else) */
            return (long long)pos;
        }
        if (ok) continue;
        for (;;) {                      /* backtrack */
            if (!sp) return -1;
            rx_ent e = st[--sp];
            if (e.kind == E_ALT) { pc = e.pc; pos = e.pos; break; }
            if (e.kind == E_GREEDY) {
                pos = prev_pos(r, lo, e.pos);
                if (pos > e.aux) PUSH(E_GREEDY, e.pc, pos, e.aux);
                pc = e.pc + 3 + one_len(g, e.pc + 3);
                break;
            }
            if (e.kind == E_LAZY) {
                uint32_t item = e.pc + 3;
                if (e.pos < hi && one_match(g, item, cp_at(r, e.pos, &nx))) {
                    if (e.aux + 1 < PW(g, e.pc + 2)) PUSH(E_LAZY, e.pc, nx, e.aux + 1);
                    pc = item + one_len(g, item);
                    pos = nx;
                    break;
                }
                continue;
            }
            if (PW(g, e.pc) >> 8 & 1u) { pc = PW(g, e.pc + 1); pos = e.pos; break; }
        }
    }
#undef PUSH
}

/* ---- BPE over one word ------------------------------------------------- */

/* A word: a run range [a, b) whose characters the BPE model sees as:
 * byte-level, one alphabet character per UTF-8 byte of the (U+FFFD-replaced)
 * text; SentencePiece, each code point with ' ' read as ▁ (and the run's
 * virtual ▁). */
typedef struct {
    const tokp *t;
    const run_t *r;
    size_t pos, b;
    uint8_t q[4];      /* byte-level: bytes of the current code point */
    unsigned nq, iq;
} word_it;

/* The next BPE character's UTF-8 in c[0..]; returns its length, 0 at the
 * end; *byte = the raw byte (byte-level) for the byte_ids fast path. */
static unsigned wnext(word_it *w, uint8_t c[4], int *byte)
{
    *byte = -1;
    if (w->t->model == M_BYTE_LEVEL) {
        if (w->r->bytes) {               /* the run's own bytes */
            if (w->pos >= w->b) return 0;
            uint8_t by = w->r->virt && w->pos == 0 ? (uint8_t)w->r->vcp
                                                    : w->r->p[w->pos - (size_t)w->r->virt];
            w->pos++;
            *byte = by;
            return (unsigned)u8_put(byte_char(by), c);
        }
        if (w->iq == w->nq) {
            if (w->pos >= w->b) return 0;
            size_t next;
            uint32_t cp = cp_at(w->r, w->pos, &next);
            w->pos = next;
            w->nq = (unsigned)u8_put(cp, w->q);
            w->iq = 0;
        }
        uint8_t by = w->q[w->iq++];
        *byte = by;
        return (unsigned)u8_put(byte_char(by), c);
    }
    if (w->pos >= w->b) return 0;
    size_t next;
    uint32_t cp = cp_at(w->r, w->pos, &next);
    w->pos = next;
    return (unsigned)u8_put(cp == ' ' ? 0x2581 : cp, c);
}

/* Whole-word lookup (IGNORE_MERGES): compares the pieces with the word's
 * characters as they are produced. */
static int cmp_word(const tokp *t, const run_t *r, size_t a, size_t b, const uint8_t *p,
                    uint32_t pl)
{
    word_it w = { t, r, a, b, {0}, 0, 0 };
    uint8_t c[4];
    int byte;
    uint32_t i = 0;
    unsigned k;
    while ((k = wnext(&w, c, &byte)) != 0) {
        for (unsigned j = 0; j < k; j++, i++) {
            if (i == pl) return -1;     /* piece shorter */
            if (p[i] != c[j]) return p[i] < c[j] ? -1 : 1;
        }
    }
    return i == pl ? 0 : 1;
}

static uint32_t lookup_word(const tokp *t, const run_t *r, size_t a, size_t b)
{
    uint32_t lo = 0, hi = t->n_sorted;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, id = ld32(t->sorted + 4u * mid, t->be), pl;
        const uint8_t *p = piece(t, id, &pl);
        int c = cmp_word(t, r, a, b, p, pl);
        if (c == 0) return id;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NO_ID;
}

/* The word's initial symbols (tokenizers' BPE::merge_word before merging):
 * writes the first `cap` to dst, returns how many there are. */
static size_t initial_symbols(const tokp *t, const run_t *r, size_t a, size_t b,
                              int32_t *dst, size_t cap)
{
    word_it w = { t, r, a, b, {0}, 0, 0 };
    uint8_t c[4];
    int byte, unk = 0;
    size_t k = 0;
    unsigned len;
#define PUSH(v) do { if (k < cap) dst[k] = (int32_t)(v); k++; } while (0)
    while ((len = wnext(&w, c, &byte)) != 0) {
        uint32_t id = byte >= 0 ? ld32(t->byte_ids + 4u * (unsigned)byte, t->be)
                                : lookup(t, c, len);
        if (id != NO_ID) {
            if (unk) { PUSH(t->unk_id); unk = 0; }
            PUSH(id);
            continue;
        }
        if (t->flags & F_BYTE_FALLBACK) {
            uint32_t bid[4];
            unsigned j = 0;
            for (; j < len; j++) {
                static const char hex[] = "0123456789ABCDEF";
                uint8_t s[6] = { '<', '0', 'x', (uint8_t)hex[c[j] >> 4],
                                 (uint8_t)hex[c[j] & 15], '>' };
                if ((bid[j] = lookup(t, s, 6)) == NO_ID) break;
            }
            if (j == len) {   /* a pending unk stays pending, as in tokenizers */
                for (j = 0; j < len; j++) PUSH(bid[j]);
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk && !(t->flags & F_FUSE_UNK)) PUSH(t->unk_id);
            unk = 1;
        }
    }
    if (unk) PUSH(t->unk_id);
#undef PUSH
    return k;
}

/* Word::merge_all: repeatedly the adjacent pair of lowest rank, leftmost on
 * ties, becomes its result. In place; returns the new length.
 *
 * Cost: one scan finds the lowest rank R and its leftmost pair (L, R'); then
 * one sweep merges that occurrence and every later non-overlapping one,
 * compacting as it goes. That is the order tokenizers' priority queue
 * (rank, position) merges in, because every other pair outranks R: a pair
 * the sweep creates is checked, and one that does not outrank R (possible
 * only in a hand-made merge list whose results appear in earlier merges)
 * stops the merging until the next scan. So a word of k symbols costs
 * O(k log merges) per distinct rank applied, not per merge: a 64 KiB word of
 * random letters went from 7.4 s to milliseconds (tests/test_tokenizer_c.py
 * test_c_long_hostile_words_equal_tokenizers). No memory beyond the word. */
static size_t merge_all(const tokp *t, int32_t *s, size_t k)
{
    while (k >= 2) {
        uint32_t best = UINT32_MAX, best_res = 0, res;
        size_t at = 0;
        for (size_t p = 0; p + 1 < k; p++) {
            uint32_t rank = merge_rank(t, (uint32_t)s[p], (uint32_t)s[p + 1], &res);
            if (rank < best) { best = rank; best_res = res; at = p; }
        }
        if (best == UINT32_MAX) break;
        const int32_t l = s[at], r = s[at + 1];
        size_t w = at, i = at;   /* write and read positions */
        int merging = 1;
        while (i < k) {
            if (merging && i + 1 < k && s[i] == l && s[i + 1] == r) {
                s[w] = (int32_t)best_res;
                i += 2;
                /* The pairs this merge creates must outrank R to go on. */
                if ((w > 0 && merge_rank(t, (uint32_t)s[w - 1], best_res, &res) <= best)
                    || (i < k && merge_rank(t, best_res, (uint32_t)s[i], &res) <= best))
                    merging = 0;
                w++;
            } else {
                s[w++] = s[i++];
            }
        }
        k = w;
    }
    return k;
}

typedef struct {
    int32_t *ids;
    size_t cap, n;
    int overflow;
    int err;           /* COLIBRI_E_TOK_REGEX: the matcher's stack was full */
} out_t;

static void emit_id(out_t *o, int32_t id)
{
    if (!o->overflow && o->n < o->cap) o->ids[o->n] = id;
    else o->overflow = 1;
    o->n++;
}

/* ---- Unigram over one word (tokenizers' Unigram::encode_optimized) ------
 * best[e]: the highest score of a segmentation of w[0, e) (float64 sums from
 * the left, as tokenizers adds them); back[e]: the length of its last piece
 * (0: e not reached yet). From each character boundary s every vocabulary
 * piece that starts there (a prefix search of the sorted index) offers
 * best[s] + score; a strictly higher offer wins, so the earliest start keeps
 * a tie. A character no one-character piece covers is offered as unknown at
 * min score - 10. best[] is a ring of UNI_RING: no offer reaches further
 * than MAX_UNIGRAM_PIECE bytes ahead. */
#define UNI_RING 256u

/* Within sorted[*lo, *hi), where every piece starts with the k bytes the
 * caller matched: the pieces whose byte k is c (a piece of exactly k bytes
 * sorts first and drops out). */
static void narrow(const tokp *t, uint32_t *lo, uint32_t *hi, uint32_t k, uint8_t c)
{
    uint32_t a = *lo, b = *hi;
    for (int upper = 0; upper < 2; upper++) {   /* first key >= c, then > c */
        uint32_t x = a, y = *hi;
        while (x < y) {
            uint32_t mid = x + (y - x) / 2, pl;
            const uint8_t *p = piece(t, ld32(t->sorted + 4u * mid, t->be), &pl);
            int key = pl > k ? p[k] : -1;
            if (key < (int)c + upper) x = mid + 1; else y = mid;
        }
        if (!upper) a = x; else b = x;
    }
    *lo = a; *hi = b;
}

/* A span of the word as ids: its piece; else (byte fallback) its bytes'
 * <0xNN> pieces when all exist; else unk. */
static void unigram_span(const tokp *t, const uint8_t *w, size_t n, out_t *o)
{
    uint32_t id = lookup(t, w, (uint32_t)n);
    if (id != NO_ID) { emit_id(o, (int32_t)id); return; }
    if (t->flags & F_BYTE_FALLBACK) {
        size_t i = 0;
        while (i < n && ld32(t->byte_ids + 4u * w[i], t->be) != NO_ID) i++;
        if (i == n) {
            for (i = 0; i < n; i++) emit_id(o, (int32_t)ld32(t->byte_ids + 4u * w[i], t->be));
            return;
        }
    }
    emit_id(o, t->unk_id);
}

static void unigram_word(const tokp *t, const run_t *r, size_t a, size_t b, out_t *o)
{
    uint8_t w[COLIBRI_TOK_UNIGRAM_WORD], back[COLIBRI_TOK_UNIGRAM_WORD + 1];
    double best[UNI_RING];
    size_t n = 0;
    word_it it = { t, r, a, b, {0}, 0, 0 };
    uint8_t c[4];
    int byte;
    unsigned len;
    while ((len = wnext(&it, c, &byte)) != 0) {
        if (len > sizeof w - n) { o->err = COLIBRI_E_TOK_WORD; return; }
        memcpy(w + n, c, len);
        n += len;
    }
    memset(back, 0, n + 1);
    memset(best, 0, sizeof best);   /* best[0] = 0; the rest is written before read */
    for (size_t s = 0; s < n;) {
        const double here = best[s % UNI_RING];
        /* w is UTF-8 as wnext wrote it; the bound keeps e <= n regardless. */
        unsigned mb = w[s] < 0xC0 ? 1u : w[s] < 0xE0 ? 2u : w[s] < 0xF0 ? 3u : 4u;
        if (mb > n - s) mb = (unsigned)(n - s);
        int single = 0;
        uint32_t lo = 0, hi = t->n_sorted;
        for (size_t k = 0; s + k < n; k++) {
            narrow(t, &lo, &hi, (uint32_t)k, w[s + k]);
            if (lo == hi) break;
            uint32_t id = ld32(t->sorted + 4u * lo, t->be), pl;
            (void)piece(t, id, &pl);
            if (pl != k + 1) continue;
            const size_t e = s + k + 1;
            const double cand = score_of(t, id) + here;
            if (!back[e] || cand > best[e % UNI_RING]) {
                best[e % UNI_RING] = cand;
                back[e] = (uint8_t)(k + 1);
            }
            single |= k + 1 == mb;
        }
        if (!single) {
            const size_t e = s + mb;
            const double cand = t->unk_score + here;
            if (!back[e] || cand > best[e % UNI_RING]) {
                best[e % UNI_RING] = cand;
                back[e] = (uint8_t)mb;
            }
        }
        s += mb;
    }
    /* The way back, turned around in place: back[] of each boundary on the
     * best path becomes the length of the piece that starts there. */
    uint8_t fwd = 0;
    for (size_t e = n; e > 0;) {
        uint8_t l = back[e];
        back[e] = fwd;
        fwd = l;
        e -= l;
    }
    back[0] = fwd;
    /* tokenizers fuses consecutive unknown spans (an id equal to unk's,
     * which includes a "<unk>" piece matched in the text) into one. */
    size_t unk_from = SIZE_MAX;
    for (size_t p = 0; p < n; p += back[p]) {
        uint32_t id = lookup(t, w + p, back[p]);
        if (id == NO_ID || (int32_t)id == t->unk_id) {
            if (unk_from == SIZE_MAX) unk_from = p;
            continue;
        }
        if (unk_from != SIZE_MAX) { unigram_span(t, w + unk_from, p - unk_from, o); unk_from = SIZE_MAX; }
        emit_id(o, (int32_t)id);
    }
    if (unk_from != SIZE_MAX) unigram_span(t, w + unk_from, n - unk_from, o);
}

static void emit_word(const tokp *t, const run_t *r, size_t a, size_t b, out_t *o)
{
    if (a >= b) return;
    if (t->model == M_UNIGRAM) { unigram_word(t, r, a, b, o); return; }
    if (t->flags & F_IGNORE_MERGES) {
        uint32_t id = lookup_word(t, r, a, b);
        if (id != NO_ID) { emit_id(o, (int32_t)id); return; }
    }
    /* In the output buffer when the initial symbols fit there, else in the
     * stack scratch; a word too long for both counts its initial symbols
     * (an upper bound of its ids, reported as such). */
    if (!o->overflow) {
        size_t room = o->cap - o->n;
        size_t k = initial_symbols(t, r, a, b, o->ids + o->n, room);
        if (k <= room) { o->n += merge_all(t, o->ids + o->n, k); return; }
    }
    int32_t scratch[COLIBRI_TOK_SCRATCH];
    size_t k = initial_symbols(t, r, a, b, scratch, COLIBRI_TOK_SCRATCH);
    if (k > COLIBRI_TOK_SCRATCH) { o->overflow = 1; o->n += k; return; }
    k = merge_all(t, scratch, k);
    for (size_t i = 0; i < k; i++) emit_id(o, scratch[i]);
}

/* ---- Split steps (tokenizers' NormalizedString::split) ----------------
 * Step k cuts the piece [a, b) into segments (regex matches and the text
 * between them, is_match flipped by `invert`), folds them into pieces by the
 * step's behaviour as they stream by (one pending piece), and hands each
 * piece to step k + 1; after the last step a piece is a word. Recursion
 * depth = number of steps (<= 8). */
typedef struct {
    size_t s, e;
    int have, match;   /* a pending piece; its last segment was a match */
    int prev_match;    /* the previous segment was a match */
} fold_t;

static void split_steps(const tokp *t, const run_t *r, uint32_t k, size_t a, size_t b,
                        out_t *o);

static void piece_out(const tokp *t, const run_t *r, uint32_t k, size_t s, size_t e, out_t *o)
{
    if (s < e) split_steps(t, r, k + 1, s, e, o);
}

static void fold_seg(const tokp *t, const run_t *r, uint32_t k, unsigned beh, fold_t *f,
                     size_t s, size_t e, int m, out_t *o)
{
    switch (beh) {
    case B_ISOLATED: piece_out(t, r, k, s, e, o); break;
    case B_REMOVED: if (!m) piece_out(t, r, k, s, e, o); break;
    case B_CONTIGUOUS:
    case B_MERGED_PREV: {
        int join = beh == B_CONTIGUOUS ? m == f->prev_match : (m && !f->prev_match);
        if (join && f->have) f->e = e;
        else {
            if (f->have) piece_out(t, r, k, f->s, f->e, o);
            f->s = s; f->e = e; f->have = 1;
        }
        break;
    }
    default: /* merged with next: a match takes the non-match after it */
        if (f->have && f->match && !m) {
            piece_out(t, r, k, f->s, e, o);
            f->have = 0;
        } else {
            if (f->have) piece_out(t, r, k, f->s, f->e, o);
            if (m) { f->s = s; f->e = e; f->have = 1; f->match = 1; }
            else piece_out(t, r, k, s, e, o);
        }
        break;
    }
    f->prev_match = m;
}

static void split_steps(const tokp *t, const run_t *r, uint32_t k, size_t a, size_t b,
                        out_t *o)
{
    if (o->err) return;
    if (k == t->n_steps) { emit_word(t, r, a, b, o); return; }
    prog_t blob = { t->pretok_prog, t->be };
    uint32_t mode = PW(blob, 1 + 4 * k);
    prog_t g = { t->pretok_prog + 4u * PW(blob, 2 + 4 * k), t->be };
    run_t rb;
    if ((mode & STEP_BYTES) && !r->bytes) {   /* past the ByteLevel: its alphabet */
        rb = *r;
        rb.bytes = 1;
        r = &rb;
    }
    unsigned beh = mode & 0xFFu;
    int inv = (mode >> 8) & 1;
    fold_t f = { 0, 0, 0, 0, 0 };
    size_t i = a, prev = a, nx;
    while (i < b) {
        long long e = rx_match(g, r, a, b, i);
        if (e == -2) { o->err = COLIBRI_E_TOK_REGEX; return; }
        /* no match, or an empty one (a section's program may match empty;
         * compiled ones never do): go on, as find_iter does */
        if (e <= (long long)i) { (void)cp_at(r, i, &nx); i = nx; continue; }
        if (i > prev) fold_seg(t, r, k, beh, &f, prev, i, inv, o);
        fold_seg(t, r, k, beh, &f, i, (size_t)e, !inv, o);
        prev = i = (size_t)e;
        if (o->err) return;
    }
    if (prev < b) fold_seg(t, r, k, beh, &f, prev, b, inv, o);
    if (f.have) piece_out(t, r, k, f.s, f.e, o);
}

/* ---- NFC (tokenizers' NFC normaliser; tables: scripts/gen_unicode_norm.py) ----
 * A text run is cut into segments at code points nothing composes across (a
 * starter that is not the second of a composition); each segment (at most
 * NORM_SEG code points decomposed) is decomposed, put in canonical order and
 * recomposed on the stack. When every segment comes out as it went in (most
 * text is NFC already) the run is used in place, whatever its length;
 * otherwise its normal form is written to a stack buffer of
 * COLIBRI_TOK_NORM_BUF bytes, and a run whose normal form is longer is
 * COLIBRI_E_TOK_NORM. */
#ifndef COLIBRI_NO_TOK_NORM
#include "unicode_norm.h"
#define NORM_SEG 64u
#define HANGUL_S 0xAC00u
#define HANGUL_L 0x1100u
#define HANGUL_V 0x1161u
#define HANGUL_T 0x11A7u

static unsigned ccc_of(uint32_t cp)
{
    if (cp < 0x300) return 0;
    uint32_t lo = 0, hi = COLIBRI_CCC_N;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, e = colibri_ccc[mid] >> 8;
        if (e == cp) return colibri_ccc[mid] & 0xFFu;
        if (e < cp) lo = mid + 1; else hi = mid;
    }
    return 0;
}

static int no_cut_before(uint32_t cp)
{
    if (cp < 0x300) return 0;
    uint32_t lo = 0, hi = COLIBRI_NOCUT_N;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cp < colibri_nocut[2 * mid]) hi = mid;
        else if (cp > colibri_nocut[2 * mid + 1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Index of cp's canonical decomposition pair, or -1. */
static long decomp_at(uint32_t cp)
{
    if (cp < 0xC0) return -1;
    uint32_t lo = 0, hi = COLIBRI_DECOMP_N;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, e = colibri_decomp[3 * mid];
        if (e == cp) return (long)mid;
        if (e < cp) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* Append cp's full canonical decomposition to d[*n] (0 when it overflows). */
static int decompose(uint32_t cp, uint32_t *d, unsigned *n)
{
    if (cp >= HANGUL_S && cp < HANGUL_S + 11172u) {
        uint32_t s = cp - HANGUL_S, t = s % 28u;
        if (*n + 3 > NORM_SEG) return 0;
        d[(*n)++] = HANGUL_L + s / 588u;
        d[(*n)++] = HANGUL_V + (s % 588u) / 28u;
        if (t) d[(*n)++] = HANGUL_T + t;
        return 1;
    }
    long k = decomp_at(cp);
    if (k < 0) {
        if (*n >= NORM_SEG) return 0;
        d[(*n)++] = cp;
        return 1;
    }
    uint32_t a = colibri_decomp[3 * k + 1], b = colibri_decomp[3 * k + 2];
    if (!decompose(a, d, n)) return 0;      /* depth <= 4 in Unicode's data */
    return b ? decompose(b, d, n) : 1;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + 19u && b >= HANGUL_V && b < HANGUL_V + 21u)
        return HANGUL_S + ((a - HANGUL_L) * 21u + (b - HANGUL_V)) * 28u;
    if (a >= HANGUL_S && a < HANGUL_S + 11172u && (a - HANGUL_S) % 28u == 0 &&
        b > HANGUL_T && b < HANGUL_T + 28u)
        return a + (b - HANGUL_T);
    uint32_t lo = 0, hi = COLIBRI_COMPOSE_N;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, k = colibri_compose[mid];
        uint32_t ea = colibri_decomp[3 * k + 1], eb = colibri_decomp[3 * k + 2];
        if (ea == a && eb == b) return colibri_decomp[3 * k];
        if (ea < a || (ea == a && eb < b)) lo = mid + 1; else hi = mid;
    }
    return 0;
}

/* NFC of d[0..n) in place (canonical order, then UAX #15 composition);
 * returns the new length. */
static unsigned nfc_segment(uint32_t *d, unsigned n)
{
    for (unsigned i = 1; i < n; i++) {           /* stable sort of non-starters */
        unsigned c = ccc_of(d[i]);
        if (!c) continue;
        for (unsigned j = i; j > 0 && ccc_of(d[j - 1]) > c; j--) {
            uint32_t x = d[j]; d[j] = d[j - 1]; d[j - 1] = x;
        }
    }
    if (n < 2) return n;
    unsigned starter = 0, out = 1, last = ccc_of(d[0]) ? 256u : 0u;
    for (unsigned i = 1; i < n; i++) {
        uint32_t ch = d[i];
        unsigned c = ccc_of(ch);
        uint32_t comp = last != 256u ? compose(d[starter], ch) : 0;
        if (comp && (last < c || last == 0) && !(last == 0 && out - 1 != starter)) {
            d[starter] = comp;
            continue;
        }
        if (c == 0) { starter = out; last = 0; }
        else last = c;
        d[out++] = ch;
    }
    return out;
}

typedef struct { uint8_t *buf; size_t cap, n; int same, err; } norm_out;

/* NFKC: the index of cp in the section's map (its NFKD differs from its
 * NFD), or -1. */
static long nfkc_find(const tokp *t, uint32_t cp)
{
    if (!(t->flags & F_NFKC) || cp < 0xA0) return -1;
    uint32_t lo = 0, hi = t->n_nfkc;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t e = ld32(t->nfkc_map + 8u * mid, t->be) & 0x7FFFFFFFu;
        if (e == cp) return (long)mid;
        if (e < cp) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* cp's full decomposition (NFKC: the map's NFKD; else canonical). */
static int decompose_run(const tokp *t, uint32_t cp, uint32_t *d, unsigned *n)
{
    long k = nfkc_find(t, cp);
    if (k < 0) return decompose(cp, d, n);
    uint32_t at = ld32(t->nfkc_map + 8u * (uint32_t)k + 4, t->be), len = at & 31u;
    if (*n + len > NORM_SEG) return 0;
    for (uint32_t j = 0; j < len; j++)
        d[(*n)++] = ld32(t->nfkc_pool + 4u * ((at >> 5) + j), t->be);
    return 1;
}

/* May the text not be cut for normalisation before cp? */
static int no_cut_run(const tokp *t, uint32_t cp)
{
    long k = nfkc_find(t, cp);
    if (k < 0) return no_cut_before(cp);
    return (ld32(t->nfkc_map + 8u * (uint32_t)k, t->be) >> 31) != 0;
}

/* NFC (or NFKC) of the run p[0..n): o->same when it is already normal (use
 * p in place), else its bytes in o->buf (o->err: a segment or the whole
 * too long). */
static void norm_run(const tokp *t, const uint8_t *p, size_t n, norm_out *o)
{
    uint32_t raw[NORM_SEG], d[NORM_SEG];
    size_t i = 0;
    o->n = 0; o->same = 1; o->err = 0;
    while (i < n && !o->err) {
        unsigned nr = 0, nd = 0;
        do {                                     /* one segment */
            uint32_t cp; int bad;
            size_t k = u8_next(p + i, n - i, &cp, &bad);
            if (nr == NORM_SEG || !decompose_run(t, cp, d, &nd)) {
                o->err = COLIBRI_E_TOK_NORM;
                return;
            }
            raw[nr++] = cp;
            i += k;
            if (i < n) {
                uint32_t nx; int b2;
                (void)u8_next(p + i, n - i, &nx, &b2);
                if (!no_cut_run(t, nx)) break;
            }
        } while (i < n);
        nd = nfc_segment(d, nd);
        if (nd != nr || memcmp(d, raw, nd * sizeof *d)) o->same = 0;
        for (unsigned k = 0; k < nd; k++) {
            uint8_t u[4];
            size_t m = u8_put(d[k], u);
            if (o->n + m <= o->cap) memcpy(o->buf + o->n, u, m);
            o->n += m;
        }
    }
    if (!o->same && o->n > o->cap) o->err = COLIBRI_E_TOK_NORM;
}
#endif

/* ---- the normaliser program (FORMAT.md 7.4; colibri/text/normalizer.py) ----
 * Each step reads the run [p, p+n) and, when it changes it, writes the
 * result to the one of two COLIBRI_TOK_NORM_BUF buffers the run is not in.
 * What is written is decoded code points (an invalid sequence as the U+FFFD
 * it reads as), so that text removed between two invalid sequences never
 * joins them into one. */
typedef struct { uint8_t *b; size_t cap, n; int over; } nbuf_t;

static void nb_cp(nbuf_t *o, uint32_t cp)
{
    uint8_t u[4];
    size_t m = u8_put(cp, u);
    if (m > o->cap - o->n) { o->over = 1; return; }
    memcpy(o->b + o->n, u, m);
    o->n += m;
}

static void nb_text(nbuf_t *o, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n && !o->over;) {
        uint32_t cp; int bad;
        i += u8_next(p + i, n - i, &cp, &bad);
        nb_cp(o, cp);
    }
}

static void nb_words(nbuf_t *o, prog_t b, uint32_t at, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++) nb_cp(o, PW(b, at + i));
}

/* The lowercase map's entry of cp (12 bytes), or NULL: it stays itself. */
static const uint8_t *lower_of(const tokp *t, uint32_t cp)
{
    uint32_t lo = 0, hi = t->n_lower;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, c = ld32(t->lower + 12u * mid, t->be);
        if (c == cp) return t->lower + 12u * mid;
        if (c < cp) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* Strip: the run without the White_Space at its ends (arg bit 0 the left,
 * bit 1 the right), in place. */
static void norm_strip(uint32_t arg, const uint8_t **pp, size_t *pn)
{
    const uint8_t *p = *pp;
    size_t n = *pn, a = 0, z = 0, i = 0;
    int lead = (arg & 1u) != 0;
    while (i < n) {
        uint32_t cp; int bad;
        size_t k = u8_next(p + i, n - i, &cp, &bad);
        if (is_S(cp)) { if (lead) a = i + k; }
        else { lead = 0; z = i + k; }
        i += k;
    }
    if (!(arg & 1u)) a = 0;
    if (!(arg & 2u)) z = n;
    *pp = p + a; *pn = z > a ? z - a : 0;
}

/* ---- Precompiled (FORMAT.md 7.5; colibri/text/precompiled.py, grapheme.py)
 * The run cut into extended grapheme clusters (UAX #29 with the section's
 * table); a cluster of fewer than 6 UTF-8 bytes that starts with a key of
 * the map becomes the shortest such key's string, else each of its code
 * points that is a key becomes its string. Keys are matched over the code
 * points' UTF-8 (an invalid sequence as the U+FFFD it reads as). */
static uint32_t gc_props(const tokp *t, uint32_t cp)
{
    uint32_t lo = 0, hi = t->n_graphemes;        /* run 0 starts at U+0000 */
    while (hi - lo > 1u) {
        uint32_t mid = lo + (hi - lo) / 2u;
        if ((ld32(t->graphemes + 4u * mid, t->be) >> 8) <= cp) lo = mid;
        else hi = mid;
    }
    return ld32(t->graphemes + 4u * lo, t->be) & 0xFFu;
}

/* What the text before a code point says of the rules that look back:
 * Regional_Indicators in a row, emoji (1 after ExtPict Extend*, 2 after
 * ExtPict Extend* ZWJ), Indic conjunct (1 after Consonant [Extend
 * Linker]*, 2 once a Linker is among them), and the last code point's
 * props. */
typedef struct { uint32_t ri, emoji, incb, prev; } gc_state;

static int gc_breaks(const gc_state *s, uint32_t cur)
{
    uint32_t p = s->prev & 15u, c = cur & 15u;
    if (p == GC_CR && c == GC_LF) return 0;                                /* GB3 */
    if (p == GC_CONTROL || p == GC_CR || p == GC_LF ||
        c == GC_CONTROL || c == GC_CR || c == GC_LF) return 1;             /* GB4, 5 */
    if ((p == GC_L && (c == GC_L || c == GC_V || c == GC_LV || c == GC_LVT)) ||
        ((p == GC_LV || p == GC_V) && (c == GC_V || c == GC_T)) ||
        ((p == GC_LVT || p == GC_T) && c == GC_T)) return 0;               /* GB6-8 */
    if (c == GC_EXTEND || c == GC_ZWJ || c == GC_SPACING || p == GC_PREPEND)
        return 0;                                                          /* GB9-9b */
    if (s->incb == 2u && (cur >> 5) == INCB_CONSONANT) return 0;           /* GB9c */
    if (p == GC_ZWJ && s->emoji == 2u && (cur & GC_PICT)) return 0;        /* GB11 */
    if (p == GC_RI && c == GC_RI && (s->ri & 1u)) return 0;                /* GB12, 13 */
    return 1;
}

static void gc_advance(gc_state *s, uint32_t cur)
{
    uint32_t c = cur & 15u, incb = cur >> 5;
    s->ri = c == GC_RI ? s->ri + 1u : 0u;
    s->emoji = (cur & GC_PICT) ? 1u : s->emoji == 1u && c == GC_EXTEND ? 1u
             : s->emoji == 1u && c == GC_ZWJ ? 2u : 0u;
    s->incb = incb == INCB_CONSONANT ? 1u : s->incb && incb == INCB_LINKER ? 2u
            : incb == INCB_EXTEND ? s->incb : 0u;
    s->prev = cur;
}

static size_t u8_len(uint32_t cp) { return cp < 0x80u ? 1u : cp < 0x800u ? 2u : cp < 0x10000u ? 3u : 4u; }

/* The end of the cluster that starts at i; *bytes its UTF-8 length. */
static size_t gc_next(const tokp *t, const uint8_t *p, size_t n, size_t i, gc_state *s,
                      size_t *bytes)
{
    uint32_t cp; int bad;
    size_t j = i + u8_next(p + i, n - i, &cp, &bad);
    gc_advance(s, gc_props(t, cp));
    *bytes = u8_len(cp);
    while (j < n) {
        size_t k = u8_next(p + j, n - j, &cp, &bad);
        uint32_t cur = gc_props(t, cp);
        if (gc_breaks(s, cur)) break;
        gc_advance(s, cur);
        *bytes += u8_len(cp);
        j += k;
    }
    return j;
}

static uint32_t pc_unit(const tokp *t, uint32_t i) { return ld32(t->cmap_units + 4u * i, 0); }
static uint32_t pc_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* darts-clone's common-prefix search over the UTF-8 of p[a, b): the offset
 * of the first (shortest) key's string, or -1. */
static long pc_match(const tokp *t, const uint8_t *p, size_t a, size_t b)
{
    uint32_t pos = pc_offset(pc_unit(t, 0)), n = t->n_cmap_units;
    while (a < b) {
        uint32_t cp; int bad;
        uint8_t u[4];
        a += u8_next(p + a, b - a, &cp, &bad);
        size_t m = u8_put(cp, u);
        for (size_t k = 0; k < m; k++) {
            pos ^= u[k];
            if (pos >= n || (pc_unit(t, pos) & 0x800000FFu) != u[k]) return -1;
            uint32_t unit = pc_unit(t, pos);
            pos ^= pc_offset(unit);
            if (pos >= n) return -1;
            if (((unit >> 8) & 1u) && (pc_unit(t, pos) >> 31))
                return (long)(pc_unit(t, pos) & 0x7FFFFFFFu);
        }
    }
    return -1;
}

static void pc_put(const tokp *t, long v, nbuf_t *o)
{
    const uint8_t *s = t->cmap_strings + v;     /* check_charsmap: a NUL follows */
    nb_text(o, s, strlen((const char *)s));
}

static int norm_precompiled(const tokp *t, const uint8_t *p, size_t n, nbuf_t *o)
{
    gc_state s = { 0, 0, 0, 0 };
    size_t i = 0, prev = 0;
    int any = 0;
    while (i < n && !o->over) {
        size_t bytes, end = gc_next(t, p, n, i, &s, &bytes);
        long v = bytes < PC_CLUSTER_BYTES ? pc_match(t, p, i, end) : -1;
        if (v >= 0) {
            nb_text(o, p + prev, i - prev);
            pc_put(t, v, o);
            prev = i = end;
            any = 1;
            continue;
        }
        while (i < end) {                           /* code point by code point */
            uint32_t cp; int bad;
            size_t k = i + u8_next(p + i, end - i, &cp, &bad);
            v = pc_match(t, p, i, k);
            if (v >= 0) {
                nb_text(o, p + prev, i - prev);
                pc_put(t, v, o);
                prev = k;
                any = 1;
            }
            i = k;
        }
    }
    if (!any) return 0;
    nb_text(o, p + prev, n - prev);
    return 1;
}

/* One step that may rewrite: 0 unchanged (nothing to do), 1 written to o,
 * or COLIBRI_E_TOK_REGEX. */
static int norm_rewrite(const tokp *t, prog_t b, uint32_t k, const uint8_t *p, size_t n,
                        nbuf_t *o)
{
    uint32_t mode = PW(b, 1 + 4 * k), off = PW(b, 2 + 4 * k);
    uint32_t np = PW(b, 3 + 4 * k), nc = PW(b, 4 + 4 * k), op = mode & 0xFFu;
    if (op == NORM_PREPEND) {
        if (!n) return 0;
        nb_words(o, b, off, nc);
        nb_text(o, p, n);
        return 1;
    }
    size_t i = 0;
    if (op == NORM_PRECOMPILED) return norm_precompiled(t, p, n, o);
    if (op == NORM_LOWERCASE) {
        for (; i < n;) {               /* the first code point that changes */
            uint32_t cp; int bad;
            size_t m = u8_next(p + i, n - i, &cp, &bad);
            if (lower_of(t, cp)) break;
            i += m;
        }
        if (i == n) return 0;
        nb_text(o, p, i);
        while (i < n && !o->over) {
            uint32_t cp; int bad;
            i += u8_next(p + i, n - i, &cp, &bad);
            const uint8_t *e = lower_of(t, cp);
            if (!e) { nb_cp(o, cp); continue; }
            nb_cp(o, ld32(e + 4, t->be));
            if (ld32(e + 8, t->be)) nb_cp(o, ld32(e + 8, t->be));
        }
        return 1;
    }
    /* Replace: the matches of the pattern, leftmost first, none empty
     * (find_iter), each by the content; the pattern sees the whole run
     * (\A, \z are its ends). */
    prog_t g = { t->norm_prog + 4u * off, t->be };
    run_t r = { p, n, 0, 0, 0 };
    size_t prev = 0, nx;
    int any = 0;
    while (i < n) {
        long long e = rx_match(g, &r, 0, n, i);
        if (e == -2) return COLIBRI_E_TOK_REGEX;
        if (e <= (long long)i) { (void)cp_at(&r, i, &nx); i = nx; continue; }
        nb_text(o, p + prev, i - prev);
        nb_words(o, b, off + np, nc);
        prev = i = (size_t)e;
        any = 1;
    }
    if (!any) return 0;
    nb_text(o, p + prev, n - prev);
    return 1;
}

/* The program over the run *pp, *pn (in bufs[*in], or the caller's text
 * when *in < 0): the normal form, in place or in one of bufs. */
static int norm_program(const tokp *t, const uint8_t **pp, size_t *pn,
                        uint8_t (*bufs)[COLIBRI_TOK_NORM_BUF], int *in)
{
    prog_t b = { t->norm_prog, t->be };
    uint32_t steps = PW(b, 0);
    for (uint32_t k = 0; k < steps; k++) {
        uint32_t mode = PW(b, 1 + 4 * k);
        if ((mode & 0xFFu) == NORM_STRIP) { norm_strip(mode >> 8, pp, pn); continue; }
        int dst = *in == 0 ? 1 : 0;
        nbuf_t o = { bufs[dst], COLIBRI_TOK_NORM_BUF, 0, 0 };
        int rc = norm_rewrite(t, b, k, *pp, *pn, &o);
        if (rc < 0) return rc;
        if (o.over) return COLIBRI_E_TOK_NORM;
        if (rc) { *pp = bufs[dst]; *pn = o.n; *in = dst; }
    }
    return COLIBRI_OK;
}

/* One text run between added tokens: normalise, pre-tokenize, BPE. */
static int is_sp_space(const run_t *r, size_t pos)   /* ' ' or ▁ at pos */
{
    size_t next;
    uint32_t cp = cp_at(r, pos, &next);
    return cp == ' ' || cp == 0x2581;
}

/* SentencePiece / Unigram: spaces are ▁ (wnext), a ▁ is prepended as the
 * normaliser / Metaspace scheme says, and the run is one word, or (Metaspace
 * split) one word from each ▁ to the next. */
static void sp_run(const tokp *t, const uint8_t *p, size_t n, int first, out_t *o)
{
    run_t r = { p, n, 0, 0, 0 };
    int starts_sp = p[0] == ' ' || (n >= 3 && p[0] == 0xE2 && p[1] == 0x96 && p[2] == 0x81);
    if ((t->flags & F_SP_PREPEND) && (first || !(t->flags & F_SP_PREPEND_FIRST)) &&
        !((t->flags & F_SP_PREPEND_UNLESS) && starts_sp)) {
        r.virt = 1; r.vcp = 0x2581;
    }
    size_t end = run_end(&r);
    if (!(t->flags & F_SP_SPLIT)) { emit_word(t, &r, 0, end, o); return; }
    size_t a = 0, pos = 0, next;
    while (pos < end) {
        (void)cp_at(&r, pos, &next);
        if (pos > a && is_sp_space(&r, pos)) { emit_word(t, &r, a, pos, o); a = pos; }
        pos = next;
    }
    emit_word(t, &r, a, end, o);
}

static void emit_run(const tokp *t, const uint8_t *p, size_t n, int first, out_t *o)
{
    uint8_t nbuf[2][COLIBRI_TOK_NORM_BUF];
    int in = -1;                  /* the buffer the normal form is in */
#ifndef COLIBRI_NO_TOK_NORM
    if (t->flags & (F_NFC | F_NFKC)) {
        norm_out no = { nbuf[0], sizeof nbuf[0], 0, 1, 0 };
        norm_run(t, p, n, &no);
        if (no.err) { o->err = no.err; return; }
        if (!no.same) { p = nbuf[0]; n = no.n; in = 0; }
    }
#endif
    if (t->flags & F_NORM_PROG) {
        int rc = norm_program(t, &p, &n, nbuf, &in);
        if (rc) { o->err = rc; return; }
    }
    if (!n) return;
    if (t->pretok == PRETOK_PROGRAM && t->bytes_from < t->n_steps &&
        (n > 0xFFFFFFFFu || !valid_utf8(p, (uint32_t)n))) {
        /* steps over the byte alphabet see the U+FFFD of each invalid
         * sequence as its three bytes, as tokenizers does */
        int dst = in == 0 ? 1 : 0;
        nbuf_t nb = { nbuf[dst], COLIBRI_TOK_NORM_BUF, 0, 0 };
        nb_text(&nb, p, n);
        if (nb.over) { o->err = COLIBRI_E_TOK_NORM; return; }
        p = nbuf[dst]; n = nb.n;
    }
    run_t r = { p, n, 0, 0, 0 };
    if (t->model == M_BYTE_LEVEL) {
        if ((t->flags & F_ADD_PREFIX_SPACE) && p[0] != ' ') { r.virt = 1; r.vcp = ' '; }
        size_t i = 0, end = run_end(&r);
        if (t->pretok == PRETOK_PROGRAM) { split_steps(t, &r, 0, 0, end, o); return; }
        while (i < end) {
            size_t j = t->pretok == 1 ? match_gpt2(&r, i)
                     : t->pretok == 0 ? end
                     : match_qwen(&r, i, t->pretok == 2 ? 1 : 3);
            emit_word(t, &r, i, j, o);
            i = j;
        }
        return;
    }
    if (!(t->flags & F_WS_SPLIT)) { sp_run(t, p, n, first, o); return; }
    /* WhitespaceSplit: each run of non-White_Space is a Metaspace run. */
    for (size_t i = 0; i < n;) {
        uint32_t cp; int bad;
        size_t k = u8_next(p + i, n - i, &cp, &bad), j = i;
        if (is_S(cp)) { i += k; continue; }
        while (j < n && !is_S(cp)) {
            j += k;
            if (j < n) k = u8_next(p + j, n - j, &cp, &bad);
        }
        sp_run(t, p + i, j - i, first, o);
        i = j;
    }
}

int colibri_tokenize(const colibri_tokenizer *tk, const char *text, size_t len,
                     int32_t *ids, size_t cap, size_t *n_ids, unsigned flags)
{
    if (n_ids) *n_ids = 0;
    if (!tk || !tk->priv_.ok || (!text && len) || (!ids && cap) || !n_ids ||
        (flags & ~15u))
        return COLIBRI_E_ARG;
    const tokp *t = &tk->priv_;
    const uint8_t *s = (const uint8_t *)text;
    if (flags & COLIBRI_TOK_STRICT_UTF8) {
        for (size_t i = 0; i < len;) {
            uint32_t cp; int bad;
            size_t k = u8_next(s + i, len - i, &cp, &bad);
            if (bad) { *n_ids = i; return COLIBRI_E_TOK_UTF8; }
            i += k;
        }
    }
    out_t o = { ids, cap, 0, 0, 0 };
    if (flags & COLIBRI_TOK_ADD_BOS) {
        if (t->bos_id < 0) return COLIBRI_E_TOK_NO_BOS;
        emit_id(&o, t->bos_id);
    }
    /* Added tokens, leftmost-longest, at character boundaries of the raw
     * text (their content is valid UTF-8, so a match never starts inside a
     * character or an invalid sequence). */
    size_t start = 0, i = 0;
    int first = 1;
    while (i < len) {
        uint32_t best = NO_ID, best_len = 0;
        for (uint32_t a = 0; a < t->n_added; a++) {
            uint32_t id = ld32(t->added + 4u * a, t->be), pl;
            if ((t->id_flags[id] & ID_SPECIAL) && !(flags & COLIBRI_TOK_PARSE_SPECIAL))
                continue;
            const uint8_t *p = piece(t, id, &pl);
            if (pl > best_len && pl <= len - i && memcmp(s + i, p, pl) == 0) {
                best = id; best_len = pl;
            }
        }
        if (best == NO_ID) {
            uint32_t cp; int bad;
            i += u8_next(s + i, len - i, &cp, &bad);
            continue;
        }
        if (i > start) { emit_run(t, s + start, i - start, first, &o); first = 0; }
        emit_id(&o, (int32_t)best);
        first = 0;
        i += best_len;
        start = i;
    }
    if (start < len) emit_run(t, s + start, len - start, first, &o);
    if (flags & COLIBRI_TOK_ADD_EOS) {
        if (t->eos_id < 0) { *n_ids = 0; return COLIBRI_E_TOK_NO_BOS; }
        emit_id(&o, t->eos_id);
    }
    *n_ids = o.n;
    if (o.err) { *n_ids = 0; return o.err; }
    return o.overflow ? COLIBRI_E_TOK_BUFFER : COLIBRI_OK;
}

/* ---- detokenising ------------------------------------------------------ */

typedef struct { char *o; size_t cap, n; } sink_t;

static void put(sink_t *k, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++, k->n++)
        if (k->n < k->cap) k->o[k->n] = (char)b[i];
}

static const uint8_t FFFD[3] = { 0xEF, 0xBF, 0xBD };

/* Byte-level: bytes through the lossy UTF-8 reader; an incomplete, so far
 * valid sequence stays in hold[] (at most 3 bytes) until it completes or
 * breaks. */
static void bl_byte(colibri_detok *d, uint8_t c, sink_t *k)
{
    for (;;) {
        if (d->n_hold == 0) {
            if (c < 0x80) { put(k, &c, 1); return; }
            if (c >= 0xC2 && c <= 0xF4) { d->hold[0] = c; d->n_hold = 1; return; }
            put(k, FFFD, 3);
            return;
        }
        uint8_t l = d->hold[0], lo = 0x80, hi = 0xBF;
        unsigned need = l < 0xE0 ? 2 : l < 0xF0 ? 3 : 4;
        if (d->n_hold == 1) {
            if (l == 0xE0) lo = 0xA0;
            if (l == 0xED) hi = 0x9F;
            if (l == 0xF0) lo = 0x90;
            if (l == 0xF4) hi = 0x8F;
        }
        if (c >= lo && c <= hi) {
            d->hold[d->n_hold++] = c;
            if (d->n_hold == need) { put(k, d->hold, need); d->n_hold = 0; }
            return;
        }
        put(k, FFFD, 3);     /* the held maximal subpart, then c afresh */
        d->n_hold = 0;
    }
}

/* SentencePiece text, through the one-leading-space strip. */
static void sp_text(colibri_detok *d, const uint8_t *b, size_t n, sink_t *k)
{
    if (!n) return;
    if (!d->started) {
        d->started = 1;
        if ((d->t->priv_.flags & F_SP_STRIP) && b[0] == ' ') { b++; n--; }
    }
    put(k, b, n);
}

/* End of a run of <0xNN> pieces: its bytes if valid UTF-8 as a whole, else
 * one U+FFFD per piece (tokenizers' ByteFallback). */
static void sp_flush(colibri_detok *d, sink_t *k)
{
    if (!d->run) return;
    if (!d->run_bad && valid_utf8(d->hold, d->n_hold)) {
        sp_text(d, d->hold, d->n_hold, k);
    } else {
        for (uint32_t i = 0; i < d->run; i++) sp_text(d, FFFD, 3, k);
    }
    d->run = 0; d->n_hold = 0; d->run_bad = 0;
}

/* Length of buf without a trailing incomplete UTF-8 sequence. */
static unsigned complete_prefix(const uint8_t *b, unsigned n)
{
    for (unsigned back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = b[n - back];
        if (c < 0x80) return n;
        if (c >= 0xC0) {
            unsigned need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            return need > back ? n - back : n;
        }
    }
    return n;
}

static int hexv(uint8_t c) { return c <= '9' ? c - '0' : c - 'A' + 10; }

/* One id into the stream state `d`, text to k. */
static void detok_one(colibri_detok *d, uint32_t id, sink_t *k)
{
    const tokp *t = &d->t->priv_;
    uint8_t f = t->id_flags[id];
    if ((d->flags & COLIBRI_DETOK_SKIP_SPECIAL) && (f & ID_SPECIAL)) return;
    uint32_t pl;
    const uint8_t *p = piece(t, id, &pl);
    if (t->model == M_BYTE_LEVEL) {
        /* All characters in the alphabet: their bytes; else the UTF-8 as is. */
        int mapped = 1;
        for (uint32_t i = 0; i < pl && mapped;) {
            uint32_t cp; int bad;
            i += (uint32_t)u8_next(p + i, pl - i, &cp, &bad);
            mapped = char_byte(cp) >= 0;
        }
        for (uint32_t i = 0; i < pl;) {
            uint32_t cp; int bad;
            size_t step = u8_next(p + i, pl - i, &cp, &bad);
            if (mapped) bl_byte(d, (uint8_t)char_byte(cp), k);
            else for (size_t j = 0; j < step; j++) bl_byte(d, p[i + j], k);
            i += (uint32_t)step;
        }
        return;
    }
    if (t->flags & F_DEC_METASPACE) {
        /* decoders::Metaspace: ▁ is a space, but the first token (after
         * skipped specials) loses every ▁; <0xNN> pieces stay as written. */
        int drop = !d->started && (t->flags & F_DEC_DROP_FIRST);
        d->started = 1;
        for (uint32_t i = 0; i < pl; i++) {
            if (pl - i >= 3 && p[i] == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
                if (!drop) put(k, (const uint8_t *)" ", 1);
                i += 2;
            } else {
                put(k, p + i, 1);
            }
        }
        return;
    }
    if ((f & ID_BYTE) && !(f & ID_ADDED)) {
        uint8_t by = (uint8_t)(hexv(p[3]) << 4 | hexv(p[4]));
        if (d->n_hold < COLIBRI_DETOK_HOLD) d->hold[d->n_hold++] = by;
        else {
            /* Longer than we can hold: the complete characters held are
             * taken as final when valid so far (the documented divergence:
             * tokenizers would turn them into U+FFFD if the run later
             * breaks); an incomplete tail stays held. */
            unsigned cut = complete_prefix(d->hold, d->n_hold);
            if (!d->run_bad && cut && valid_utf8(d->hold, cut)) {
                sp_text(d, d->hold, cut, k);
                memmove(d->hold, d->hold + cut, d->n_hold - cut);
                d->n_hold = (uint16_t)(d->n_hold - cut);
                d->run = d->n_hold;
            } else {
                d->run_bad = 1;   /* all U+FFFD: only the count matters */
                d->n_hold = 0;
            }
            d->hold[d->n_hold++] = by;
        }
        d->run++;
        return;
    }
    sp_flush(d, k);
    /* ▁ -> space; pieces are valid UTF-8 (checked at init). */
    for (uint32_t i = 0; i < pl;) {
        if (pl - i >= 3 && p[i] == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
            sp_text(d, (const uint8_t *)" ", 1, k);
            i += 3;
        } else {
            uint32_t j = i + 1;
            while (j < pl && !(pl - j >= 3 && p[j] == 0xE2 && p[j + 1] == 0x96 && p[j + 2] == 0x81))
                j++;
            sp_text(d, p + i, j - i, k);
            i = j;
        }
    }
}

void colibri_detok_init(colibri_detok *d, const colibri_tokenizer *t, unsigned flags)
{
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->t = t;
    d->flags = flags;
}

int colibri_detok_push(colibri_detok *d, int32_t id, char *out, size_t cap, size_t *n_out)
{
    if (n_out) *n_out = 0;
    if (!d || !d->t || !d->t->priv_.ok || (!out && cap) || !n_out) return COLIBRI_E_ARG;
    if (id < 0 || (uint32_t)id >= d->t->priv_.n_vocab) return COLIBRI_E_TOKEN;
    colibri_detok next = *d;      /* committed only when the output fits */
    sink_t k = { out, cap, 0 };
    detok_one(&next, (uint32_t)id, &k);
    *n_out = k.n;
    if (k.n > cap) return COLIBRI_E_TOK_BUFFER;
    *d = next;
    return COLIBRI_OK;
}

int colibri_detok_finish(colibri_detok *d, char *out, size_t cap, size_t *n_out)
{
    if (n_out) *n_out = 0;
    if (!d || !d->t || !d->t->priv_.ok || (!out && cap) || !n_out) return COLIBRI_E_ARG;
    colibri_detok next = *d;
    sink_t k = { out, cap, 0 };
    if (next.t->priv_.model == M_BYTE_LEVEL) {
        if (next.n_hold) put(&k, FFFD, 3);
        next.n_hold = 0;
    } else {
        sp_flush(&next, &k);
    }
    *n_out = k.n;
    if (k.n > cap) return COLIBRI_E_TOK_BUFFER;
    *d = next;
    return COLIBRI_OK;
}

int colibri_detokenize(const colibri_tokenizer *t, const int32_t *ids, size_t n, char *out,
                       size_t cap, size_t *n_out, unsigned flags)
{
    if (n_out) *n_out = 0;
    if (!t || !t->priv_.ok || (!ids && n) || (!out && cap) || !n_out) return COLIBRI_E_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->priv_.n_vocab) return COLIBRI_E_TOKEN;
    colibri_detok d;
    colibri_detok_init(&d, t, flags);
    sink_t k = { out, cap, 0 };
    const tokp *p = &t->priv_;
    for (size_t i = 0; i < n; i++) {
        uint8_t f = p->id_flags[ids[i]];
        if (p->model != M_BYTE_LEVEL && !(p->flags & F_DEC_METASPACE) && (f & ID_BYTE) &&
            !(f & ID_ADDED)) {
            /* Exact ByteFallback: judge the whole run of byte pieces (a
             * skipped special does not end it) before writing any of it. */
            size_t j = i, cnt = 0;
            unsigned rem = 0;
            uint8_t lo = 0x80, hi = 0xBF;
            int ok = 1;
            for (; j < n; j++) {
                uint8_t g = p->id_flags[ids[j]];
                if ((flags & COLIBRI_DETOK_SKIP_SPECIAL) && (g & ID_SPECIAL)) continue;
                if (!(g & ID_BYTE) || (g & ID_ADDED)) break;
                uint32_t pl;
                const uint8_t *pc = piece(p, (uint32_t)ids[j], &pl);
                uint8_t c = (uint8_t)(hexv(pc[3]) << 4 | hexv(pc[4]));
                cnt++;
                if (!ok) continue;
                if (rem == 0) {
                    lo = 0x80; hi = 0xBF;
                    if (c < 0x80) continue;
                    else if (c >= 0xC2 && c <= 0xDF) rem = 1;
                    else if (c >= 0xE0 && c <= 0xEF) {
                        rem = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F;
                    } else if (c >= 0xF0 && c <= 0xF4) {
                        rem = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F;
                    } else ok = 0;
                } else if (c >= lo && c <= hi) {
                    rem--; lo = 0x80; hi = 0xBF;
                } else ok = 0;
            }
            if (rem) ok = 0;
            for (size_t m = i; m < j; m++) {
                uint8_t g = p->id_flags[ids[m]];
                if ((flags & COLIBRI_DETOK_SKIP_SPECIAL) && (g & ID_SPECIAL)) continue;
                uint32_t pl;
                const uint8_t *pc = piece(p, (uint32_t)ids[m], &pl);
                uint8_t by = (uint8_t)(hexv(pc[3]) << 4 | hexv(pc[4]));
                if (ok) sp_text(&d, &by, 1, &k);
                else sp_text(&d, FFFD, 3, &k);
            }
            (void)cnt;
            i = j - 1;
            continue;
        }
        detok_one(&d, (uint32_t)ids[i], &k);
    }
    if (p->model == M_BYTE_LEVEL) { if (d.n_hold) put(&k, FFFD, 3); }
    else sp_flush(&d, &k);
    *n_out = k.n;
    return k.n > cap ? COLIBRI_E_TOK_BUFFER : COLIBRI_OK;
}

const char *colibri_tok_strerror(int code)
{
    /* The texts live in colibri_strerror (info.c), which knows -30..-37. */
    return colibri_strerror(code);
}
#endif
