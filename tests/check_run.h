/* The one way every Check program of the tree ends: run the suites, free the
 * runner, and exit 0 only if every test passed. The print mode comes from
 * CK_VERBOSITY (CK_ENV; normal when unset, as meson's test environment sets it).
 * Header-only, for test programs. */
#ifndef TK_TESTS_CHECK_RUN_H
#define TK_TESTS_CHECK_RUN_H

#include <check.h>
#include <stdlib.h>

/* Runs every suite added to `sr` and frees it. Returns the exit status. */
static inline int tk_check_run(SRunner *sr)
{
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
