/*
 * eva_tokenizer.c - Frama-C EVA harness for the tokenizer section's checks
 * (src/tokenizer.c, colibri_tokenizer_init_from_section): every byte of a
 * section of EVA_MAX_BYTES bytes unknown, its size any of 0..EVA_MAX_BYTES.
 * A section's fixed arrays (header 96 bytes, byte_ids 1 KiB) need about
 * 1.2 KiB, so the bound is larger than the smallest valid section.
 */
#include "__fc_builtin.h"
#include "colibri_tokenizer.h"

#ifndef EVA_MAX_BYTES
#define EVA_MAX_BYTES 2048
#endif

static uint8_t section_bytes[EVA_MAX_BYTES];

void eva_main(void)
{
    Frama_C_make_unknown((char *)section_bytes, EVA_MAX_BYTES);
    size_t size = Frama_C_unsigned_int_interval(0, EVA_MAX_BYTES);
    colibri_tokenizer tok;
    colibri_tokenizer_info info;
    if (colibri_tokenizer_init_from_section(&tok, section_bytes, size) == 0)
        (void)colibri_tokenizer_get_info(&tok, &info);
}
