/* The process's memory budget (tierkvd --memory-budget) and giving freed heap
 * memory back to the kernel after a burst.
 *
 * A budget is split into the limits of the owners that have one (the split is
 * node_mem_split; docs/operations.md "Sizing memory"). The trimmer is one
 * background thread: once a second it reads the process's anonymous RSS and
 * the allocation counters (base/alloc.h); when the RSS is more than
 * NODE_MEM_TRIM_SLACK above what the last trim left and the allocations of
 * the last second have fallen to a quarter of the recent peak (the burst is
 * over) or NODE_MEM_TRIM_EVERY_S have passed, it calls malloc_trim(0), which
 * gives back the free pages of every glibc arena (their freed tops, kept up to
 * M_TOP_PAD each, and the free pages inside them). It never runs on a loop.
 * tierkvd starts it only with TIERKV_MEM_TRIM=1: measured after a 72 MiB
 * burst, one trim took 174 ms (each arena's lock held in turn, so a loop
 * allocating meanwhile waits) and gave back 19 MiB (docs/benchmarks.md
 * "Memory: who holds a node's RSS"). Not for the embedding library. */
#ifndef TK_NODE_MEM_H
#define TK_NODE_MEM_H

#include <stdbool.h>
#include <stdint.h>

#define NODE_MEM_BUDGET_MIN ((uint64_t)64 << 20)
#define NODE_MEM_TRIM_SLACK ((uint64_t)16 << 20)
#define NODE_MEM_TRIM_EVERY_S 10

/* Each owner's limit out of a budget (bytes); every one is at most its
 * built-in default (the budget lowers limits, never raises them). */
struct node_mem_split {
    uint64_t ring;       /* kv ring bytes: budget / 8, at most 64 MiB */
    uint64_t change_log; /* the change log (watch events): / 32, at most 16 MiB */
    uint64_t http;       /* the gateway's mem_max: / 4, at most 512 MiB, at least 8 MiB */
    uint64_t watch;      /* watch_total_bytes: / 16, at most 64 MiB, at least 2 MiB */
    uint64_t raft_log;   /* snapshot_bytes (the log's payload kept before a
                            snapshot): / 16, at most 64 MiB */
    uint64_t blob_cache; /* the small-blob depot (base/blob.h): / 32, at most 32 MiB */
    uint64_t
        big_blob_cache; /* freed big blobs kept (base/blob.h): / 4, at most 128 MiB */
};
void node_mem_split(uint64_t budget, struct node_mem_split *out);

/* The default budget: a quarter of MemTotal (/proc/meminfo), clamped to
 * [256 MiB, 4 GiB]; 1 GiB if /proc/meminfo cannot be read. */
uint64_t node_mem_default_budget(void);

/* Records the budget (for node_mem_stats), caps glibc's arenas at
 * `arena_max` (mallopt M_ARENA_MAX; 0 leaves glibc's default) and, with
 * `trim`, starts the trimmer thread. Call once, before other threads start.
 * Returns 0 or TK_ENOMEM when the thread cannot start. */
int node_mem_start(uint64_t budget, unsigned arena_max, bool trim);

/* Stops the trimmer thread (waits for it). Safe if none was started. */
void node_mem_stop(void);

struct node_mem_stats {
    uint64_t budget;      /* 0 when node_mem_start was not called */
    uint64_t rss_anon;    /* RssAnon of /proc/self/status, bytes */
    uint64_t rss_file;    /* RssFile (LMDB's mapped pages, the binary) */
    uint64_t rss_shmem;   /* RssShmem */
    uint64_t heap_free;   /* free bytes held in glibc's arenas (mallinfo2) */
    uint64_t trims;       /* malloc_trim(0) calls by the trimmer */
    uint64_t trim_ns_max; /* the longest of them */
    uint64_t trim_ns;     /* all of them */
};
/* Any thread; reads /proc/self/status (a few microseconds) and, with
 * `heap`, calls mallinfo2 (takes every arena's lock in turn). */
void node_mem_stats(struct node_mem_stats *out, bool heap);

#endif
