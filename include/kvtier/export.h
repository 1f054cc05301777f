/* kvtier — what the shared library exports.
 *
 * libkvtier is built with hidden visibility: only declarations marked
 * KVT_API (every public function, all named kvt_*) leave libkvtier.so; the
 * library's internals (kvt__*) stay inside it. tests/e2e/test_install.c
 * checks the exported set against the public headers. */
#ifndef KVTIER_EXPORT_H
#define KVTIER_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#endif
