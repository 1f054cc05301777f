/* Test helper: the text an emitter writes, for the tests that read it back. */
#ifndef KVTIER_TESTS_EMIT_H
#define KVTIER_TESTS_EMIT_H

#include <stdio.h>

#include "kvtier/stats.h"

/* What e writes (kvt_emitter_write's code in *rc), e destroyed; free() it. */
static inline char *emit_text(kvt_emitter_t *e, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *rc = kvt_emitter_write(e, f);
    fclose(f);
    kvt_emitter_destroy(e);
    return buf;
}

#endif
