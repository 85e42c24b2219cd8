/* Plots of benchmark results through gnuplot: see bench_plot.h. */
#include "cmd/benchplot/bench_plot.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"

/* Copies `src` into `dst` without the characters that would end a gnuplot
 * string or datablock name. */
static void text_copy(char *dst, size_t cap, const char *src)
{
    size_t j = 0;
    for (size_t i = 0; src != NULL && src[i] != '\0' && j + 1 < cap; i++)
        dst[j++] = (src[i] == '"' || src[i] == '\\' || src[i] == '\n') ? '\'' : src[i];
    dst[j] = '\0';
}

void bench_plot_init(struct bench_plot *p, const char *title)
{
    memset(p, 0, sizeof(*p));
    text_copy(p->title, sizeof(p->title), title);
}

int bench_plot_panel(struct bench_plot *p, const char *title, const char *xlabel,
                     const char *ylabel, bool logx, bool logy)
{
    if (p->n_panels == BENCH_PLOT_PANELS) {
        p->dropped++;
        return -1;
    }
    struct bench_plot_panel *pn = &p->panel[p->n_panels];
    text_copy(pn->title, sizeof(pn->title), title);
    text_copy(pn->xlabel, sizeof(pn->xlabel), xlabel);
    text_copy(pn->ylabel, sizeof(pn->ylabel), ylabel);
    pn->logx = logx;
    pn->logy = logy;
    return (int)p->n_panels++;
}

void bench_plot_xtic(struct bench_plot *p, int panel, double x, const char *label)
{
    if (panel < 0 || (size_t)panel >= p->n_panels ||
        p->panel[panel].n_xtics == BENCH_PLOT_XTICS) {
        p->dropped++;
        return;
    }
    struct bench_plot_panel *pn = &p->panel[panel];
    pn->xtic[pn->n_xtics].x = x;
    text_copy(pn->xtic[pn->n_xtics].label, sizeof(pn->xtic[0].label), label);
    pn->n_xtics++;
}

int bench_plot_series(struct bench_plot *p, int panel, const char *name)
{
    if (panel < 0 || (size_t)panel >= p->n_panels || p->n_series == BENCH_PLOT_SERIES) {
        p->dropped++;
        return -1;
    }
    struct bench_plot_series *s = &p->series[p->n_series];
    memset(s, 0, sizeof(*s));
    text_copy(s->name, sizeof(s->name), name);
    s->panel = panel;
    return (int)p->n_series++;
}

int bench_plot_series_named(struct bench_plot *p, int panel, const char *name)
{
    char clean[BENCH_PLOT_TEXT];
    text_copy(clean, sizeof(clean), name);
    for (size_t i = 0; i < p->n_series; i++)
        if (p->series[i].panel == panel && strcmp(p->series[i].name, clean) == 0)
            return (int)i;
    return bench_plot_series(p, panel, name);
}

void bench_plot_series_look(struct bench_plot *p, int si, int color, bool dashed)
{
    if (si < 0 || (size_t)si >= p->n_series)
        return;
    p->series[si].color = color;
    p->series[si].dashed = dashed;
}

void bench_plot_point(struct bench_plot *p, int si, double x, double y)
{
    if (si < 0 || (size_t)si >= p->n_series)
        return;
    struct bench_plot_series *s = &p->series[si];
    if (s->n == BENCH_PLOT_POINTS) {
        p->dropped++;
        return;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->x = tk_realloc(s->x, s->cap * sizeof(double));
        s->y = tk_realloc(s->y, s->cap * sizeof(double));
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

void bench_plot_hline(struct bench_plot *p, int panel, const char *name, double y)
{
    if (panel < 0 || (size_t)panel >= p->n_panels ||
        p->panel[panel].n_hlines == BENCH_PLOT_HLINES) {
        p->dropped++;
        return;
    }
    struct bench_plot_panel *pn = &p->panel[panel];
    text_copy(pn->hline[pn->n_hlines].name, sizeof(pn->hline[0].name), name);
    pn->hline[pn->n_hlines].y = y;
    pn->n_hlines++;
}

void bench_plot_free(struct bench_plot *p)
{
    for (size_t i = 0; i < p->n_series; i++) {
        tk_free(p->series[i].x);
        tk_free(p->series[i].y);
    }
    p->n_series = 0;
}

/* ---- the gnuplot script ------------------------------------------------- */

static bool drawable(const struct bench_plot_panel *pn, double x, double y)
{
    if (!isfinite(x) || !isfinite(y))
        return false;
    return !(pn->logx && x <= 0) && !(pn->logy && y <= 0);
}

#define DRAW_MAX 2000   /* points drawn per series; more are thinned */
#define MARKERS_MAX 300 /* a series with more points is drawn without markers */

/* Points [from, to) of a series: all of them, or when the series is thinned,
 * the lowest and the highest of the chunk in their order (so a stall or a
 * spike survives the thinning). */
static void put_chunk(FILE *f, const struct bench_plot_panel *pn,
                      const struct bench_plot_series *s, size_t from, size_t to)
{
    size_t lo = to, hi = to;
    for (size_t k = from; k < to; k++) {
        if (!drawable(pn, s->x[k], s->y[k]))
            continue;
        if (lo == to || s->y[k] < s->y[lo])
            lo = k;
        if (hi == to || s->y[k] > s->y[hi])
            hi = k;
    }
    if (lo == to)
        return;
    size_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
    fprintf(f, "%.9g %.9g\n", s->x[a], s->y[a]);
    if (b != a)
        fprintf(f, "%.9g %.9g\n", s->x[b], s->y[b]);
}

/* The data of every series as datablocks $s0, $s1, ... */
static void put_data(FILE *f, const struct bench_plot *p)
{
    for (size_t i = 0; i < p->n_series; i++) {
        const struct bench_plot_series *s = &p->series[i];
        size_t chunk = s->n > DRAW_MAX ? (s->n + DRAW_MAX / 2 - 1) / (DRAW_MAX / 2) : 1;
        fprintf(f, "$s%zu << EOD\n", i);
        for (size_t k = 0; k < s->n; k += chunk)
            put_chunk(f, &p->panel[s->panel], s, k, k + chunk < s->n ? k + chunk : s->n);
        fprintf(f, "EOD\n");
    }
}

static void put_axes(FILE *f, const struct bench_plot_panel *pn)
{
    fprintf(f, "set title \"%s\"\nset xlabel \"%s\" offset 0,0.6\nset ylabel \"%s\"\n",
            pn->title, pn->xlabel, pn->ylabel);
    fprintf(f, "%s logscale x\n%s logscale y\n", pn->logx ? "set" : "unset",
            pn->logy ? "set" : "unset");
    if (pn->n_xtics > 0) {
        fprintf(f, "set xtics (");
        for (size_t i = 0; i < pn->n_xtics; i++)
            fprintf(f, "%s\"%s\" %.9g", i ? ", " : "", pn->xtic[i].label, pn->xtic[i].x);
        fprintf(f, ")\nset xrange [%.9g:%.9g]\n", pn->xtic[0].x - 0.5,
                pn->xtic[pn->n_xtics - 1].x + 0.5);
    } else {
        fprintf(f, "set xtics autofreq\nset autoscale x\n");
    }
}

/* One panel's `plot` command: its series, then its reference lines. */
static void put_panel(FILE *f, const struct bench_plot *p, int panel)
{
    const struct bench_plot_panel *pn = &p->panel[panel];
    put_axes(f, pn);
    /* Points on a category axis (a line between categories means nothing). */
    const char *style =
        pn->n_xtics ? "points pt 7 ps 1.2" : "linespoints pt 7 ps 0.5 lw 1.5";
    const char *dense = pn->n_xtics ? style : "lines lw 1.5";
    fprintf(f, "plot ");
    int n = 0;
    for (size_t i = 0; i < p->n_series; i++) {
        if (p->series[i].panel != panel)
            continue;
        const struct bench_plot_series *s = &p->series[i];
        fprintf(f, "%s$s%zu using 1:2 with %s", n++ ? ", \\\n  " : "", i,
                s->n > MARKERS_MAX ? dense : style);
        if (s->color > 0)
            fprintf(f, " lc %d", s->color);
        fprintf(f, " dt %d title \"%s\"", s->dashed ? 2 : 1, s->name);
    }
    for (size_t h = 0; h < pn->n_hlines; h++)
        fprintf(f, "%s%.9g with lines dt %zu lw 2 lc rgb \"#555555\" title \"%s\"",
                n++ ? ", \\\n  " : "", pn->hline[h].y, h + 2, pn->hline[h].name);
    if (n == 0)
        fprintf(f, "NaN notitle");
    fprintf(f, "\n");
}

static void put_script(FILE *f, const struct bench_plot *p, const char *out)
{
    put_data(f, p);
    unsigned width = p->n_panels > 1 ? 1200 : 760;
    fprintf(f,
            "set terminal svg size %u,560 dynamic enhanced font \"sans,11\" "
            "background rgb \"white\"\nset output \"%s\"\n"
            "set grid\nset key below box font \",9\"\nset mxtics\n"
            "set multiplot layout 1,%zu title \"%s\" font \",13\"\n",
            width, out, p->n_panels ? p->n_panels : 1, p->title);
    for (size_t i = 0; i < p->n_panels; i++)
        put_panel(f, p, (int)i);
    fprintf(f, "unset multiplot\nset output\n");
}

int bench_plot_write(const struct bench_plot *p, const char *path)
{
    if (p->n_panels == 0 || p->n_series == 0) {
        fprintf(stderr, "plot: nothing to plot for %s\n", path);
        return -1;
    }
    char tmp[4096], clean[4096];
    text_copy(clean, sizeof(clean), path);
    if (strcmp(clean, path) != 0 ||
        snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        fprintf(stderr, "plot: unusable file name %s\n", path);
        return -1;
    }
    const char *gp = getenv("GNUPLOT");
    char cmd[4200];
    /* gnuplot says nothing on success; its complaints go to stderr, never into
     * the benchmark's stdout (which carries the JSON line). */
    snprintf(cmd, sizeof(cmd), "%s 1>&2", gp && gp[0] ? gp : "gnuplot");
    /* A gnuplot that exits early must not kill us with SIGPIPE: the writes
     * fail instead, and pclose reports its status. */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGPIPE, &ign, &old);
    FILE *f = popen(cmd, "w");
    if (f == NULL) {
        sigaction(SIGPIPE, &old, NULL);
        fprintf(stderr, "plot: cannot run gnuplot: %s\n", strerror(errno));
        return -1;
    }
    put_script(f, p, tmp);
    int st = pclose(f);
    sigaction(SIGPIPE, &old, NULL);
    struct stat sb;
    if (st != 0 || stat(tmp, &sb) != 0 || sb.st_size == 0) {
        unlink(tmp);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
            fprintf(stderr, "plot: gnuplot is not installed (Debian: gnuplot-nox)\n");
        else
            fprintf(stderr, "plot: gnuplot failed (%s %d) for %s\n",
                    WIFEXITED(st) ? "exit" : "status",
                    WIFEXITED(st) ? WEXITSTATUS(st) : st, path);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "plot: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (p->dropped > 0)
        fprintf(stderr, "plot: %zu points or series over the plot's bounds left out\n",
                p->dropped);
    return 0;
}
