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

/* The soname version.h gives (docs/abi.md): MAJOR, and 0.MINOR before 1.0. */
static void soname(char *out, size_t n) {
    if (KVT_VERSION_MAJOR == 0) snprintf(out, n, "libkvtier.so.0.%d", KVT_VERSION_MINOR);
    else snprintf(out, n, "libkvtier.so.%d", KVT_VERSION_MAJOR);
}

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
    char want[256], so[64];
    soname(so, sizeof(so));
    snprintf(want, sizeof(want), "%s => %s/", so, g_prefix);
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
 * mark every public declaration (scripts/export-decls --check). The same set
 * is docs/exports.txt, the list an integrator reads, so an export comes or
 * goes only with an edit of that list. */
Test(install, shared_library_exports_only_the_public_api, .timeout = 60) {
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; scripts/export-decls --check; "
             "grep -ho '^KVT_API[^(]*\\bkvt_[a-z0-9_]*(' include/kvtier/*.h | grep -o 'kvt_[a-z0-9_]*($' | tr -d '(' | sort -u > /tmp/kvt-h.$$; "
             "nm -D --defined-only '%s/libkvtier.so' | awk '{print $3}' | sort -u > /tmp/kvt-e.$$; "
             "echo declared $(wc -l < /tmp/kvt-h.$$) exported $(wc -l < /tmp/kvt-e.$$); "
             "grep -v '^kvt_' /tmp/kvt-e.$$ | sed 's/^/not kvt_: /' || true; grep '^kvt__' /tmp/kvt-e.$$ | sed 's/^/internal: /' || true; "
             "diff /tmp/kvt-h.$$ /tmp/kvt-e.$$ | sed 's/^/diff: /' || true; "
             "grep -v '^#' docs/exports.txt | diff - /tmp/kvt-e.$$ | sed 's/^/listed: /' || true; rm -f /tmp/kvt-h.$$ /tmp/kvt-e.$$",
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
    cr_assert_null(strstr(r.out, "listed:"), "docs/exports.txt and the exports differ: %s", r.out);
    cr_assert_eq(declared, exported);
    run_free(&r);
}

/* What is installed carries no test hook: neither the testing library's
 * functions (kvtier/testing.h) in libkvtier.so or libkvtier.a, nor its
 * header, nor kvtier-test; and the command knows none of its test-only
 * options and environment hooks. */
Test(install, no_test_hooks_are_installed, .timeout = 120, .fini = cleanup) {
    install_once();
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "cd '%s'; lib=$(find . -name libkvtier.so -type l -o -name libkvtier.so -type f | head -1); "
             "a=$(find . -name libkvtier.a | head -1); echo \"lib $lib a $a\"; "
             "grep -ho '^KVT_API[^(]*\\bkvt_[a-z0-9_]*(' '%s/src/testing/include/kvtier/testing.h' | grep -o 'kvt_[a-z0-9_]*($' | tr -d '(' > /tmp/kvt-t.$$; "
             "echo hooks $(wc -l < /tmp/kvt-t.$$); "
             "for f in $(cat /tmp/kvt-t.$$); do nm -D --defined-only \"$lib\" | grep -qw \"$f\" && echo \"exported: $f\"; "
             "nm --defined-only \"$a\" 2>/dev/null | grep -qw \"$f\" && echo \"in libkvtier.a: $f\"; done; "
             "find . -name testing.h -o -name 'libkvtier-testing*' -o -name kvtier-test | sed 's/^/installed: /'; "
             "for s in KVT_PD_TEST_PEERS KVT_PD_DECODE_KILL KVT_PD_KILL KVT_CP_KILL KVT_CP_DIVERGE KVT_COPY_FAULTS l3-delay; do "
             "grep -qa \"$s\" bin/kvtier && echo \"in kvtier: $s\"; done; "
             "bin/kvtier replay --data --copy-faults 0.1 >/dev/null 2>/tmp/kvt-c.$$; echo copy-faults exit $?; "
             "rm -f /tmp/kvt-t.$$ /tmp/kvt-c.$$",
             g_prefix, KVT_SOURCE_DIR);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "%s\n%s", r.out, r.err);
    unsigned hooks = 0;
    cr_assert_not_null(strstr(r.out, "hooks "), "%s", r.out);
    sscanf(strstr(r.out, "hooks "), "hooks %u", &hooks);
    cr_assert_geq(hooks, 7, "the testing header's functions were read: %s", r.out);
    cr_assert_null(strstr(r.out, "lib  "), "libkvtier.so installed: %s", r.out);
    cr_assert_null(strstr(r.out, "exported:"), "%s", r.out);
    cr_assert_null(strstr(r.out, "in libkvtier.a:"), "%s", r.out);
    cr_assert_null(strstr(r.out, "installed:"), "%s", r.out);
    cr_assert_null(strstr(r.out, "in kvtier:"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "copy-faults exit 2"), "an unknown flag to kvtier: %s", r.out);
    run_free(&r);
}

/* The version is one: include/kvtier/version.h, the shared library's soname
 * and the library's own kvt_version() agree (the Python package's version
 * comes from version.h too: python/tests/test_wheel.py checks the wheel's). */
Test(install, version_h_soname_and_library_agree, .timeout = 60) {
    char cmd[1024], so[64];
    soname(so, sizeof(so));
    snprintf(cmd, sizeof(cmd), "readelf -d '%s/libkvtier.so' | grep SONAME; '%s' version", KVT_BUILD_DIR, KVT_CLI_PATH);
    run_result_t r = sh(cmd);
    cr_assert_eq(r.status, 0, "%s\n%s", r.out, r.err);
    char want[96];
    snprintf(want, sizeof(want), "Library soname: [%s]", so);
    cr_assert_not_null(strstr(r.out, want), "version.h says %s: %s", so, r.out);
    char v[32];
    snprintf(v, sizeof(v), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH);
    cr_assert_not_null(strstr(r.out, v), "the library says %s: %s", v, r.out);
    cr_assert_eq(kvt_version(), (unsigned)KVT_VERSION_NUMBER);
    run_free(&r);
}
