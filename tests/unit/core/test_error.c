#include <criterion/criterion.h>
#include <string.h>

#include "kvtier/error.h"

/* Every code in the list has a distinct name of the form KVT_<NAME> and a
 * message of its own; unknown codes get the fallback. */
Test(error, names_and_messages_are_distinct) {
    static const struct { int code; const char *name; const char *msg; } all[] = {
#define E_(name, val, msg) {val, "KVT_" #name, msg},
        KVT_ERRNO_MAP(E_)
#undef E_
    };
    size_t n = sizeof(all) / sizeof(all[0]);
    cr_assert_geq(n, 16);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(kvt_err_name(all[i].code), all[i].name);
        cr_assert_str_eq(kvt_strerror(all[i].code), all[i].msg);
        cr_assert(all[i].code <= 0, "codes are 0 or negative");
        for (size_t j = 0; j < i; j++) {
            cr_assert_neq(all[i].code, all[j].code);
            cr_assert_str_neq(kvt_strerror(all[i].code), kvt_strerror(all[j].code));
        }
    }
    cr_assert_str_eq(kvt_err_name(0), "KVT_OK");
    cr_assert_str_eq(kvt_err_name(-9999), "KVT_UNKNOWN");
    cr_assert_str_eq(kvt_strerror(12345), "unknown error");
}
