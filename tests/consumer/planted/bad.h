/* A planted header for check-exports.sh's known-bad test: one TK_API function,
 * while bad.c also exports a generic name. */
#ifndef PLANTED_BAD_H
#define PLANTED_BAD_H
#define TK_API __attribute__((visibility("default")))
TK_API int tk_planted(void);
#endif
