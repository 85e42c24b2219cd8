/* A consumer's check that the public error list of <tierkv.h> is the
 * library's own: every code's name and message, as compiled into this
 * program from the installed header, must be what the installed library's
 * tk_errname and tk_strerror return (base/err.h inside the tree defines the
 * same list; tests/consumer/run.sh builds this against the installed copy).
 * Exit status 0 when they all match. */
#include <stdio.h>
#include <string.h>

#include <tierkv.h>

int main(void)
{
    int bad = 0, n = 0;
#define CHECK(name, value, msg)                                                          \
    do {                                                                                 \
        n++;                                                                             \
        if (strcmp(tk_errname(value), #name) != 0 || strcmp(tk_strerror(value), msg)) {  \
            fprintf(stderr,                                                              \
                    "errors: %d is %s (%s) in the library, %s (%s) in the "              \
                    "header\n",                                                          \
                    value, tk_errname(value), tk_strerror(value), #name, msg);           \
            bad++;                                                                       \
        }                                                                                \
    } while (0);
    TK_ERRORS(CHECK)
#undef CHECK
    /* One past the list is unknown to both. */
    if (strcmp(tk_errname(TK_ERANGE - 1), "TK_E?") != 0) {
        fprintf(stderr, "errors: the library knows %d; the header does not\n",
                TK_ERANGE - 1);
        bad++;
    }
    printf("errors: %d codes, %d mismatched\n", n, bad);
    return bad ? 1 : 0;
}
