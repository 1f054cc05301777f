/* What the fuzz targets share (docs/reliability.md, "Fuzzing"): a reader
 * that turns the input into choices, and the one way a target reports a
 * finding (a message, then abort(): libFuzzer keeps the input).
 *
 * A target's C library messages (a command's "bad flag" line, a store's
 * log) go nowhere: fuzz_quiet() points stdio's stdout and stderr at
 * /dev/null. libFuzzer and the sanitizers write to file descriptor 2
 * through their own streams, so findings are still reported. */
#ifndef KVTIER_TESTS_FUZZ_H
#define KVTIER_TESTS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The input as a stream of choices; past its end every read gives 0. */
typedef struct fz {
    const uint8_t *p;
    size_t n, at;
} fz_t;

static inline fz_t fz_of(const uint8_t *p, size_t n) { return (fz_t){p, n, 0}; }
static inline bool fz_more(const fz_t *f) { return f->at < f->n; }
static inline size_t fz_left(const fz_t *f) { return f->n - f->at; }
static inline uint8_t fz_u8(fz_t *f) { return f->at < f->n ? f->p[f->at++] : 0; }
static inline uint16_t fz_u16(fz_t *f) { return (uint16_t)(fz_u8(f) | fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz_t *f) { return (uint32_t)fz_u16(f) | (uint32_t)fz_u16(f) << 16; }
static inline uint64_t fz_u64(fz_t *f) { return (uint64_t)fz_u32(f) | (uint64_t)fz_u32(f) << 32; }
/* A choice in [0, n), n >= 1. */
static inline uint32_t fz_below(fz_t *f, uint32_t n) { return n <= 256 ? fz_u8(f) % n : fz_u32(f) % n; }

#include "kvtier/error.h"

/* rc is one of the library's error codes (KVT_E*: negative, and named). */
static inline bool fz_kvt_err(int rc) { return rc < 0 && strcmp(kvt_err_name(rc), kvt_err_name(-100000)) != 0; }

static FILE *fz_err_;

#define FZ_FAIL(...)                                                                \
    do {                                                                            \
        FILE *fz_f_ = fz_err_ ? fz_err_ : stderr;                                   \
        fprintf(fz_f_, "fuzz finding at %s:%d: ", __FILE__, __LINE__);             \
        fprintf(fz_f_, __VA_ARGS__);                                                \
        fputc('\n', fz_f_);                                                         \
        fflush(fz_f_);                                                              \
        abort();                                                                    \
    } while (0)
/* cond, then a printf format and its arguments. */
#define FZ_ASSERT(cond, ...)                                                        \
    do {                                                                            \
        if (!(cond)) FZ_FAIL("'" #cond "' does not hold: " __VA_ARGS__);           \
    } while (0)

/* stdio's stdout and stderr to /dev/null; findings keep a stream of their own. */
static inline void fuzz_quiet(void) {
    if (fz_err_) return;
    fz_err_ = fdopen(dup(2), "w");
    if (fz_err_ == NULL) fz_err_ = stderr;
    else setvbuf(fz_err_, NULL, _IONBF, 0);
    if (getenv("KVT_FUZZ_VERBOSE")) return;
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        stdout = null;
        stderr = null;
    }
}

#endif
