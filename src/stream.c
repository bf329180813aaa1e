/*
 * stream.c - experts from storage: the resident image of a streamed file,
 * the arena it needs, the expert slots, their eviction policy and the
 * checks of every expert read (stream.h). Allocates nothing and makes no
 * system call itself: every byte is in the caller's (or load.c's) arena,
 * every read goes through the instance's colibri_reader.
 */
#include "stream.h"

#include "format.h"

#include <string.h>

/* The file's byte order, for the rewritten offsets of the image's table. */
static void wr64(uint8_t *p, uint64_t v, int be)
{
    for (unsigned i = 0; i < 8; i++)
        p[be ? 7 - i : i] = (uint8_t)(v >> (8 * i));
}

static int is_expert_matrix(unsigned kind, unsigned expert)
{
    return expert != COLIBRI_NO_EXPERT &&
           (kind == COLIBRI_KIND_EXPERT_W1 || kind == COLIBRI_KIND_EXPERT_W3 ||
            kind == COLIBRI_KIND_EXPERT_W2);
}

static uint64_t up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* ------------------------------------------------------------------------ */
/* Geometry and layout                                                      */
/* ------------------------------------------------------------------------ */

int clb_stream_geometry(const uint8_t *prefix, uint64_t size, clb_stream_geom *g,
                        char *detail)
{
    memset(g, 0, sizeof *g);
    if (size > (uint64_t)SIZE_MAX) {
        clb_detail(detail, DETAIL_CAP, "a file of %llu bytes is larger than this "
                   "build's address space can describe", (unsigned long long)size);
        return COLIBRI_E_UNSUPPORTED;
    }
    int rc = clb_validate_prefix(prefix, (size_t)size, &g->s, &g->be, &g->d, detail);
    if (rc)
        return rc;
    if (g->d.features & COLIBRI_FEAT_ENC_DEC) {
        /* no build streams one: the options are wrong for the file, as
         * colibri_share_ex's are for a shared instance (not _UNSUPPORTED,
         * whose text says "by this build") */
        clb_detail(detail, DETAIL_CAP, "streaming is for decoder-only files: load "
                   "this encoder-decoder file all-resident");
        return COLIBRI_E_ARG;
    }
    g->file_size = size;
    g->prefix_bytes = clb_prefix_bytes(prefix, &g->s, g->be);
    const uint8_t *tab = prefix + COLIBRI_TABLE_OFFSET;
    unsigned per = (g->d.features & COLIBRI_FEAT_RELU_FFN) ? 2u : 3u;
    uint64_t pos = up(g->prefix_bytes, 64);
    for (uint32_t i = 0; i < g->s.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, g->be);
        unsigned expert = rd16(en + COLIBRI_ENT_EXPERT, g->be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, g->be);
        if (kind == COLIBRI_KIND_DESC)
            continue; /* inside the prefix */
        if (!is_expert_matrix(kind, expert)) {
            pos = up(pos + sz, 64);
            g->resident_bytes += up(sz, 64);
            continue;
        }
        if (kind != COLIBRI_KIND_EXPERT_W1)
            continue; /* measured with its W1 (validated order: W1 [W3] W2) */
        const uint8_t *last = en + (size_t)(per - 1) * COLIBRI_ENTRY_SIZE;
        uint64_t span = rd64(last + COLIBRI_ENT_OFFSET, g->be) +
                        rd64(last + COLIBRI_ENT_SIZE, g->be) -
                        rd64(en + COLIBRI_ENT_OFFSET, g->be);
        if (span > g->max_span)
            g->max_span = span;
        g->n_streamed++;
    }
    if (g->max_span > UINT32_MAX || g->n_streamed == 0) {
        clb_detail(detail, DETAIL_CAP, g->n_streamed ? "an expert of %llu bytes is "
                   "larger than a slot can be (4 GiB)" : "this file has no routed "
                   "experts to stream", (unsigned long long)g->max_span);
        return COLIBRI_E_UNSUPPORTED;
    }
    g->image_bytes = pos;
    return COLIBRI_OK;
}

uint64_t clb_slot_stride(const clb_stream_geom *g, uint32_t align)
{
    /* An aligned reader reads whole blocks around the expert: up to one
     * block before it and the rest of the last one. */
    if (align <= 64)
        return up(g->max_span, 64);
    return up(g->max_span, align) + align;
}

/* The layout of stream.h, counting (c->base NULL) or carving; *slots_at
 * receives the offset where the slots (the last part) begin. */
static void stream_layout(carver *c, const clb_stream_geom *g, uint32_t n_slots,
                          uint32_t align, uint32_t chunk_limit, unsigned kv_dtype,
                          clb_stream **st, clb_plan **p, uint8_t **slot_mem,
                          uint64_t *slots_at)
{
    int ovf = 0;
    uint64_t n_exp = (uint64_t)g->s.n_layers * g->s.n_experts;
    (void)clb_carve(c, g->image_bytes);
    *st = (clb_stream *)clb_carve(c, sizeof(clb_stream));
    clb_stream_expert *ex = (clb_stream_expert *)clb_carve(
        c, cmul(n_exp, sizeof(clb_stream_expert), &ovf));
    clb_slot *sl = (clb_slot *)clb_carve(c, cmul(n_slots, sizeof(clb_slot), &ovf));
    uint32_t *visits = (uint32_t *)clb_carve(c, (uint64_t)g->s.n_layers * sizeof(uint32_t));
    clb_layout(c, &g->s, &g->d, chunk_limit, kv_dtype, p);
    uint64_t stride = clb_slot_stride(g, align);
    *slots_at = c->off;
    uint8_t *mem = (uint8_t *)clb_carve(
        c, cadd(cmul(n_slots, stride, &ovf), align > 64 ? align : 0, &ovf));
    if (ovf)
        c->ovf = 1;
    if (*st) {
        (*st)->experts = ex;
        (*st)->slots = sl;
        (*st)->visits = visits;
    }
    if (mem && align > 64)
        mem += (align - (uintptr_t)mem % align) % align;
    *slot_mem = mem;
}

/* The layout counted: its carver (off: the bytes, ovf) and *slots_at. */
static carver counted(const clb_stream_geom *g, uint32_t n_slots, uint32_t align,
                      uint32_t chunk_limit, unsigned kv_dtype, uint64_t *slots_at)
{
    carver c = { NULL, 0, 0 };
    clb_stream *st;
    clb_plan *p;
    uint8_t *mem;
    stream_layout(&c, g, n_slots, align, chunk_limit, kv_dtype, &st, &p, &mem, slots_at);
    return c;
}

int clb_stream_arena_bytes(const clb_stream_geom *g, uint32_t n_slots,
                           uint32_t align, uint32_t chunk_limit, unsigned kv_dtype,
                           size_t *out)
{
    uint64_t slots_at;
    carver c = counted(g, n_slots, align, chunk_limit, kv_dtype, &slots_at);
    if (c.ovf || c.off > (uint64_t)SIZE_MAX)
        return COLIBRI_E_NO_MEMORY;
    *out = (size_t)c.off;
    return COLIBRI_OK;
}

#if CLB_STREAM_MAP
int clb_stream_resident_cached(const uint8_t *prefix, const clb_stream_geom *g,
                               const clb_stream_map *map)
{
    const uint8_t *tab = prefix + COLIBRI_TABLE_OFFSET;
    for (uint32_t i = 0; i < g->s.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, g->be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, g->be);
        if (kind == COLIBRI_KIND_DESC || is_expert_matrix(kind, rd16(en + COLIBRI_ENT_EXPERT,
                                                                     g->be)) || sz == 0)
            continue;
        if (!map->cached || map->cached(map->user, rd64(en + COLIBRI_ENT_OFFSET, g->be), sz) != 1)
            return 0;
    }
    return 1;
}

uint64_t clb_stream_slots_at(const clb_stream_geom *g, uint32_t n_slots, uint32_t align,
                             uint32_t chunk_limit, unsigned kv_dtype)
{
    uint64_t slots_at;
    (void)counted(g, n_slots, align, chunk_limit, kv_dtype, &slots_at);
    return slots_at;
}
#endif

uint32_t clb_stream_slots_for(const clb_stream_geom *g, uint64_t ram, uint32_t align,
                              uint32_t chunk_limit, unsigned kv_dtype,
                              uint64_t *least)
{
    size_t one = SIZE_MAX, two = SIZE_MAX;
    (void)clb_stream_arena_bytes(g, 1, align, chunk_limit, kv_dtype, &one);
    (void)clb_stream_arena_bytes(g, 2, align, chunk_limit, kv_dtype, &two);
    *least = one;
    if (ram < one || two <= one)
        return 0;
    uint64_t per = two - one; /* a slot and its table entry */
    uint64_t n = 1 + (ram - one) / per;
    if (n > g->n_streamed)
        n = g->n_streamed;
    /* The table entries' rounding to 64 can make the linear estimate one
     * slot too many: step down until it fits. */
    size_t need;
    while (n > 1 && (clb_stream_arena_bytes(g, (uint32_t)n, align, chunk_limit,
                                            kv_dtype, &need) ||
                     need > ram))
        n--;
    return (uint32_t)n;
}

/* ------------------------------------------------------------------------ */
/* Slots                                                                    */
/* ------------------------------------------------------------------------ */

/* COLIBRI_SLOTS_FREQ's count of one more use; at 2^16 every count halves,
 * so a routing that changes (a new topic) moves the hot set along. */
static void count_use(clb_stream *st, clb_stream_expert *x)
{
    if (++x->uses < 65536u)
        return;
    for (uint32_t i = 0; i < st->n_exp; i++)
        st->experts[i].uses /= 2;
}

/* COLIBRI_SLOTS_REUSE, in Q16 fixed point so that a replay of a routing
 * trace (colibri/model/route_trace.py) gives the same victims: at each MoE
 * pass of a layer, before any of its experts runs, every expert of the
 * layer has its recency register quartered, plus 3/4 (at most 1 in all)
 * where the pass routes to it, and counts the pass in `picked`. */
#define REUSE_ONE 65536u
#define REUSE_RECENT_ADD 49152u          /* 3/4 */
#define REUSE_VISITS_HALVE_AT 0x80000000u

/* clb_plan.routed of a streamed instance: the layer's routing is in
 * p->offsets. */
static void stream_routed(const clb_plan *p, uint32_t layer)
{
    clb_stream *st = p->stream;
#if CLB_STREAM_PREFETCH
    /* The fills a prefetch queued for experts the routing does not use:
     * those the reader has not begun are not done (a disk that is the
     * bottleneck reads only what is used, and what was begun). The fifo's
     * order is the reader's. */
    for (uint32_t k = 0; st->io.cancel && k < st->fifo_len; k++) {
        uint32_t idx = st->fifo[(st->fifo_head + k) % CLB_STREAM_FIFO];
        uint32_t e = idx % st->n_experts;
        int unused = idx / st->n_experts == layer && st->experts[idx].prefetched &&
                     p->offsets[e + 1] == p->offsets[e];
        if (unused && st->io.cancel(st->io.user, k))
            st->st.prefetch_cancelled++;
    }
#endif
    if (st->policy != COLIBRI_SLOTS_REUSE)
        return;
    clb_stream_expert *x = &st->experts[(size_t)layer * st->n_experts];
    for (uint32_t e = 0; e < st->n_experts; e++) {
        int chosen = p->offsets[e + 1] != p->offsets[e];
        x[e].recent = (x[e].recent >> 2) + (chosen ? REUSE_RECENT_ADD : 0u);
        x[e].picked += (uint32_t)chosen;
    }
    if (++st->visits[layer] >= REUSE_VISITS_HALVE_AT) {
        st->visits[layer] /= 2;
        for (uint32_t e = 0; e < st->n_experts; e++)
            x[e].picked /= 2;
    }
}

/* An expert's expected reuse (Q16: recent + picked / visits, at most 2) and
 * the layer passes until its layer's next one, from layer `now`'s pass (an
 * expert of `now` itself has run this pass: it waits all n_layers). */
static uint64_t reuse_value(const clb_stream *st, int32_t idx, uint32_t now,
                            uint64_t *wait)
{
    uint32_t layer = (uint32_t)idx / st->n_experts;
    const clb_stream_expert *x = &st->experts[idx];
    uint32_t d = (layer + st->n_layers - now) % st->n_layers;
    *wait = d ? d : st->n_layers;
    uint32_t v = st->visits[layer];
    return x->recent + (v ? (uint64_t)x->picked * REUSE_ONE / v : 0u);
}

/* The slot the next expert goes into (for layer `now`'s pass): an empty one
 * while there is one (at the start, or after a failed read), else the one
 * the policy gives up. A slot whose read is in flight is never given up,
 * nor one the running pass awaits, nor (keep non-NULL: a prefetch for layer keep_layer) one holding an
 * expert of keep_layer that keep[expert] predicts. UINT32_MAX: none. */
static uint32_t victim(const clb_stream *st, uint32_t now, uint32_t keep_layer,
                       const uint32_t *keep)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t s = 0; s < st->n_slots; s++) {
        const clb_slot *a = &st->slots[s];
        if (a->pending)
            continue;
        if (a->expert < 0)
            return s;
        if (st->experts[a->expert].awaited)
            continue;
        if (keep && (uint32_t)a->expert / st->n_experts == keep_layer &&
            keep[(uint32_t)a->expert % st->n_experts])
            continue;
        if (best == UINT32_MAX) {
            best = s;
            continue;
        }
        const clb_slot *b = &st->slots[best];
        if (st->policy == COLIBRI_SLOTS_REUSE) {
            /* value_a / wait_a < value_b / wait_b, exactly */
            uint64_t wa, wb, va = reuse_value(st, a->expert, now, &wa),
                             vb = reuse_value(st, b->expert, now, &wb);
            if (va * wb != vb * wa) {
                if (va * wb < vb * wa)
                    best = s;
                continue;
            }
        }
        if (st->policy == COLIBRI_SLOTS_FREQ) {
            uint32_t ua = st->experts[a->expert].uses, ub = st->experts[b->expert].uses;
            if (ua != ub) {
                if (ua < ub)
                    best = s;
                continue;
            }
        }
        if (a->last_use < b->last_use)
            best = s;
    }
    return best;
}

/* The bytes of expert x a read brings in: its contiguous sections, in
 * whole blocks for an aligned reader (the slot stride has room for them;
 * the last may pass the end of the file, which the aligned reader allows). */
static void read_range(const clb_stream *st, const clb_stream_expert *x,
                       uint64_t *a, uint64_t *b)
{
    uint64_t end = x->off + x->span;
    *a = x->off;
    *b = end;
    if (st->align > 1) {
        *a -= *a % st->align;
        *b = up(end, st->align);
    }
}

/* Check expert x, whose bytes from file offset a are at `mem` (read into
 * its slot, or shown by the map: then in the host's order, never written):
 * each section's CRC and floats, then, all of them good, the host byte
 * order (so that a failed check, run again, fails the same way). */
static int check_expert(const clb_stream *st, const clb_stream_expert *x, uint64_t a,
                        uint8_t *mem, char *detail)
{
    uint8_t *first = mem + (x->off - a);
    for (uint32_t j = 0; j < x->n_mats; j++) {
        const uint8_t *en = st->table + (size_t)(x->entry + j) * COLIBRI_ENTRY_SIZE;
        int rc = clb_check_section(first + x->rel[j], en, x->entry + j, st->group,
                                   st->be, detail);
        if (rc)
            return rc;
    }
    for (uint32_t j = 0; st->be != host_is_big_endian() && j < x->n_mats; j++)
        clb_swap_section(first + x->rel[j], st->table + (size_t)(x->entry + j) *
                         COLIBRI_ENTRY_SIZE, st->be, st->group);
    return COLIBRI_OK;
}

/* Where fill f's bytes are: the file offset a of the first, and `mem`
 * holding them from there (the map's view of the file, or the slot). */
static uint8_t *fill_bytes(const clb_fill *f, uint64_t *a)
{
    const clb_stream *st = f->st;
    uint64_t b;
    read_range(st, &st->experts[f->idx], a, &b);
#if CLB_STREAM_MAP
    if (f->shown)
        return (uint8_t *)(uintptr_t)(st->map.base + *a);
#endif
    return st->slots[f->slot].mem;
}

void clb_fill_run(clb_fill *f, int (*read)(void *user, uint64_t off, void *dst, size_t n),
                  void *user)
{
    const clb_stream *st = f->st;
    const clb_stream_expert *x = &st->experts[f->idx];
    char ignored[DETAIL_CAP];
    uint64_t a, b;
    read_range(st, x, &a, &b);
    f->shown = 0;
#if CLB_STREAM_MAP
    f->shown = f->may_show && st->map.show &&
               st->map.show(st->map.user, x->off, x->span) == 1;
#endif
    f->read_rc = f->shown ? 0 : read(user, a, st->slots[f->slot].mem, (size_t)(b - a));
    f->check_rc = 0;
    if (f->shown)
        f->check_rc = check_expert(st, x, a, fill_bytes(f, &a), ignored);
}

/* The fill of slot s is over (the asynchronous reader's fills finish in
 * the order they started): waited for, and what it did taken over. */
static void finish_fill(clb_stream *st, clb_slot *s)
{
    if (s->fill.queued)
        st->io.finish(st->io.user);
    s->pending = 0;
    s->mapped = s->fill.shown;
    if (!s->fill.shown && s->fill.read_rc != CLB_READ_CANCELLED)
        s->touched = 1;
}

/* Slot s no longer uses the map's bytes of expert x. */
static void unshow(clb_stream *st, clb_slot *s, const clb_stream_expert *x)
{
#if CLB_STREAM_MAP
    if (!s->mapped)
        return;
    st->map.hide(st->map.user, x->off, x->span);
    s->mapped = 0;
#else
    (void)st;
    (void)s;
    (void)x;
#endif
}

/* Finish the oldest read in flight: its expert checked and its slot given
 * the expert's views, or its slot left empty: a cancelled read (COLIBRI_OK),
 * a failed read or a damaged expert (the error, with detail, counted).
 * *idx receives the expert. */
static int complete_oldest(const clb_plan *p, uint32_t *idx, char *detail)
{
    clb_stream *st = p->stream;
    uint32_t i = st->fifo[st->fifo_head];
    st->fifo_head = (st->fifo_head + 1) % CLB_STREAM_FIFO;
    st->fifo_len--;
    *idx = i;
    clb_stream_expert *x = &st->experts[i];
    uint32_t si = (uint32_t)x->fetching, layer = i / st->n_experts,
             expert = i % st->n_experts;
    clb_slot *s = &st->slots[si];
    x->fetching = -1;
    uint64_t a, b;
    read_range(st, x, &a, &b);
    finish_fill(st, s);
    const clb_fill *f = &s->fill;
    if (f->read_rc == CLB_READ_CANCELLED) { /* a prefetch the routing did not use */
        x->prefetched = 0;
        return COLIBRI_OK;
    }
    int rc = f->check_rc;
    uint8_t *mem = fill_bytes(f, &a);
    if (f->read_rc != 0) {
        clb_detail(detail, DETAIL_CAP, "reading expert %u of layer %u (%llu bytes "
                   "at offset %llu) failed", (unsigned)expert, (unsigned)layer,
                   (unsigned long long)(b - a), (unsigned long long)a);
        rc = COLIBRI_E_IO;
    } else if (!f->shown) { /* read: checked here (clb_fill_run) */
        st->st.bytes_read += (b < st->file_size ? b : st->file_size) - a;
        rc = check_expert(st, x, a, mem, detail);
    } else if (rc) { /* its detail: the same check again, here */
        (void)check_expert(st, x, a, mem, detail);
    }
    if (rc) {
        st->st.errors++;
        x->prefetched = 0;
        unshow(st, s, x);
        return rc;
    }
    const uint8_t *data = mem + (x->off - a);
    /* The expert's own views: its entries' shapes and dtypes, its slot's
     * bytes (the plan's views of it carry no data). */
    const clb_expert *meta = &p->layers[layer].experts[expert];
    s->views = *meta;
    clb_weight *w[3] = { &s->views.w1, x->n_mats == 3 ? &s->views.w3 : &s->views.w2,
                         &s->views.w2 };
    for (uint32_t j = 0; j < x->n_mats && j < 3u; j++) { /* n_mats: 2 or 3 */
        const uint8_t *en = st->table + (size_t)(x->entry + j) * COLIBRI_ENTRY_SIZE;
        *w[j] = clb_weight_at(data + x->rel[j], en, st->be, st->group);
    }
    s->expert = (int32_t)i;
    x->slot = (int32_t)si;
    st->st.mapped += s->mapped;
    return COLIBRI_OK;
}

/* Give expert idx, which no slot holds and no read brings, the policy's
 * slot (victim's now, keep_layer, keep) and start its read: through the
 * asynchronous reader where the instance has one, else now. The oldest
 * reads in flight are finished first where the reader holds no more, or
 * where every slot is taken by one (never with a prefetch: it gives up
 * instead). 0, or -1 when a prefetch finds no slot. */
static int start_read(const clb_plan *p, uint32_t idx, uint32_t now,
                      uint32_t keep_layer, const uint32_t *keep)
{
    clb_stream *st = p->stream;
    char ignored[DETAIL_CAP];
    uint32_t done, cap = st->io.start && st->io.capacity < CLB_STREAM_FIFO
                         ? st->io.capacity : CLB_STREAM_FIFO;
    uint32_t si = victim(st, now, keep_layer, keep);
    while (!keep && st->fifo_len && (st->fifo_len >= cap || si == UINT32_MAX)) {
        (void)complete_oldest(p, &done, ignored); /* its take reports a failure */
        si = victim(st, now, keep_layer, keep);
    }
    if (si == UINT32_MAX || st->fifo_len >= cap)
        return -1;
    clb_stream_expert *x = &st->experts[idx];
    clb_slot *s = &st->slots[si];
    if (s->expert >= 0) {
        clb_stream_expert *old = &st->experts[s->expert];
        old->slot = -1;
        old->prefetched = 0;
        st->st.evictions++;
        unshow(st, s, old);
    }
    s->expert = -1; /* until the fill and its checks succeed */
    s->pending = 1;
    s->mapped = 0;
    s->last_use = st->tick;
    x->fetching = (int32_t)si;
    st->fifo[(st->fifo_head + st->fifo_len++) % CLB_STREAM_FIFO] = idx;
    /* A slot no read has touched takes the expert from the page cache if
     * the map shows it there (stream.h clb_stream_map): its memory, then,
     * stays untouched, and RSS grows by the expert, not by both. */
    s->fill = (clb_fill){ st, idx, si, !s->touched, 0, 0, -1, 0 };
    if (st->io.start && st->io.start(st->io.user, &s->fill) == 0)
        s->fill.queued = 1;
    else if (!st->io.start)
        clb_fill_run(&s->fill, st->rd.read, st->rd.user);
    return 0;
}

/* A use of expert x, which slot s holds: a hit (and a prefetch's hit the
 * first time a prefetched expert is used). */
static void use_held(clb_stream *st, clb_stream_expert *x, clb_slot *s)
{
    s->last_use = st->tick;
    count_use(st, x);
    st->st.hits++;
    if (x->prefetched) {
        x->prefetched = 0;
        st->st.prefetch_hits++;
    }
}

/* clb_plan.held of a streamed instance (internal.h). */
static int stream_held(const clb_plan *p, uint32_t layer, uint32_t expert,
                       const clb_expert **ex)
{
    clb_stream *st = p->stream;
    clb_stream_expert *x = &st->experts[layer * st->n_experts + expert];
    st->tick++;
    if (x->fetching >= 0) {
        x->awaited = 1;
        return CLB_IN_FLIGHT; /* a use, counted when taken */
    }
    if (x->slot < 0)
        return CLB_ABSENT;
    clb_slot *s = &st->slots[x->slot];
    use_held(st, x, s);
    *ex = &s->views;
    return CLB_HELD;
}

/* clb_plan.fetch: start the read of expert (layer, expert) in the policy's
 * slot, unless a read of it is in flight (a prefetch's) or a slot has it
 * by now (that read finished while an older one was taken). What the read
 * gave is stream_take's. */
static void stream_fetch(const clb_plan *p, uint32_t layer, uint32_t expert)
{
    clb_stream *st = p->stream;
    uint32_t idx = layer * st->n_experts + expert;
    clb_stream_expert *x = &st->experts[idx];
    if (x->fetching >= 0 || x->slot >= 0)
        return;
    st->tick++;
    st->st.misses++;
    count_use(st, x);
    x->awaited = 1;
    (void)start_read(p, idx, layer, 0, NULL); /* a slot, always: see start_read */
}

/* After a failed take: every other read in flight finished and its slot
 * left empty, so the instance starts the next call with none. */
static void drain(clb_stream *st)
{
    for (; st->fifo_len; st->fifo_len--) {
        clb_stream_expert *x = &st->experts[st->fifo[st->fifo_head]];
        st->fifo_head = (st->fifo_head + 1) % CLB_STREAM_FIFO;
        finish_fill(st, &st->slots[x->fetching]);
        unshow(st, &st->slots[x->fetching], x);
        x->fetching = -1;
        x->prefetched = 0;
    }
    for (uint32_t i = 0; i < st->n_exp; i++)
        st->experts[i].awaited = 0;
}

/* clb_plan.take: the expert stream_fetch (or a prefetch) started reading,
 * once read and checked: COLIBRI_OK with *ex, or the error of reading or
 * checking it (its slot left empty, and every other read in flight
 * drained). Older reads finish first; one of them that fails is counted
 * and its slot left empty: its expert is read again when a pass needs it,
 * and that read reports the error. */
static int stream_take(const clb_plan *p, uint32_t layer, uint32_t expert,
                       const clb_expert **ex, char *detail)
{
    clb_stream *st = p->stream;
    uint32_t idx = layer * st->n_experts + expert;
    clb_stream_expert *x = &st->experts[idx];
    if (x->fetching < 0 && x->slot < 0)
        stream_fetch(p, layer, expert); /* its read finished early and failed */
    x->awaited = 0; /* running now: from here on the policy may give it up */
    while (x->fetching >= 0) {
        uint32_t done;
        int rc = complete_oldest(p, &done, detail);
        if (rc && done == idx) {
            drain(st);
            return rc;
        }
    }
    if (x->slot < 0) { /* no slot for it: not with the read-ahead's limits */
        clb_detail(detail, DETAIL_CAP, "no slot for expert %u of layer %u",
                   (unsigned)expert, (unsigned)layer);
        drain(st);
        return COLIBRI_E_IO;
    }
    clb_slot *s = &st->slots[x->slot];
    if (x->prefetched) /* the use stream_held found in flight */
        use_held(st, x, s);
    *ex = &s->views;
    return COLIBRI_OK;
}

#if CLB_STREAM_PREFETCH
/* clb_plan.prefetch: the experts votes [E] predict for layer `layer`, most
 * votes first (the lower index among equals), up to the instance's
 * prefetch count, each neither held nor in flight given a slot the policy
 * gives up as after the layer before (never one holding a predicted expert
 * of this layer) and its read started. */
static void stream_prefetch(const clb_plan *p, uint32_t layer, const uint32_t *votes)
{
    clb_stream *st = p->stream;
    uint32_t E = st->n_experts, before = (layer + st->n_layers - 1) % st->n_layers;
    for (uint32_t k = 0, last = UINT32_MAX, last_e = 0; k < st->st.prefetch; k++) {
        /* the next in (votes descending, index ascending) order */
        uint32_t pick = UINT32_MAX;
        for (uint32_t e = 0; e < E; e++) {
            uint32_t v = votes[e];
            int after_last = last == UINT32_MAX || v < last || (v == last && e > last_e);
            if (v && after_last && (pick == UINT32_MAX || v > votes[pick]))
                pick = e;
        }
        if (pick == UINT32_MAX)
            return;
        last = votes[pick];
        last_e = pick;
        uint32_t idx = layer * E + pick;
        clb_stream_expert *x = &st->experts[idx];
        if (x->slot >= 0 || x->fetching >= 0)
            continue;
        if (start_read(p, idx, before, layer, votes))
            return;
        x->prefetched = 1;
        st->st.prefetched++;
    }
}

/* clb_plan.settle: the reads of experts a prefetch predicted and no pass
 * took, finished (a failure is counted; the expert is read again if used). */
static void stream_settle(const clb_plan *p)
{
    char ignored[DETAIL_CAP];
    uint32_t done;
    while (p->stream->fifo_len)
        (void)complete_oldest(p, &done, ignored);
}

#endif

void clb_stream_prefetch_on(clb_plan *p, uint32_t want)
{
#if CLB_STREAM_PREFETCH
    clb_stream *st = p->stream;
    uint32_t k = st->top_k, cap = st->io.capacity < CLB_STREAM_FIFO
                                  ? st->io.capacity : CLB_STREAM_FIFO;
    uint32_t n = want < k ? want : k;
    /* in flight at once: the prefetch and the read-ahead; the slots hold a
     * layer pass's experts twice over beside them (the read-ahead's rule) */
    if (n + p->read_ahead > cap)
        n = cap > p->read_ahead ? cap - p->read_ahead : 0;
    if (!st->io.start || (uint64_t)st->n_slots < 2ull * k + n + p->read_ahead)
        n = 0;
    st->st.prefetch = n;
    p->prefetch = n ? stream_prefetch : NULL;
    p->settle = n ? stream_settle : NULL;
#else
    (void)p;
    (void)want;
#endif
}

/* ------------------------------------------------------------------------ */
/* Building an instance                                                     */
/* ------------------------------------------------------------------------ */

/* Whether table entry en (the image's: experts CLB_NOT_RESIDENT) is a
 * resident section. */
static int resident_section(const clb_stream_geom *g, const uint8_t *en)
{
    return rd16(en + COLIBRI_ENT_KIND, g->be) != COLIBRI_KIND_DESC &&
           rd64(en + COLIBRI_ENT_OFFSET, g->be) != CLB_NOT_RESIDENT;
}

#if CLB_STREAM_MAP
/* The resident sections of a mapped file, checked in two halves (by bytes,
 * at file offset half_at) that may run on two threads: each half's first
 * damaged section (UINT32_MAX: none; its detail is found again after). */
typedef struct resident_check {
    const clb_stream_geom *g;
    const uint8_t *tab, *base;
    uint64_t half_at;
    uint32_t bad[2];
} resident_check;

static void check_resident_half(void *arg, int half)
{
    resident_check *c = (resident_check *)arg;
    const clb_stream_geom *g = c->g;
    char ignored[DETAIL_CAP];
    c->bad[half] = UINT32_MAX;
    for (uint32_t i = 0; i < g->s.n_tensors; i++) {
        const uint8_t *en = c->tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        uint64_t off = rd64(en + COLIBRI_ENT_OFFSET, g->be);
        if (!resident_section(g, en) || (off >= c->half_at) != half)
            continue;
        if (clb_check_section(c->base + off, en, i, g->s.group_size, g->be, ignored)) {
            c->bad[half] = i;
            return;
        }
    }
}

/* Check every resident section of a mapped file where it is (both halves
 * on two threads where the map offers them): COLIBRI_OK, or the first
 * damaged section's error, its detail from the same check run again. */
static int check_resident_mapped(const clb_stream_geom *g, const uint8_t *tab,
                                 const clb_stream_map *map, char *detail)
{
    resident_check c = { g, tab, map->base, UINT64_MAX, { 0, 0 } };
    uint64_t seen = 0;
    for (uint32_t i = 0; i < g->s.n_tensors && c.half_at == UINT64_MAX; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        if (!resident_section(g, en))
            continue;
        seen += rd64(en + COLIBRI_ENT_SIZE, g->be);
        if (seen >= g->resident_bytes / 2) /* sections are in file order */
            c.half_at = rd64(en + COLIBRI_ENT_OFFSET, g->be) + 1;
    }
    if (map->both) {
        map->both(check_resident_half, &c);
    } else {
        check_resident_half(&c, 0);
        check_resident_half(&c, 1);
    }
    uint32_t bad = c.bad[0] < c.bad[1] ? c.bad[0] : c.bad[1];
    if (bad == UINT32_MAX)
        return COLIBRI_OK;
    const uint8_t *en = tab + (size_t)bad * COLIBRI_ENTRY_SIZE;
    return clb_check_section(map->base + rd64(en + COLIBRI_ENT_OFFSET, g->be), en, bad,
                             g->s.group_size, g->be, detail);
}
#endif

int clb_stream_build(uint8_t *arena, const clb_stream_geom *g, const colibri_reader *rd,
                     const clb_stream_map *map, uint32_t align, uint32_t n_slots,
                     uint32_t policy, uint32_t chunk_limit, unsigned kv_dtype,
                     clb_plan **plan, char *detail)
{
    carver c = { arena, 0, 0 };
    clb_stream *st;
    clb_plan *p;
    uint8_t *mem;
    uint64_t slots_at;
    stream_layout(&c, g, n_slots, align, chunk_limit, kv_dtype, &st, &p, &mem, &slots_at);
    if (!st || !p || !mem || c.ovf) { /* the caller sized the arena with the same layout */
        clb_detail(detail, DETAIL_CAP, "the streamed layout does not fit the arena");
        return COLIBRI_E_NO_MEMORY;
    }
    st->rd = *rd;
#if CLB_STREAM_MAP
    if (map)
        st->map = *map;
#else
    map = NULL; /* no build without a mapping reader passes one */
#endif
    st->align = align;
    st->n_slots = n_slots;
    st->policy = policy;
    st->stride = clb_slot_stride(g, align);
    st->file_size = g->file_size;
    st->group = g->s.group_size;
    st->be = g->be;
    st->n_experts = g->s.n_experts;
    st->n_exp = (uint32_t)g->s.n_layers * g->s.n_experts;
    st->n_layers = g->s.n_layers;
    st->top_k = g->s.top_k;
    st->table = arena + COLIBRI_TABLE_OFFSET;
    st->st.slots = n_slots;
    st->st.policy = policy;
    st->st.slot_bytes = st->stride;
    st->st.resident_bytes = g->resident_bytes;
    st->st.resident_mapped = map != NULL;
    for (uint32_t i = 0; i < st->n_exp; i++)
        st->experts[i].slot = st->experts[i].fetching = -1;
    for (uint32_t s = 0; s < n_slots; s++) {
        st->slots[s].mem = mem + (size_t)s * st->stride;
        st->slots[s].expert = -1;
    }
    /* First the experts into the expert table (their entries rewritten
     * after their offset is read), hidden from a mapping a run of adjacent
     * ones at a time (a layer's, where the file keeps them together: one
     * call, not one an expert, so init sets up a few mappings, not
     * thousands); then the
     * resident sections (a mapping told of them all first) into the image,
     * each checked where it lands (or, mapped, where it is in the file, its
     * offset kept). */
    uint8_t *tab = arena + COLIBRI_TABLE_OFFSET;
    unsigned per = (g->d.features & COLIBRI_FEAT_RELU_FFN) ? 2u : 3u;
#if CLB_STREAM_MAP
    uint64_t run_off = 0, run_end = 0; /* the run of adjacent experts not hidden yet */
#endif
    for (uint32_t i = 0; i < g->s.n_tensors; i++) {
        uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, g->be);
        unsigned expert = rd16(en + COLIBRI_ENT_EXPERT, g->be);
        if (!is_expert_matrix(kind, expert))
            continue;
        unsigned layer = rd16(en + COLIBRI_ENT_LAYER, g->be);
        uint64_t off = rd64(en + COLIBRI_ENT_OFFSET, g->be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, g->be);
        clb_stream_expert *x = &st->experts[layer * g->s.n_experts + expert];
        if (kind == COLIBRI_KIND_EXPERT_W1) {
            x->off = off;
            x->entry = i;
            x->n_mats = (uint8_t)per;
        }
        uint32_t j = kind == COLIBRI_KIND_EXPERT_W1 ? 0
                   : kind == COLIBRI_KIND_EXPERT_W3 || per == 2 ? 1 : 2;
        x->rel[j] = (uint32_t)(off - x->off);
        x->span = off + sz - x->off;
        wr64(en + COLIBRI_ENT_OFFSET, CLB_NOT_RESIDENT, g->be);
#if CLB_STREAM_MAP
        if (map && map->hide && kind == COLIBRI_KIND_EXPERT_W2) { /* its last */
            /* the next section is at align64 of the one before (FORMAT.md) */
            if (run_end > run_off && x->off != up(run_end, 64)) {
                map->hide(map->user, run_off, run_end - run_off);
                run_off = run_end;
            }
            if (run_end == run_off)
                run_off = x->off;
            run_end = x->off + x->span;
        }
#endif
    }
#if CLB_STREAM_MAP
    if (map && map->hide && run_end > run_off)
        map->hide(map->user, run_off, run_end - run_off);
    for (uint32_t i = 0; map && map->want && i < g->s.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        if (resident_section(g, en))
            map->want(map->user, rd64(en + COLIBRI_ENT_OFFSET, g->be),
                      rd64(en + COLIBRI_ENT_SIZE, g->be));
    }
#endif
    uint64_t pos = up(g->prefix_bytes, 64);
    int host_be = host_is_big_endian();
    /* read into the image unless mapped (then checked below, where they are) */
    for (uint32_t i = 0; !map && i < g->s.n_tensors; i++) {
        uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        uint64_t off = rd64(en + COLIBRI_ENT_OFFSET, g->be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, g->be);
        if (!resident_section(g, en))
            continue;
        if (sz && rd->read(rd->user, off, arena + pos, (size_t)sz) != 0) {
            clb_detail(detail, DETAIL_CAP, "reading tensor %u (%llu bytes at offset "
                       "%llu) failed", (unsigned)i, (unsigned long long)sz,
                       (unsigned long long)off);
            return COLIBRI_E_IO;
        }
        int rc = clb_check_section(arena + pos, en, i, g->s.group_size, g->be, detail);
        if (rc)
            return rc;
        if (g->be != host_be)
            clb_swap_section(arena + pos, en, g->be, g->s.group_size);
        wr64(en + COLIBRI_ENT_OFFSET, pos, g->be);
        pos = up(pos + sz, 64);
    }
#if CLB_STREAM_MAP
    if (map) { /* the caller's promise: the host's byte order */
        int rc = check_resident_mapped(g, tab, map, detail);
        if (rc)
            return rc;
    }
#endif
    clb_build_plan(p, arena, CLB_STREAM_MAP && map ? map->base : arena, g->be,
                   clb_pick_kernels());
    p->stream = st;
    p->held = stream_held;
    p->fetch = stream_fetch;
    p->take = stream_take;
    p->routed = stream_routed;
    /* two reads in flight at most: the next expert's while one computes
     * (more would keep slots from the policy for little: an expert is one
     * large read), and only with room beyond a layer pass's top_k of them:
     * with fewer, a slot kept by its read in flight is one the policy would
     * have kept for another layer (on the demo model at 2 slots, every hit) */
    p->read_ahead = n_slots > 2u * g->s.top_k ? 2u : 1u;
    *plan = p;
    return COLIBRI_OK;
}

int colibri_get_stream_stats(colibri_model *m, colibri_stream_stats *out, int reset)
{
    if (!m || !out)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != CLB_MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    clb_stream *st = ((clb_plan *)m->priv_.plan)->stream;
    memset(out, 0, sizeof *out);
    if (!st)
        return COLIBRI_OK;
    *out = st->st;
    if (st->read_ns)
        out->read_ns = *st->read_ns;
    if (st->wait_ns)
        out->wait_ns = *st->wait_ns;
    if (reset) {
        st->st.hits = st->st.misses = st->st.evictions = 0;
        st->st.bytes_read = st->st.errors = st->st.mapped = 0;
        st->st.prefetched = st->st.prefetch_hits = st->st.prefetch_cancelled = 0;
        if (st->read_ns)
            *st->read_ns = 0;
        if (st->wait_ns)
            *st->wait_ns = 0;
    }
    return COLIBRI_OK;
}
