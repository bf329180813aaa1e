/*
 * eva_kernels.c - Frama-C EVA harness for the reference kernels
 * (src/kernels/ref.c, through colibri_kernels_ref() and the clb_ref_* /
 * clb_dequant_row / clb_exp_neg entry points of kernels.h): every kernel of
 * the table over unknown inputs, for every shape in the small ranges below
 * at once (EVA treats each shape argument as an interval):
 *
 *   n (tokens) 1..EVA_N, rows 1..EVA_ROWS;
 *   F32 / I8_GROUP / I16_ROW: cols 1..EVA_COLS, group 32 and 7;
 *   block types (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K): cols 1..EVA_BCOLS, i.e. one or two
 *     256-column blocks (one to sixteen Q4_0 / Q5_0 blocks);
 *   attention: 3, 16 and EVA_POS = 20 positions (part of a CLB_ATT_BLOCK
 *     block, one block, a block and a partial one), head size d 1..EVA_D,
 *     any mask, f32 and int8 caches.
 *
 * Integer inputs (int8 / int16 weights, quantised activations, the block
 * bytes with their 4- and 6-bit values and 6-bit / int8 scales, the masks)
 * are Frama_C_make_unknown: every value. Float inputs (F32 weights,
 * activations, every scale: the block d / dmin fields, S, XS, the cache
 * scales, q, K, V) are any finite value in [-EVA_FMAX, EVA_FMAX] (the
 * attention's scale in [0, 1]), which bounds what the sums can reach; the
 * format guarantees finiteness, not this range (docs/ANALYSIS.md 2).
 * clb_exp_neg alone is analysed over its whole documented domain, every
 * float x <= 0. scripts/analysis.sh runs it, in two parts (EVA_PART).
 */
#include "__fc_builtin.h"
#include "kernels.h"

/* Two runs (scripts/analysis.sh): EVA_PART 1 the matrix kernels, the
 * quantisers and clb_dequant_row, where EVA reports any infinity too;
 * EVA_PART 2 the attention, which starts its running max at -INFINITY, so
 * that run reports NaN only (-warn-special-float nan). */
#ifndef EVA_PART
#define EVA_PART 1
#endif
#ifndef EVA_N
#define EVA_N 2
#endif
#ifndef EVA_ROWS
#define EVA_ROWS 3
#endif
#ifndef EVA_COLS
#define EVA_COLS 64
#endif
#ifndef EVA_BCOLS
#define EVA_BCOLS 512
#endif
#ifndef EVA_POS
#define EVA_POS 20
#endif
#ifndef EVA_D
#define EVA_D 8
#endif
#define EVA_FMAX 1024.0f

#define NB_MAX ((EVA_BCOLS + CLB_QK_COLS - 1) / CLB_QK_COLS)
#define NB4_MAX ((EVA_BCOLS + CLB_Q4_0_COLS - 1) / CLB_Q4_0_COLS)

static void fill(float *a, size_t k, float lo, float hi)
{
    for (size_t i = 0; i < k; i++)
        a[i] = Frama_C_float_interval(lo, hi);
}

/* A block row's fp16 fields (d, dmin) at byte `at` of each block, finite
 * (exponent below 31, as a checked file's) and positive, over bytes that
 * are otherwise unknown: EVA's intervals cannot keep the exponent below 31
 * on a value whose sign bit may be set, and a negative scale is the same
 * magnitudes (clb_f16_to_f32 negates). */
static void set_scales(uint8_t *w, size_t nblocks, size_t bytes, unsigned at, unsigned nf)
{
    for (size_t b = 0; b < nblocks; b++)
        for (unsigned f = 0; f < nf; f++) {
            uint16_t h = (uint16_t)Frama_C_interval(0, 0x7bff);
            memcpy(w + b * bytes + at + 2 * f, &h, 2);
        }
}

static float W[EVA_ROWS * EVA_COLS], X[EVA_N * EVA_COLS];
static float S[EVA_ROWS * EVA_COLS], XS[EVA_N * EVA_COLS];
static int8_t Q8[EVA_ROWS * EVA_COLS], XQ8[EVA_N * EVA_COLS];
static int16_t Q16[EVA_ROWS * EVA_COLS];
static float Y[EVA_N * EVA_ROWS];

static void dense_kernels(const colibri_kernels *k)
{
    uint32_t n = Frama_C_unsigned_int_interval(1, EVA_N);
    uint32_t rows = Frama_C_unsigned_int_interval(1, EVA_ROWS);
    uint32_t cols = Frama_C_unsigned_int_interval(1, EVA_COLS);
    fill(W, sizeof W / sizeof W[0], -EVA_FMAX, EVA_FMAX);
    fill(X, sizeof X / sizeof X[0], -EVA_FMAX, EVA_FMAX);
    fill(S, sizeof S / sizeof S[0], -EVA_FMAX, EVA_FMAX);
    fill(XS, sizeof XS / sizeof XS[0], -EVA_FMAX, EVA_FMAX);
    Frama_C_make_unknown((char *)Q8, sizeof Q8);
    Frama_C_make_unknown((char *)XQ8, sizeof XQ8);
    Frama_C_make_unknown((char *)Q16, sizeof Q16);
    k->matmul_f32(Y, W, X, n, rows, cols);
    k->matmul_i16(Y, Q16, S, X, n, rows, cols);
    /* Two group sizes: a power of two and one that leaves a short last
     * group. A group that is an interval too would lose c1 <= cols (EVA
     * does not bound c0 + group by the test that chose it). */
    static const uint32_t groups[2] = { 32, 7 };
    for (unsigned i = 0; i < 2; i++) {
        k->matmul_i8(Y, Q8, S, XQ8, XS, n, rows, cols, groups[i]);
        /* quantize_act_i8 writes XQ8 / XS of this shape (ngroups <= cols). */
        k->quantize_act_i8(XQ8, XS, X, n, cols, groups[i]);
    }
}

static float BX[EVA_N * EVA_BCOLS], BXS[EVA_N * NB4_MAX];
static int8_t BXQ[EVA_N * NB_MAX * CLB_QK_COLS];
static int16_t BXB[EVA_N * NB_MAX * CLB_QK_COLS / 16];
static uint8_t BW[EVA_ROWS * NB4_MAX * CLB_Q5_0_BYTES > EVA_ROWS * NB_MAX * CLB_Q6_K_BYTES
                      ? EVA_ROWS * NB4_MAX * CLB_Q5_0_BYTES
                      : EVA_ROWS * NB_MAX * CLB_Q6_K_BYTES];
static float BY[EVA_N * EVA_ROWS], DQ[EVA_BCOLS];

static void block_kernels(const colibri_kernels *k)
{
    uint32_t n = Frama_C_unsigned_int_interval(1, EVA_N);
    uint32_t rows = Frama_C_unsigned_int_interval(1, EVA_ROWS);
    uint32_t cols = Frama_C_unsigned_int_interval(1, EVA_BCOLS);
    fill(BX, sizeof BX / sizeof BX[0], -EVA_FMAX, EVA_FMAX);
    /* Activations: the quantiser's outputs from BX, then any int8 / int16
     * values with scales in range (more than it can produce). */
    k->quantize_act_blk(BXQ, BXS, BXB, BX, n, cols, CLB_Q4_0_COLS);
    k->quantize_act_blk(BXQ, BXS, BXB, BX, n, cols, CLB_QK_COLS);
    Frama_C_make_unknown((char *)BXQ, sizeof BXQ);
    Frama_C_make_unknown((char *)BXB, sizeof BXB);
    fill(BXS, sizeof BXS / sizeof BXS[0], -EVA_FMAX, EVA_FMAX);

    Frama_C_make_unknown((char *)BW, sizeof BW);
    set_scales(BW, (size_t)EVA_ROWS * NB4_MAX, CLB_Q4_0_BYTES, 0, 1);
    k->matmul_q4_0(BY, BW, BXQ, BXS, BXB, n, rows, cols);
    clb_dequant_row(DQ, BW, COLIBRI_DTYPE_Q4_0, cols);

    Frama_C_make_unknown((char *)BW, sizeof BW);
    set_scales(BW, (size_t)EVA_ROWS * NB4_MAX, CLB_Q5_0_BYTES, 0, 1);
    k->matmul_q5_0(BY, BW, BXQ, BXS, BXB, n, rows, cols);
    clb_dequant_row(DQ, BW, COLIBRI_DTYPE_Q5_0, cols);

    Frama_C_make_unknown((char *)BW, sizeof BW);
    set_scales(BW, (size_t)EVA_ROWS * NB_MAX, CLB_Q4_K_BYTES, 0, 2);
    k->matmul_q4_k(BY, BW, BXQ, BXS, BXB, n, rows, cols);
    clb_dequant_row(DQ, BW, COLIBRI_DTYPE_Q4_K, cols);

    Frama_C_make_unknown((char *)BW, sizeof BW);
    set_scales(BW, (size_t)EVA_ROWS * NB_MAX, CLB_Q5_K_BYTES, 0, 2);
    k->matmul_q5_k(BY, BW, BXQ, BXS, BXB, n, rows, cols);
    clb_dequant_row(DQ, BW, COLIBRI_DTYPE_Q5_K, cols);

    Frama_C_make_unknown((char *)BW, sizeof BW);
    set_scales(BW, (size_t)EVA_ROWS * NB_MAX, CLB_Q6_K_BYTES, CLB_Q6_K_D, 1);
    k->matmul_q6_k(BY, BW, BXQ, BXS, BXB, n, rows, cols);
    clb_dequant_row(DQ, BW, COLIBRI_DTYPE_Q6_K, cols);
}

static float Aq[EVA_D], AK[EVA_POS * EVA_D], AV[EVA_POS * EVA_D];
static float AKs[EVA_POS], AVs[EVA_POS], Aout[EVA_D];
static int8_t AKq[EVA_POS * EVA_D], AVq[EVA_POS * EVA_D];
static uint8_t Amask[EVA_POS];

static void attention(const colibri_kernels *k)
{
    fill(Aq, EVA_D, -EVA_FMAX, EVA_FMAX);
    fill(AK, EVA_POS * EVA_D, -EVA_FMAX, EVA_FMAX);
    fill(AV, EVA_POS * EVA_D, -EVA_FMAX, EVA_FMAX);
    fill(AKs, EVA_POS, -EVA_FMAX, EVA_FMAX);
    fill(AVs, EVA_POS, -EVA_FMAX, EVA_FMAX);
    Frama_C_make_unknown((char *)AKq, sizeof AKq);
    Frama_C_make_unknown((char *)AVq, sizeof AVq);
    Frama_C_make_unknown((char *)Amask, sizeof Amask);
    clb_att_args a;
    memset(&a, 0, sizeof a);
    a.q = Aq;
    a.mask = Amask;
    a.ld = EVA_D;
    a.lds = 1;
    a.d = Frama_C_unsigned_int_interval(1, EVA_D);
    a.scale = Frama_C_float_interval(0.0f, 1.0f);
    /* Position counts one by one: less than a block, a full block, a full
     * and a partial one. As an interval, n loses the relation between the
     * block start b and the block's length n - b. */
    static const uint32_t ns[3] = { 3, CLB_ATT_BLOCK, EVA_POS };
    for (unsigned i = 0; i < 3; i++) {
        a.n = ns[i];
        a.K = AK;
        a.V = AV;
        a.Kq = a.Vq = NULL;
        a.Ks = a.Vs = NULL;
        k->attend(Aout, &a); /* f32 cache */
        a.K = a.V = NULL;
        a.Kq = AKq;
        a.Vq = AVq;
        a.Ks = AKs;
        a.Vs = AVs;
        k->attend(Aout, &a); /* int8 cache */
    }
}

volatile float eva_sink;

void eva_main(void)
{
    const colibri_kernels *k = colibri_kernels_ref();
#if EVA_PART == 1
    dense_kernels(k);
    block_kernels(k);
#else
    attention(k);
    /* The exp on its whole domain: x <= 0 (finite; -inf and NaN are
     * handled by the first test, which every x below -87 takes too). */
    eva_sink = clb_exp_neg(Frama_C_float_interval(-3.40282347e38f, 0.0f));
#endif
}
