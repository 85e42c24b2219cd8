/* Always-on assertions for the program's own invariants.
 *
 * Never assert on input from the network, a file or a client: return an error.
 * TK_ASSERT stays on in release builds; a failure prints the expression, file
 * and line to stderr and aborts. Split compound conditions so a failure names
 * the broken part. */
#ifndef TK_BASE_ASSERT_H
#define TK_BASE_ASSERT_H

_Noreturn void tk__assert_fail(const char *expr, const char *file, int line,
                               const char *func);

#define TK_ASSERT(cond)                                                                  \
    ((cond) ? (void)0 : tk__assert_fail(#cond, __FILE__, __LINE__, __func__))

/* Marks code that must never be reached. */
#define TK_UNREACHABLE() tk__assert_fail("unreachable", __FILE__, __LINE__, __func__)

#endif
