/*
 * arena_tables.c - a probe compiled (never linked) with the library's flags
 * for each target: it tells the build the sizes of the C structs the
 * runtime's arena holds tables of, as the target's compiler lays them out
 * (pointer size, alignment of uint64_t, COLIBRI_THREADS), and the chunk the
 * library was built with, without running anything on the target.
 *
 * Each size is the size of an array symbol; colibri/buildsteps/blob.py
 * reads the symbols' st_size from this object's ELF symbol table
 * (table_sizes_from_object) and feeds them to colibri/model/memory.py's arena
 * formula (clb_layout term by term), so fw_config.h's FW_ARENA_BYTES is
 * exactly what colibri_arena_size_ex returns on the target.
 */
#include "encdec.h"
#include "internal.h"

unsigned char colibri_sizeof_clb_plan[sizeof(clb_plan)];
unsigned char colibri_sizeof_clb_layer[sizeof(clb_layer)];
unsigned char colibri_sizeof_clb_expert[sizeof(clb_expert)];
unsigned char colibri_sizeof_clb_encdec[sizeof(clb_encdec)];
unsigned char colibri_sizeof_clb_xattn[sizeof(clb_xattn)];
/* COLIBRI_CHUNK_TOKENS: rows of a caller's arena (colibri_init_from_memory). */
unsigned char colibri_chunk_tokens[COLIBRI_CHUNK_TOKENS];
