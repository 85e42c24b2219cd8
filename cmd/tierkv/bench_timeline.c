/* `tierkv bench --plot`: see bench_timeline.h. */
#include "cmd/tierkv/bench_timeline.h"

#include <stdio.h>

#include "base/alloc.h"
#include "cmd/benchplot/bench_plot.h"

void bench_timeline_add(struct bench_timeline *tl, uint32_t run, double t_s,
                        double ops_per_s, double p99_ms)
{
    if (tl->n == BENCH_TIMELINE_MAX) {
        tl->dropped++;
        return;
    }
    if (tl->n == tl->cap) {
        tl->cap = tl->cap ? 2 * tl->cap : 64;
        tl->s = tk_realloc(tl->s, tl->cap * sizeof(tl->s[0]));
    }
    tl->s[tl->n++] = (struct bench_sample){run, t_s, ops_per_s, p99_ms};
}

int bench_timeline_plot(const struct bench_timeline *tl, const char *path,
                        const char *title)
{
    static struct bench_plot p;
    bench_plot_init(&p, title);
    int ops = bench_plot_panel(&p, "throughput, each second", "seconds into the run",
                               "ops/s", false, false);
    int lat = bench_plot_panel(&p, "latency p99, each second", "seconds into the run",
                               "milliseconds", false, true);
    for (size_t i = 0; i < tl->n; i++) {
        const struct bench_sample *s = &tl->s[i];
        char name[32];
        snprintf(name, sizeof(name), "run %u", (unsigned)s->run);
        bench_plot_point(&p, bench_plot_series_named(&p, ops, name), s->t_s,
                         s->ops_per_s);
        if (s->p99_ms > 0)
            bench_plot_point(&p, bench_plot_series_named(&p, lat, name), s->t_s,
                             s->p99_ms);
    }
    if (tl->dropped > 0)
        fprintf(stderr, "tierkv bench: %zu samples past the plot's bound left out\n",
                tl->dropped);
    int rc = bench_plot_write(&p, path);
    bench_plot_free(&p);
    return rc;
}

void bench_timeline_free(struct bench_timeline *tl)
{
    tk_free(tl->s);
    tl->s = NULL;
    tl->n = tl->cap = 0;
}
