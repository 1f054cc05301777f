/* How runs become spans between any two tiers (see xfer-int.h). */
#include "xfer-int.h"

/* Whether, on tier t, plane `to` continues plane `from` in memory. */
static bool continues(const kvt_tier_t *t, uint32_t from, uint32_t to) {
    return to == from || (to == from + 1 && t->fuse[from]);
}

void kvt__plan_make(kvt__plan_t *pl, const kvt_tier_t *s, const kvt_tier_t *d) {
    const kvt_geom_t *g = &s->cfg.geom;
    *pl = (kvt__plan_t){.layers = g->layers, .page_bytes = kvt_geom_page_bytes(g)};
    if (s->page_block && d->page_block) { /* one chunk, the whole page */
        bool run = s->planes[0].page_stride == pl->page_bytes && d->planes[0].page_stride == pl->page_bytes;
        pl->kind = run ? KVT__PLAN_RUN : KVT__PLAN_PAGE;
        pl->fixed = run;
        pl->per_page = !run;
        return;
    }
    pl->kind = KVT__PLAN_CHUNKS;
    uint32_t i = 0, j = 0, li = 0, lj = 0;
    for (uint64_t pos = 0; pos < g->layer_bytes;) {
        const kvt__plane_t *a = &s->planes[i], *b = &d->planes[j];
        uint64_t aend = a->lofs + a->piece, bend = b->lofs + b->piece, end = aend < bend ? aend : bend;
        if (pl->nchunks > 0 && continues(s, li, i) && continues(d, lj, j)) {
            pl->chunk[pl->nchunks - 1].len += end - pos;
        } else {
            pl->chunk[pl->nchunks++] = (kvt__chunk_t){end - pos, pos - a->lofs, pos - b->lofs, (uint8_t)i, (uint8_t)j, false};
        }
        li = i;
        lj = j;
        pos = end;
        i += pos == aend;
        j += pos == bend;
    }
    for (uint32_t c = 0; c < pl->nchunks; c++) {
        kvt__chunk_t *ch = &pl->chunk[c];
        ch->runs = s->planes[ch->sp].page_stride == ch->len && d->planes[ch->dp].page_stride == ch->len;
        if (ch->runs) pl->fixed += g->layers;
        else pl->per_page += g->layers;
    }
}

/* A span between two addresses (a remote tier's are offsets: origin 0). */
static inline kvt__span_t span(const kvt_tier_t *d, uintptr_t da, const kvt_tier_t *s, uintptr_t sa, uint64_t len) {
    uint64_t off = d->remote ? da : d->base ? da - (uintptr_t)d->base : 0;
    return (kvt__span_t){d->remote ? NULL : (void *)da, s->remote ? NULL : (const void *)sa, (size_t)len, off};
}

size_t kvt__plan_emit(const kvt__plan_t *pl, const kvt_tier_t *d, uint32_t dst, const kvt_tier_t *s, uint32_t src,
                      uint32_t len, kvt__span_t *out) {
    const kvt__plane_t *s0 = &s->planes[0], *d0 = &d->planes[0];
    size_t n = 0;
    switch (pl->kind) {
    case KVT__PLAN_RUN:
        out[n++] = span(d, kvt__plane_at(d0, dst, 0), s, kvt__plane_at(s0, src, 0), (uint64_t)len * pl->page_bytes);
        break;
    case KVT__PLAN_PAGE:
        for (uint32_t p = 0; p < len; p++)
            out[n++] = span(d, kvt__plane_at(d0, dst + p, 0), s, kvt__plane_at(s0, src + p, 0), pl->page_bytes);
        break;
    case KVT__PLAN_CHUNKS:
        for (uint32_t l = 0; l < pl->layers; l++)
            for (uint32_t c = 0; c < pl->nchunks; c++) {
                const kvt__chunk_t *ch = &pl->chunk[c];
                const kvt__plane_t *sp = &s->planes[ch->sp], *dp = &d->planes[ch->dp];
                uintptr_t sa = kvt__plane_at(sp, src, l) + ch->soff, da = kvt__plane_at(dp, dst, l) + ch->doff;
                if (ch->runs) {
                    out[n++] = span(d, da, s, sa, (uint64_t)len * ch->len);
                    continue;
                }
                for (uint32_t p = 0; p < len; p++)
                    out[n++] = span(d, da + (uintptr_t)(p * dp->page_stride), s, sa + (uintptr_t)(p * sp->page_stride),
                                    ch->len);
            }
        break;
    }
    return n;
}
