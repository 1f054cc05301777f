#include <criterion/criterion.h>
Test(bench, placeholder) { cr_assert(1); }
