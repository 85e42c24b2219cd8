/* The memory budget's split and the trimmer thread (node_mem.h). */
#include "node/node_mem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/err.h"

#define MIB ((uint64_t)1 << 20)

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

void node_mem_split(uint64_t budget, struct node_mem_split *out)
{
    out->ring = max_u64(min_u64(budget / 8, 64 * MIB), 1 * MIB);
    out->change_log = max_u64(min_u64(budget / 32, 16 * MIB), 1 * MIB);
    out->http = max_u64(min_u64(budget / 4, 512 * MIB), 8 * MIB);
    out->watch = max_u64(min_u64(budget / 16, 64 * MIB), 2 * MIB);
    out->raft_log = max_u64(min_u64(budget / 16, 64 * MIB), 1 * MIB);
    out->blob_cache = min_u64(budget / 32, 32 * MIB);
    out->big_blob_cache = min_u64(budget / 4, 128 * MIB);
}

uint64_t node_mem_default_budget(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    uint64_t kib = 0;
    char line[128];
    if (f) {
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemTotal: %lu kB", &kib) == 1)
                break;
        fclose(f);
    }
    if (kib == 0)
        return 1024 * MIB;
    return min_u64(max_u64(kib * 1024 / 4, 256 * MIB), 4096 * MIB);
}

static struct {
    atomic_uint_fast64_t budget, trims, trim_ns, trim_ns_max;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool running, stop;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void read_status(struct node_mem_stats *out)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    unsigned long kib;
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "RssAnon: %lu kB", &kib) == 1)
            out->rss_anon = (uint64_t)kib << 10;
        else if (sscanf(line, "RssFile: %lu kB", &kib) == 1)
            out->rss_file = (uint64_t)kib << 10;
        else if (sscanf(line, "RssShmem: %lu kB", &kib) == 1)
            out->rss_shmem = (uint64_t)kib << 10;
    }
    fclose(f);
}

void node_mem_stats(struct node_mem_stats *out, bool heap)
{
    memset(out, 0, sizeof(*out));
    out->budget = atomic_load(&g.budget);
    out->trims = atomic_load(&g.trims);
    out->trim_ns = atomic_load(&g.trim_ns);
    out->trim_ns_max = atomic_load(&g.trim_ns_max);
    read_status(out);
    if (heap) {
        struct mallinfo2 mi = mallinfo2();
        out->heap_free = mi.fordblks;
    }
}

static void trim_now(void)
{
    uint64_t t0 = tk_mono_ns();
    (void)malloc_trim(0);
    uint64_t ns = tk_mono_ns() - t0;
    atomic_fetch_add(&g.trims, 1);
    atomic_fetch_add(&g.trim_ns, ns);
    if (ns > atomic_load(&g.trim_ns_max))
        atomic_store(&g.trim_ns_max, ns);
}

/* Once a second: trim when the anonymous RSS has grown NODE_MEM_TRIM_SLACK
 * past what the last trim left and either the burst is over (this second's
 * allocated bytes under a quarter of the peak of the last ten) or
 * NODE_MEM_TRIM_EVERY_S seconds have passed since the last trim. */
static void *trimmer(void *arg)
{
    (void)arg;
    uint64_t floor_anon = 0, rates[10] = {0}, last_bytes;
    unsigned tick = 0, since_trim = 0;
    struct tk_alloc_stats as;
    tk_alloc_stats(&as);
    last_bytes = as.bytes;
    pthread_mutex_lock(&g.mu);
    while (!g.stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g.cond, &g.mu, &ts);
        if (g.stop)
            break;
        pthread_mutex_unlock(&g.mu);
        tk_alloc_stats(&as);
        uint64_t rate = as.bytes - last_bytes, peak = 0;
        last_bytes = as.bytes;
        rates[tick++ % 10] = rate;
        for (unsigned i = 0; i < 10; i++)
            peak = max_u64(peak, rates[i]);
        since_trim++;
        struct node_mem_stats st = {0};
        read_status(&st);
        if (st.rss_anon < floor_anon)
            floor_anon = st.rss_anon;
        if (st.rss_anon > floor_anon + NODE_MEM_TRIM_SLACK &&
            (rate < peak / 4 || since_trim >= NODE_MEM_TRIM_EVERY_S)) {
            trim_now();
            since_trim = 0;
            struct node_mem_stats after = {0};
            read_status(&after);
            floor_anon = after.rss_anon;
        }
        pthread_mutex_lock(&g.mu);
    }
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

int node_mem_start(uint64_t budget, unsigned arena_max, bool trim)
{
    atomic_store(&g.budget, budget);
    if (arena_max)
        (void)mallopt(M_ARENA_MAX, (int)arena_max);
    if (!trim || g.running)
        return 0;
    g.stop = false;
    if (pthread_create(&g.thread, NULL, trimmer, NULL) != 0)
        return TK_ENOMEM;
    g.running = true;
    return 0;
}

void node_mem_stop(void)
{
    if (!g.running)
        return;
    pthread_mutex_lock(&g.mu);
    g.stop = true;
    pthread_cond_signal(&g.cond);
    pthread_mutex_unlock(&g.mu);
    pthread_join(g.thread, NULL);
    g.running = false;
}
