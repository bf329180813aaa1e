/*
 * colibri_tokenizer.h - text to token ids and back, from the tokenizer
 * section of a .colibri file (docs/FORMAT.md section 7), used in place.
 *
 *     colibri_tokenizer tok;
 *     int32_t ids[256]; size_t n;
 *     rc = colibri_tokenizer_init(&tok, &model);           // finds and checks the section
 *     rc = colibri_tokenize(&tok, text, strlen(text), ids, 256, &n,
 *                           COLIBRI_TOK_PARSE_SPECIAL);
 *     colibri_detok d; char out[64]; size_t k;
 *     colibri_detok_init(&d, &tok, 0);
 *     rc = colibri_detok_push(&d, id, out, sizeof out, &k); // k bytes of final text
 *     rc = colibri_detok_finish(&d, out, sizeof out, &k);
 *
 * Results are the ids and text of Hugging Face `tokenizers` 0.23 for the
 * checkpoint's tokenizer.json (tests/test_tokenizer_c.py checks them).
 *
 * Memory: nothing is allocated, ever. The tokenizer points into the model's
 * file (or the section given to _init_from_section) and is valid while that
 * memory is: until colibri_free of the model. colibri_tokenize works in the
 * caller's id buffer plus COLIBRI_TOK_SCRATCH int32 on the stack; detokenising
 * keeps at most COLIBRI_DETOK_HOLD bytes in the colibri_detok the caller owns.
 * Every call is reentrant: one colibri_tokenizer may be shared by threads; a
 * colibri_detok belongs to one stream.
 *
 * Build switch: -DCOLIBRI_NO_TOKENIZER compiles these functions to stubs that
 * return COLIBRI_E_UNSUPPORTED (the library is then smaller; README gives
 * the Cortex-M figures).
 */
#ifndef COLIBRI_TOKENIZER_H
#define COLIBRI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes beyond colibri.h's (which these functions also return:
 * COLIBRI_E_ARG for NULL pointers, COLIBRI_E_NOT_INIT for a model that is not
 * initialised, COLIBRI_E_TOKEN for an id outside the vocabulary,
 * COLIBRI_E_UNSUPPORTED in a COLIBRI_NO_TOKENIZER build). */
enum {
    COLIBRI_E_TOK_NONE = -30,     /* the file holds no tokenizer section */
    COLIBRI_E_TOK_FORMAT = -31,   /* the tokenizer section is malformed */
    COLIBRI_E_TOK_BUFFER = -32,   /* output buffer too small: *n says how
                                     much is needed (see each function) */
    COLIBRI_E_TOK_UTF8 = -33,     /* text is not valid UTF-8 (STRICT_UTF8) */
    COLIBRI_E_TOK_NO_BOS = -34,   /* ADD_BOS asked, the tokenizer has no bos */
    COLIBRI_E_TOK_REGEX = -35,    /* the text needs more pre-tokenizer regex
                                     backtracking than COLIBRI_TOK_RX_STACK
                                     entries (rebuild with a larger one) */
    COLIBRI_E_TOK_NORM = -36,     /* a text run (between added tokens) whose
                                     normal form (NFC, NFKC, the normaliser
                                     program) differs from it and is longer
                                     than COLIBRI_TOK_NORM_BUF bytes, or (NFC)
                                     more than 64 combining marks in a row */
    COLIBRI_E_TOK_WORD = -37      /* Unigram: a word (text between spaces) of
                                     more than COLIBRI_TOK_UNIGRAM_WORD bytes */
};

/* colibri_tokenize flags. */
#define COLIBRI_TOK_ADD_BOS 1u       /* put the bos id first */
#define COLIBRI_TOK_PARSE_SPECIAL 2u /* special tokens in the text become their
                                        ids (tokenizers' default); without it
                                        they are plain text */
#define COLIBRI_TOK_STRICT_UTF8 4u   /* invalid UTF-8 is COLIBRI_E_TOK_UTF8;
                                        without it each maximal invalid
                                        subsequence reads as U+FFFD */
#define COLIBRI_TOK_ADD_EOS 8u       /* put the eos id last (T5's template) */
/* colibri_detok_init flags. */
#define COLIBRI_DETOK_SKIP_SPECIAL 1u /* special tokens produce no text */

#ifndef COLIBRI_TOK_SCRATCH
#define COLIBRI_TOK_SCRATCH 128     /* int32 on the stack for one word */
#endif
#define COLIBRI_DETOK_HOLD 64       /* bytes a stream may hold back */
#ifndef COLIBRI_TOK_NORM_BUF
#define COLIBRI_TOK_NORM_BUF 4096   /* bytes of each of the two stack buffers
                                       for the normal form of a text run (NFC,
                                       NFKC, a normaliser program) when it
                                       differs from the text */
#endif
#ifndef COLIBRI_TOK_RX_STACK
#define COLIBRI_TOK_RX_STACK 64     /* backtrack entries of the regex matcher
                                       (16 bytes each, on the stack); real
                                       pre-tokenizer regexes use fewer than 12 */
#endif
#ifndef COLIBRI_TOK_UNIGRAM_WORD
#define COLIBRI_TOK_UNIGRAM_WORD 4096 /* Unigram: the longest word in bytes; its
                                         Viterbi takes 2 bytes a byte plus 2 KiB
                                         on the stack (10 KiB at 4096) */
#endif

/* The tokenizer: PRIVATE fields, filled by colibri_tokenizer_init*. */
typedef struct colibri_tokenizer {
    struct colibri_tokenizer_private_ {
        const uint8_t *sec;       /* the section, in place */
        uint32_t size;
        uint8_t be;               /* section byte order: 1 big-endian */
        uint8_t model, pretok, ok;
        uint32_t flags, n_vocab, n_merges, n_added, n_sorted;
        int32_t unk_id, bos_id, eos_id;
        const uint8_t *piece_off, *strings, *id_flags, *sorted, *merges,
                      *added, *byte_ids;
        const uint8_t *pretok_prog;  /* version 2, pretok 4: the steps and
                                        their regex programs (FORMAT.md 7.2) */
        uint32_t n_pretok_words, n_steps;
        uint32_t bytes_from;         /* the first step over ByteLevel's byte
                                        alphabet (n_steps: none) */
        const uint8_t *scores;       /* version 3, Unigram: float64 per id */
        const uint8_t *nfkc_map, *nfkc_pool;   /* version 3, NFKC (FORMAT.md 7.3) */
        uint32_t n_nfkc, n_nfkc_pool;
        double unk_score;            /* Unigram: lowest score - 10 */
        const uint8_t *norm_prog;    /* version 3: the normaliser program and */
        const uint8_t *lower;        /* its lowercase map (FORMAT.md 7.4) */
        uint32_t n_norm_words, n_lower;
        const uint8_t *cmap_units;   /* a Precompiled step's map: its trie, */
        const uint8_t *cmap_strings; /* its strings, */
        const uint8_t *graphemes;    /* its grapheme table (FORMAT.md 7.5) */
        uint32_t n_cmap_units, n_cmap_strings, n_graphemes;
    } priv_;
} colibri_tokenizer;

typedef struct colibri_tokenizer_info {
    uint32_t n_vocab;       /* ids are 0 .. n_vocab-1 */
    int32_t bos_id, eos_id; /* -1: none */
    uint8_t model;          /* 1 byte-level BPE, 2 SentencePiece-style BPE,
                               3 Unigram */
    uint8_t pretok;         /* 0 none, 1 GPT-2, 2 Qwen2, 3 Llama-3 regex,
                               4 a stored program of Split steps */
    uint8_t template_bos;   /* 1: the checkpoint's template puts bos first
                               (pass COLIBRI_TOK_ADD_BOS to do as it does) */
    uint8_t template_eos;   /* 1: ... puts eos last (COLIBRI_TOK_ADD_EOS) */
} colibri_tokenizer_info;

/* Find the model's tokenizer section and check it in full (FORMAT.md 7:
 * every offset, count and id), O(size of the section). The model must stay
 * initialised while `t` is used. Returns 0, COLIBRI_E_ARG, _NOT_INIT,
 * _TOK_NONE, _TOK_FORMAT, _UNSUPPORTED. */
int colibri_tokenizer_init(colibri_tokenizer *t, const colibri_model *m);

/* The same over a section's bytes (e.g. a file's section copied elsewhere,
 * the fuzzer): `section` (any alignment) must outlive `t`. */
int colibri_tokenizer_init_from_section(colibri_tokenizer *t, const void *section,
                                        size_t size);

/* 0, COLIBRI_E_ARG (NULL, or `t` not initialised). */
int colibri_tokenizer_get_info(const colibri_tokenizer *t, colibri_tokenizer_info *out);

/* Text (`len` bytes, need not be NUL-terminated) -> ids[0 .. *n_ids).
 * Returns 0; COLIBRI_E_TOK_BUFFER when `cap` ids are not enough: *n_ids is then
 * a capacity with which the same call succeeds (the exact count, or an upper
 * bound when a word of more than COLIBRI_TOK_SCRATCH characters did not fit),
 * ids[] holds nothing usable; COLIBRI_E_TOK_UTF8 (STRICT_UTF8: *n_ids = the
 * byte offset of the first invalid byte); COLIBRI_E_TOK_NO_BOS (or no eos for
 * ADD_EOS); COLIBRI_E_TOK_REGEX, _NORM, _WORD (a stack bound above);
 * COLIBRI_E_ARG.
 * O(len) plus, per word of k characters, O(k log merges) for each distinct
 * merge rank it applies (one sweep merges every occurrence of the lowest-
 * rank pair; a 64 KiB word of random letters takes ~0.15 s on x86_64). */
int colibri_tokenize(const colibri_tokenizer *t, const char *text, size_t len,
                     int32_t *ids, size_t cap, size_t *n_ids, unsigned flags);

/* Streaming detokenizer: the caller owns it (any storage). */
typedef struct colibri_detok {
    const colibri_tokenizer *t;
    unsigned flags;
    uint8_t started;      /* SentencePiece: first byte of text emitted;
                             Metaspace decoder: first token decoded */
    uint8_t run_bad;      /* byte-piece run already invalid UTF-8 */
    uint16_t n_hold;      /* bytes held back */
    uint32_t run;         /* byte pieces in the current run */
    uint8_t hold[COLIBRI_DETOK_HOLD];
} colibri_detok;

/* Start a stream (flags: COLIBRI_DETOK_SKIP_SPECIAL). */
void colibri_detok_init(colibri_detok *d, const colibri_tokenizer *t, unsigned flags);

/* Decode one id: writes the text that is now final (a UTF-8 sequence split
 * across ids is held back until complete) to out[0 .. *n_out), not
 * NUL-terminated. Returns 0; COLIBRI_E_TOKEN (id outside the vocabulary;
 * the stream is unchanged); COLIBRI_E_TOK_BUFFER (*n_out = bytes needed; the
 * stream is unchanged, call again with a larger buffer); COLIBRI_E_ARG.
 * Output is `tokenizers`' decode of the whole sequence, except after a run of
 * more than COLIBRI_DETOK_HOLD bytes of <0xNN> pieces that later turns out
 * invalid (colibri_detokenize is exact). */
int colibri_detok_push(colibri_detok *d, int32_t id, char *out, size_t cap,
                       size_t *n_out);

/* End of the stream: writes what was held back. Same codes. */
int colibri_detok_finish(colibri_detok *d, char *out, size_t cap, size_t *n_out);

/* Whole sequence: ids[0..n) -> out[0 .. *n_out) (not NUL-terminated), equal
 * to `tokenizers`' decode(ids, skip_special_tokens = flags & SKIP_SPECIAL).
 * Returns 0; COLIBRI_E_TOK_BUFFER (*n_out = bytes needed); COLIBRI_E_TOKEN;
 * COLIBRI_E_ARG. */
int colibri_detokenize(const colibri_tokenizer *t, const int32_t *ids, size_t n,
                       char *out, size_t cap, size_t *n_out, unsigned flags);

/* Text for the codes above and colibri.h's: static, never NULL. */
const char *colibri_tok_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
