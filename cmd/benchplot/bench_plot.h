/* Plots of benchmark results: the shared `--plot FILE.svg` of the benchmark
 * programs (docs/benchmarks.md).
 *
 * A plot is one or two panels side by side; a panel has labelled axes (each
 * linear or logarithmic), series of (x, y) points drawn as lines with points,
 * and horizontal reference lines (a floor). bench_plot_write hands it all to
 * gnuplot (Debian: gnuplot-nox) as one script with inline data and writes an
 * SVG; it reports a missing gnuplot or a failed plot on stderr and returns -1.
 * The data lives in the struct, so a plot can be filled while a benchmark runs
 * and written at its end. Bounded: BENCH_PLOT_PANELS panels,
 * BENCH_PLOT_SERIES series, BENCH_PLOT_POINTS points per series (more are
 * dropped, and counted in `dropped`). */
#ifndef TK_BENCH_PLOT_H
#define TK_BENCH_PLOT_H

#include <stdbool.h>
#include <stddef.h>

#define BENCH_PLOT_PANELS 2
#define BENCH_PLOT_SERIES 24
#define BENCH_PLOT_HLINES 4
#define BENCH_PLOT_XTICS 16
#define BENCH_PLOT_POINTS 200000
#define BENCH_PLOT_TEXT 96

struct bench_plot_series {
    char name[BENCH_PLOT_TEXT];
    int panel;
    int color;   /* 0: gnuplot's next; else 1.. (bench_plot_series_look) */
    bool dashed; /* drawn dashed */
    double *x, *y;
    size_t n, cap;
};

struct bench_plot_panel {
    char title[BENCH_PLOT_TEXT], xlabel[BENCH_PLOT_TEXT], ylabel[BENCH_PLOT_TEXT];
    bool logx, logy;
    struct {
        char name[BENCH_PLOT_TEXT];
        double y;
    } hline[BENCH_PLOT_HLINES];
    size_t n_hlines;
    struct {
        char label[32];
        double x;
    } xtic[BENCH_PLOT_XTICS]; /* named x positions; none: numbers */
    size_t n_xtics;
};

struct bench_plot {
    char title[2 * BENCH_PLOT_TEXT];
    struct bench_plot_panel panel[BENCH_PLOT_PANELS];
    size_t n_panels;
    struct bench_plot_series series[BENCH_PLOT_SERIES];
    size_t n_series;
    size_t dropped; /* points, series or lines over the bounds */
};

/* An empty plot titled `title` (shown above the panels). */
void bench_plot_init(struct bench_plot *p, const char *title);

/* Adds a panel; returns its index, or -1 when there are BENCH_PLOT_PANELS. */
int bench_plot_panel(struct bench_plot *p, const char *title, const char *xlabel,
                     const char *ylabel, bool logx, bool logy);

/* Names the x position `x` of `panel` (a category axis: "p50", "tcp", ...). */
void bench_plot_xtic(struct bench_plot *p, int panel, double x, const char *label);

/* Adds a series to `panel`; returns its index, or -1 when full. */
int bench_plot_series(struct bench_plot *p, int panel, const char *name);

/* The series of `panel` named `name`, added if there is none; -1 when full. */
int bench_plot_series_named(struct bench_plot *p, int panel, const char *name);

/* Sets series `s`'s colour (1..8, the same for a pair of related series;
 * 0: automatic) and dashes (e.g. the baseline beside tierkv's solid line). */
void bench_plot_series_look(struct bench_plot *p, int s, int color, bool dashed);

/* Appends a point to series `s` (ignored when s < 0; NaN and, on a log axis,
 * values <= 0 are skipped when drawn). */
void bench_plot_point(struct bench_plot *p, int s, double x, double y);

/* A horizontal reference line across `panel` at `y`. */
void bench_plot_hline(struct bench_plot *p, int panel, const char *name, double y);

/* Runs gnuplot (the command in $GNUPLOT, else `gnuplot`) and writes the SVG to
 * `path` (through a temporary file renamed into place, so a failed plot
 * leaves no partial file). 0, or -1 with a message on stderr. */
int bench_plot_write(const struct bench_plot *p, const char *path);

/* Frees the points. */
void bench_plot_free(struct bench_plot *p);

#endif
