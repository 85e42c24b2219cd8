/* bench-plot: bench_plot.h for scripts (scripts/bench-http.sh --plot).
 *
 *   bench-plot OUT.svg < SPEC
 *
 * SPEC, one statement a line (fields separated by one space; the last field
 * of a line may hold spaces; # starts a comment):
 *   title TEXT
 *   panel LOGX LOGY TITLE|XLABEL|YLABEL      LOGX, LOGY: 0 or 1
 *   xtic PANEL X LABEL
 *   series PANEL NAME
 *   point X Y                                 into the last series
 *   hline PANEL Y NAME
 * Exit 0 with the SVG written; 2 on a bad line (named, with its number); 1
 * when gnuplot fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/benchplot/bench_plot.h"

static int bad(size_t line, const char *what)
{
    fprintf(stderr, "bench-plot: line %zu: %s\n", line, what);
    return 2;
}

/* Splits "A|B|C" into three strings in place. */
static int split3(char *s, char **a, char **b, char **c)
{
    *a = s;
    *b = strchr(s, '|');
    if (*b == NULL)
        return -1;
    *(*b)++ = '\0';
    *c = strchr(*b, '|');
    if (*c == NULL)
        return -1;
    *(*c)++ = '\0';
    return 0;
}

static int statement(struct bench_plot *p, char *l, size_t no, int *last)
{
    int a, b, n = 0;
    double x, y;
    if (strncmp(l, "title ", 6) == 0) {
        bench_plot_init(p, l + 6);
    } else if (sscanf(l, "panel %d %d %n", &a, &b, &n) == 2 && n > 0) {
        char *t, *xl, *yl;
        if (split3(l + n, &t, &xl, &yl) != 0)
            return bad(no, "panel wants TITLE|XLABEL|YLABEL");
        if (bench_plot_panel(p, t, xl, yl, a != 0, b != 0) < 0)
            return bad(no, "too many panels");
    } else if (sscanf(l, "xtic %d %lf %n", &a, &x, &n) == 2 && n > 0) {
        bench_plot_xtic(p, a, x, l + n);
    } else if (sscanf(l, "series %d %n", &a, &n) == 1 && n > 0) {
        *last = bench_plot_series(p, a, l + n);
        if (*last < 0)
            return bad(no, "no such panel, or too many series");
    } else if (sscanf(l, "point %lf %lf", &x, &y) == 2) {
        if (*last < 0)
            return bad(no, "a point before any series");
        bench_plot_point(p, *last, x, y);
    } else if (sscanf(l, "hline %d %lf %n", &a, &y, &n) == 2 && n > 0) {
        bench_plot_hline(p, a, l + n, y);
    } else {
        return bad(no, "not a statement (title, panel, xtic, series, point, hline)");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr,
                "usage: bench-plot OUT.svg < SPEC   (see cmd/benchplot/main.c)\n");
        return 2;
    }
    static struct bench_plot p;
    bench_plot_init(&p, "");
    char line[1024];
    size_t no = 0;
    int last = -1, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), stdin) != NULL) {
        no++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        rc = statement(&p, line, no, &last);
    }
    if (rc == 0)
        rc = bench_plot_write(&p, argv[1]) == 0 ? 0 : 1;
    bench_plot_free(&p);
    return rc;
}
