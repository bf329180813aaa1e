/* llama.cpp's own logits for token ids, the judge of GGUF imports
 * (bench/gguf_vs_llama.py): loads a GGUF with libllama, feeds the ids one
 * decode call each (the KV cache carries the context) and writes every
 * position's logits as float32 rows to OUT.
 *
 *   llama_logits MODEL.gguf OUT.f32 ID [ID ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 ID [ID ...]\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;     /* not the default f16 cache: compare weights, */
    cp.type_v = GGML_TYPE_F32;     /* not cache rounding (Colibri's is float32)   */
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  /* its CPU kernel rounds to f16 */
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *out = fopen(argv[2], "wb");
    if (!out) { perror(argv[2]); return 1; }
    for (int i = 3; i < argc; i++) {
        llama_token t = (llama_token)atoi(argv[i]);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
            fprintf(stderr, "llama_decode failed at position %d\n", i - 3);
            return 1;
        }
        fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), (size_t)n_vocab, out);
    }
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
