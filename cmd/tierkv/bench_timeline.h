/* `tierkv bench --plot FILE.svg`: each run's throughput and p99 second by
 * second (the progress line's samples, kept whether or not the line is
 * drawn), plotted through cmd/benchplot. Bounded: BENCH_TIMELINE_MAX samples
 * (more are dropped). Filled and read by one thread at a time. */
#ifndef TK_CLI_BENCH_TIMELINE_H
#define TK_CLI_BENCH_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#define BENCH_TIMELINE_MAX 100000 /* samples: 27 hours of one-second samples */

struct bench_timeline {
    struct bench_sample {
        uint32_t run;
        double t_s, ops_per_s, p99_ms;
    } * s;
    size_t n, cap, dropped;
};

void bench_timeline_add(struct bench_timeline *tl, uint32_t run, double t_s,
                        double ops_per_s, double p99_ms);

/* Two panels, ops/s and p99 against seconds into the measured window, one
 * line per run; 0 or -1 (gnuplot's failure reported on stderr). */
int bench_timeline_plot(const struct bench_timeline *tl, const char *path,
                        const char *title);

void bench_timeline_free(struct bench_timeline *tl);

#endif
