/* The benchmark programs' option tables (bench_args.h). */
#include "cmd/benchplot/bench_args.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void bench_args_usage(const char *prog, const struct bench_option *opts, size_t n)
{
    fprintf(stderr, "usage: %s", prog);
    for (size_t i = 0; i < n; i++) {
        if (opts[i].wrap)
            fprintf(stderr, "\n%*s", (int)(strlen("usage: ") + strlen(prog)), "");
        if (opts[i].placeholder != NULL)
            fprintf(stderr, " [%s %s]", opts[i].name, opts[i].placeholder);
        else
            fprintf(stderr, " [%s]", opts[i].name);
    }
    fprintf(stderr, "\n");
}

static const struct bench_option *find(const struct bench_option *opts, size_t n,
                                       const char *arg)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(arg, opts[i].name) == 0)
            return &opts[i];
    return NULL;
}

int bench_args_parse(const char *prog, const struct bench_option *opts, size_t n,
                     int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const struct bench_option *o = find(opts, n, argv[i]);
        int rc = -1;
        if (o != NULL && o->placeholder == NULL)
            rc = o->parse(NULL, o->dest);
        else if (o != NULL && i + 1 < argc)
            rc = o->parse(argv[++i], o->dest);
        if (rc == -1) {
            bench_args_usage(prog, opts, n);
            return 2;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

int bench_parse_flag(const char *v, void *dest)
{
    (void)v;
    *(bool *)dest = true;
    return 0;
}

int bench_parse_str(const char *v, void *dest)
{
    *(const char **)dest = v;
    return 0;
}

int bench_parse_int(const char *v, void *dest)
{
    *(int *)dest = atoi(v);
    return 0;
}

int bench_parse_uint(const char *v, void *dest)
{
    *(unsigned *)dest = (unsigned)atoi(v);
    return 0;
}

int bench_parse_u64(const char *v, void *dest)
{
    *(uint64_t *)dest = strtoull(v, NULL, 10);
    return 0;
}

int bench_parse_double(const char *v, void *dest)
{
    *(double *)dest = atof(v);
    return 0;
}
