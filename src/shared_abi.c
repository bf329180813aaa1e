/*
 * shared_abi.c - linked into libcolibri.so only (not libcolibri.a).
 *
 * A binding that loads the shared library without a C compiler (the Python
 * package's colibri.runtime, through ctypes) cannot evaluate sizeof or read
 * the defines of colibri.h. These functions tell it how many bytes a
 * colibri_model and a colibri_info take in this build and which API version
 * the library implements, so it can allocate the caller-owned instance and
 * refuse a library it does not match instead of corrupting memory.
 */
#include "colibri.h"

size_t colibri_abi_sizeof_model(void) { return sizeof(colibri_model); }
size_t colibri_abi_sizeof_info(void) { return sizeof(colibri_info); }
int colibri_abi_api_version(void) { return COLIBRI_API_VERSION; }

/* The tokenizer and sampler structs the binding allocates (colibri_tokenizer,
 * colibri_detok: opaque buffers of these sizes) or mirrors field by field
 * (colibri_tokenizer_info, colibri_sample_params: checked against ctypes). */
#include "colibri_sample.h"
#include "colibri_tokenizer.h"

size_t colibri_abi_sizeof_tokenizer(void) { return sizeof(colibri_tokenizer); }
size_t colibri_abi_sizeof_detok(void) { return sizeof(colibri_detok); }
size_t colibri_abi_sizeof_tokenizer_info(void) { return sizeof(colibri_tokenizer_info); }
size_t colibri_abi_sizeof_sample_params(void) { return sizeof(colibri_sample_params); }

/* The sizes of the arena's tables (the plan, per-layer and per-expert views,
 * the encoder-decoder state and its per-layer views), so colibri/model/memory.py's
 * copy of the arena formula (clb_layout) can be held equal to
 * colibri_arena_size on this build: which 0 clb_plan, 1 clb_layer,
 * 2 clb_expert, 3 clb_encdec, 4 clb_xattn; 0 for any other. */
#include "encdec.h"

size_t colibri_abi_sizeof_table(unsigned which)
{
    switch (which) {
    case 0: return sizeof(clb_plan);
    case 1: return sizeof(clb_layer);
    case 2: return sizeof(clb_expert);
    case 3: return sizeof(clb_encdec);
    case 4: return sizeof(clb_xattn);
    default: return 0;
    }
}
