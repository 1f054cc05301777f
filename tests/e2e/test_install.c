/* The installed package as a user takes it: `cmake --install` into a fresh
 * prefix, then exactly the README's command, `cc prog.c $(pkg-config
 * --cflags --libs kvtier)`, for the shipped examples; the programs run
 * against the installed shared library (by its soname) and pass. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/run.h"
#include "kvtier/version.h"

static run_result_t sh(const char *cmd) { return run_argv((const char *const[]){"/bin/sh", "-c", cmd, NULL}); }

static char g_prefix[64];

static void install_once(void) {
    if (g_prefix[0]) return;
    snprintf(g_prefix, sizeof(g_prefix), "/tmp/kvt-install-XXXXXX");
    cr_assert_not_null(mkdtemp(g_prefix));
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cmake --install '%s' --prefix '%s'", KVT_BUILD_DIR, g_prefix);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "%s\n%s", r.out, r.err);
    run_free(&r);
}

static void cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_prefix);
    run_result_t r = sh(cmd);
    run_free(&r);
}

/* Builds examples/NAME.c against the installed package and runs it. */
static void build_and_run(const char *name) {
    install_once();
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; export PKG_CONFIG_PATH=\"$(find \"$PWD\" -name kvtier.pc -printf '%%h')\"; "
             "cc '%s/examples/%s.c' $(pkg-config --cflags --libs kvtier) %s -o %s; "
             "LD_LIBRARY_PATH=\"$(pkg-config --variable=libdir kvtier)\" ./%s; "
             "LD_LIBRARY_PATH=\"$(pkg-config --variable=libdir kvtier)\" ldd ./%s | grep libkvtier",
             g_prefix, KVT_SOURCE_DIR, name, KVT_TEST_LINK_FLAGS, name, name, name);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "%s: exit %d\n%s\n%s", name, r.status, r.out, r.err);
    cr_assert(strstr(r.out, "\nok\n"), "%s ran: %s", name, r.out);
    char want[128];
    snprintf(want, sizeof(want), "libkvtier.so.%d => %s/", KVT_VERSION_MAJOR, g_prefix);
    cr_assert(strstr(r.out, want), "linked against the installed shared library by its soname: %s", r.out);
    run_free(&r);
}

Test(install, readme_command_builds_the_cache_example, .timeout = 120, .fini = cleanup) { build_and_run("cache_basic"); }
Test(install, readme_command_builds_the_engine_tier_example, .timeout = 120, .fini = cleanup) { build_and_run("engine_cache"); }
Test(install, readme_command_builds_the_pd_example, .timeout = 120, .fini = cleanup) { build_and_run("pd_threads"); }
Test(install, readme_command_builds_the_cp_group_example, .timeout = 120, .fini = cleanup) { build_and_run("cp_group"); }

/* The static library is there too, with its dependencies behind --static. */
Test(install, static_library_links_with_pkg_config_static, .timeout = 120, .fini = cleanup) {
    install_once();
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; export PKG_CONFIG_PATH=\"$(find \"$PWD\" -name kvtier.pc -printf '%%h')\"; "
             "cc '%s/examples/cache_basic.c' -static-libgcc $(pkg-config --cflags kvtier) "
             "\"$(pkg-config --variable=libdir kvtier)/libkvtier.a\" $(pkg-config --static --libs-only-other --libs-only-l kvtier | "
             "sed 's/-lkvtier//') %s -o cache_static; ./cache_static; ldd ./cache_static | grep -c libkvtier || true",
             g_prefix, KVT_SOURCE_DIR, KVT_TEST_LINK_FLAGS);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "exit %d\n%s\n%s", r.status, r.out, r.err);
    cr_assert(strstr(r.out, "\nok\n0\n"), "ran, with no libkvtier.so: %s", r.out);
    run_free(&r);
}

/* libkvtier.so exports exactly the functions the public headers declare
 * (KVT_API), all kvt_*, and none of the internals (kvt__*); and the headers
 * mark every public declaration (scripts/export-decls --check). */
Test(install, shared_library_exports_only_the_public_api, .timeout = 60) {
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; scripts/export-decls --check; "
             "grep -ho '^KVT_API[^(]*\\bkvt_[a-z0-9_]*(' include/kvtier/*.h | grep -o 'kvt_[a-z0-9_]*($' | tr -d '(' | sort -u > /tmp/kvt-h.$$; "
             "nm -D --defined-only '%s/libkvtier.so' | awk '{print $3}' | sort -u > /tmp/kvt-e.$$; "
             "echo declared $(wc -l < /tmp/kvt-h.$$) exported $(wc -l < /tmp/kvt-e.$$); "
             "grep -v '^kvt_' /tmp/kvt-e.$$ | sed 's/^/not kvt_: /' || true; grep '^kvt__' /tmp/kvt-e.$$ | sed 's/^/internal: /' || true; "
             "diff /tmp/kvt-h.$$ /tmp/kvt-e.$$ | sed 's/^/diff: /' || true; rm -f /tmp/kvt-h.$$ /tmp/kvt-e.$$",
             KVT_SOURCE_DIR, KVT_BUILD_DIR);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "%s\n%s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "declared "), "%s", r.out);
    unsigned declared = 0, exported = 0;
    cr_assert_eq(sscanf(strstr(r.out, "declared "), "declared %u exported %u", &declared, &exported), 2);
    cr_assert_gt(declared, 100, "the public API: %s", r.out);
    cr_assert_null(strstr(r.out, "not kvt_:"), "%s", r.out);
    cr_assert_null(strstr(r.out, "internal:"), "%s", r.out);
    cr_assert_null(strstr(r.out, "diff:"), "declared and exported differ: %s", r.out);
    cr_assert_eq(declared, exported);
    run_free(&r);
}
