/* The failure path of TK_ASSERT: print what broke and where, then abort so a
 * core dump (or the test harness) sees SIGABRT. Kept out of line so the
 * assertion itself costs one compare and a never-taken branch. */
#include "base/assert.h"

#include <stdio.h>
#include <stdlib.h>

void tk__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    /* One fprintf so the message is not interleaved with other threads'
     * output more than stdio already guarantees. */
    fprintf(stderr, "tierkv: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
