/* The benchmark programs' command lines as tables (issue 52 item 5): one row
 * per option, in the order the usage message names them, from which both
 * the parsing and the usage message derive.
 *
 *     static const struct bench_option options[] = {
 *         {"--quick", NULL, bench_parse_flag, &quick},
 *         {"--runs", "N", bench_parse_int, &runs},
 *     };
 *     int rc = bench_args_parse("store-bench", options, 2, argc, argv);
 *
 * prints, for an unknown argument or one without its value,
 * "usage: store-bench [--quick] [--runs N]" on stderr. */
#ifndef TK_BENCH_ARGS_H
#define TK_BENCH_ARGS_H

#include <stdbool.h>
#include <stddef.h>

/* Stores an option's value through dest. v is the argument after the
 * option, or NULL for a flag. Returns 0; -1 to have the usage message
 * printed and exit code 2 returned; or an exit code after saying on stderr
 * what is wrong. */
typedef int (*bench_parse_fn)(const char *v, void *dest);

struct bench_option {
    const char *name;        /* "--runs" */
    const char *placeholder; /* its value in the usage message ("N"); NULL: a flag */
    bench_parse_fn parse;
    void *dest; /* handed to parse */
    bool wrap;  /* the usage message starts a new line before this option */
};

/* Parses argv[1..argc-1] against the n rows of `opts`, in order (a later
 * option overrides an earlier one). Returns 0 when every argument is a known
 * option with its value. Prints the usage message on stderr (prog names the
 * program) and returns 2 for an unknown argument, an option without its
 * value, or a parser that returns -1; returns any other non-zero code of a
 * parser as it is. */
int bench_args_parse(const char *prog, const struct bench_option *opts, size_t n,
                     int argc, char **argv);

/* "usage: PROG [--flag] [--option VALUE] ...\n" on stderr, a row with
 * `wrap` starting a new line indented to PROG's end. */
void bench_args_usage(const char *prog, const struct bench_option *opts, size_t n);

/* Parsers for the common kinds, as the benchmarks always read them (no
 * range checks: a program clamps what it must). */
int bench_parse_flag(const char *v, void *dest);   /* bool: true */
int bench_parse_str(const char *v, void *dest);    /* const char *: v, borrowed */
int bench_parse_int(const char *v, void *dest);    /* int: atoi(v) */
int bench_parse_uint(const char *v, void *dest);   /* unsigned: (unsigned)atoi(v) */
int bench_parse_u64(const char *v, void *dest);    /* uint64_t: strtoull(v, NULL, 10) */
int bench_parse_double(const char *v, void *dest); /* double: atof(v) */

#endif
