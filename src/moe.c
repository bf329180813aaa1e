/*
 * moe.c - the sparse Mixture-of-Experts block (FORMAT.md 6):
 *   router logits [n, E] -> softmax -> top-k (ties to the lower index,
 *   constant work) -> renormalised weights -> tokens grouped per expert ->
 *   each expert's fused SwiGLU over just its tokens -> weighted sum in
 *   selection order.
 * Experts that no token selected are not touched (their weights are not even
 * read, which is what makes a mapped or flash-resident model cheap).
 */
#include "internal.h"

#include <math.h>
#include <string.h>

void clb_softmax(float *p, const float *v, uint32_t n)
{
    float mx = v[0];
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > mx)
            mx = v[i];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = expf(v[i] - mx);
        sum += p[i];
    }
    for (uint32_t i = 0; i < n; i++)
        p[i] = p[i] / sum;
}

void clb_topk(const float *probs, uint32_t n, uint32_t k, int renorm,
              uint8_t *chosen, uint16_t *sel, float *w)
{
    memset(chosen, 0, n);
    float total = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        /* One full pass; strict '>' keeps the lowest index among equals.
         * best starts at the first free index so a NaN cannot leave it
         * unset. */
        int32_t best = -1;
        float bestv = 0.0f;
        for (uint32_t e = 0; e < n; e++) {
            int better = !chosen[e] && (best < 0 || probs[e] > bestv);
            if (better) {
                best = (int32_t)e;
                bestv = probs[e];
            }
        }
        chosen[best] = 1;
        sel[j] = (uint16_t)best;
        w[j] = bestv;
        total += bestv;
    }
    /* Without renormalisation (Qwen2-MoE, OLMoE) the weights are the
     * softmax probabilities themselves. */
    for (uint32_t j = 0; renorm && j < k; j++)
        w[j] = w[j] / total;
}

/* Every row's top-k of the router over X [n, hidden]: p->sel/selw [n, K],
 * and p->counts [E] the rows that chose each expert. */
static void choose(const clb_plan *p, const clb_layer *layer, const float *X,
                   uint32_t n)
{
    uint32_t E = p->s.n_experts, K = p->s.top_k;
    clb_linear(p, &layer->router, X, n, p->router_logits, "router");
    for (uint32_t t = 0; t < n; t++) {
        clb_softmax(p->probs + (size_t)t * E, p->router_logits + (size_t)t * E, E);
        clb_topk(p->probs + (size_t)t * E, E, K,
                 (p->d.features & COLIBRI_FEAT_ROUTER_RENORM) != 0, p->chosen,
                 p->sel + (size_t)t * K, p->selw + (size_t)t * K);
    }
    memset(p->counts, 0, E * sizeof(uint32_t));
    for (uint32_t i = 0; i < n * K; i++)
        p->counts[p->sel[i]]++;
}

#if CLB_STREAM_PREFETCH
void clb_moe_prefetch(const clb_plan *p, const clb_layer *layer, const float *X,
                      uint32_t n)
{
    clb_rmsnorm(p, p->xn, X, layer->ffn_norm, n, p->s.hidden, p->s.rms_eps);
    choose(p, layer, p->xn, n);
    p->prefetch(p, (uint32_t)(layer - p->layers), p->counts);
}
#endif

/* Route every row: fills p->sel/selw [n, K], then groups the n*K
 * selections per expert (counting sort, ascending within an expert) into
 * p->tok_list[p->offsets[e] .. p->offsets[e+1]): each entry is a selection
 * index i = row * K + slot. */
static void route(const clb_plan *p, const clb_layer *layer, const float *X,
                  uint32_t n)
{
    uint32_t E = p->s.n_experts, K = p->s.top_k;
    choose(p, layer, X, n);
    p->offsets[0] = 0;
    for (uint32_t e = 0; e < E; e++)
        p->offsets[e + 1] = p->offsets[e] + p->counts[e];
    memset(p->counts, 0, E * sizeof(uint32_t)); /* reused as fill cursors */
    for (uint32_t i = 0; i < n * K; i++) {
        uint32_t e = p->sel[i];
        p->tok_list[p->offsets[e] + p->counts[e]++] = i; /* row i / K, slot i % K */
    }
}

/* Rows [t0, t0 + tn) of h1 = silu(h1) * h3 [n, inter]: a row pass
 * (element-wise, and every kernel table's silu_mul has ref's bits: any
 * split and any table give the same result). */
typedef struct silu_job {
    const colibri_kernels *k;
    float *h1;
    const float *h3;
    uint32_t inter;
} silu_job;

static void silu_rows(void *ctx, uint32_t t0, uint32_t tn)
{
    const silu_job *j = (const silu_job *)ctx;
    size_t a = (size_t)t0 * j->inter;
    j->k->silu_mul(j->h1 + a, j->h3 + a, (size_t)tn * j->inter);
}

void clb_swiglu(const clb_plan *p, const clb_expert *ex, const float *X,
                uint32_t n, float *Y, const char *what13, const char *what2)
{
    uint32_t inter = ex->w1.rows; /* routed, shared or dense width */
    clb_linear2(p, &ex->w1, &ex->w3, X, n, p->h1, p->h3, what13);
    silu_job j = { p->k, p->h1, p->h3, inter };
    clb_parallel_rows(p, n, inter, silu_rows, &j);
    clb_linear(p, &ex->w2, p->h1, n, Y, what2);
}

/* Expert e over the rows routed to it: its outputs land in p->yslot
 * [n, K, hidden] at (row, slot). */
static void run_expert(const clb_plan *p, const clb_expert *ex, uint32_t e,
                       const float *X)
{
    uint32_t h = p->s.hidden, K = p->s.top_k;
    uint32_t a = p->offsets[e], m = p->offsets[e + 1] - a;
    for (uint32_t i = 0; i < m; i++)
        memcpy(p->xe + (size_t)i * h, X + (size_t)(p->tok_list[a + i] / K) * h,
               h * sizeof(float));
    clb_swiglu(p, ex, p->xe, m, p->ye, "expert.w1w3", "expert.w2");
    for (uint32_t i = 0; i < m; i++)
        memcpy(p->yslot + (size_t)p->tok_list[a + i] * h,
               p->ye + (size_t)i * h, h * sizeof(float));
}

/* A streamed instance's experts (stream.c): those a slot holds first, then
 * those a prefetch is reading (their reads are the oldest), then the others
 * in expert order, each read into a slot just before it runs, the next
 * one's read started (p->read_ahead) before this one is taken, so the
 * reader works while an expert computes. Each expert writes only its own
 * (row, slot) outputs, so the order changes no bit. The missing experts'
 * list reuses p->counts (route's, read by the observer already), each
 * expert's state p->chosen (top-k scratch). */
#define NOT_ROUTED 0xFFu
static int run_streamed(const clb_plan *p, uint32_t l, const float *X, char *detail)
{
    uint32_t E = p->s.n_experts, *miss = p->counts, n_miss = 0;
    uint8_t *state = p->chosen;
    for (uint32_t e = 0; e < E; e++) {
        const clb_expert *ex;
        state[e] = NOT_ROUTED;
        if (p->offsets[e + 1] == p->offsets[e])
            continue;
        state[e] = (uint8_t)p->held(p, l, e, &ex);
        if (state[e] == CLB_HELD)
            run_expert(p, ex, e, X);
    }
    for (uint32_t e = 0; e < E; e++)
        if (state[e] == CLB_IN_FLIGHT)
            miss[n_miss++] = e;
    for (uint32_t e = 0; e < E; e++)
        if (state[e] == CLB_ABSENT)
            miss[n_miss++] = e;
    for (uint32_t i = 0, f = 0; i < n_miss; i++) {
        for (; f < n_miss && f < i + p->read_ahead; f++)
            p->fetch(p, l, miss[f]);
        const clb_expert *ex;
        int rc = p->take(p, l, miss[i], &ex, detail);
        if (rc)
            return rc;
        run_expert(p, ex, miss[i], X);
    }
    return COLIBRI_OK;
}

/* Rows [t0, t0 + tn) of Y = sum_j w_j * expert_j(x), in selection order: a
 * fixed order whatever the chunking or the thread, and the order the
 * reference uses. A row pass (K x hidden products a row): serial, it left
 * the other workers waiting at the end of every layer (FINDINGS.md 26). */
typedef struct combine_job {
    const clb_plan *p;
    float *Y;
} combine_job;

static void combine_rows(void *ctx, uint32_t t0, uint32_t tn)
{
    const combine_job *cj = (const combine_job *)ctx;
    const clb_plan *p = cj->p;
    uint32_t h = p->s.hidden, K = p->s.top_k;
    for (uint32_t t = t0; t < t0 + tn; t++) {
        float *y = cj->Y + (size_t)t * h;
        const float *ys = p->yslot + (size_t)t * K * h;
        const float *w = p->selw + (size_t)t * K;
        for (uint32_t c = 0; c < h; c++)
            y[c] = ys[c] * w[0];
        for (uint32_t j = 1; j < K; j++)
            for (uint32_t c = 0; c < h; c++)
                y[c] = y[c] + ys[(size_t)j * h + c] * w[j];
    }
}

int clb_moe(const clb_plan *p, const clb_layer *layer, const float *X,
            uint32_t n, float *Y, char *detail)
{
    uint32_t h = p->s.hidden, K = p->s.top_k, l = (uint32_t)(layer - p->layers);
    route(p, layer, X, n);
    if (p->route_fn)
        p->route_fn(p->route_user, l, p->counts, p->s.n_experts);
    if (p->stream) {
        p->routed(p, l);
        int rc = run_streamed(p, l, X, detail);
        if (rc)
            return rc;
    } else {
        for (uint32_t e = 0; e < p->s.n_experts; e++)
            if (p->offsets[e + 1] != p->offsets[e])
                run_expert(p, &layer->experts[e], e, X);
    }
    combine_job cj = { p, Y };
    clb_parallel_rows(p, n, K * h, combine_rows, &cj);
    /* The shared expert sees every row and adds to the routed sum, scaled
     * by sigmoid(gate . x) where the file has a gate (Qwen2-MoE), as is
     * (GraniteMoeShared). Gate logits [n] reuse router_logits, free now. */
    if (layer->shared.w1.rows == 0)
        return COLIBRI_OK;
    clb_swiglu(p, &layer->shared, X, n, p->ye, "shared.w1w3", "shared.w2");
    float *g = p->router_logits;
    if (layer->shared_gate.rows)
        clb_linear(p, &layer->shared_gate, X, n, g, "shared.gate");
    for (uint32_t t = 0; t < n; t++) {
        float *y = Y + (size_t)t * h;
        const float *ys = p->ye + (size_t)t * h;
        if (layer->shared_gate.rows) {
            float s = 1.0f / (1.0f + expf(-g[t]));
            for (uint32_t c = 0; c < h; c++)
                y[c] = y[c] + s * ys[c];
        } else {
            for (uint32_t c = 0; c < h; c++)
                y[c] = y[c] + ys[c];
        }
    }
    return COLIBRI_OK;
}
