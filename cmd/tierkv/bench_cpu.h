/* `tierkv bench --cpu-pids`: the CPU time of other processes (the servers
 * under load) and of the bench itself, from /proc/PID/stat (utime + stime,
 * every thread of the process), so a run reports CPU microseconds per
 * request beside ops/s. Linux only; a process that cannot be read reads -1.
 * Resolution: one clock tick (10 ms at USER_HZ 100), so over a 5 s window of
 * 1000 requests or more the error is at most 10 us per request, and 0.1 us
 * at 100k requests. Any thread may call these (no state). */
#ifndef TK_CLI_BENCH_CPU_H
#define TK_CLI_BENCH_CPU_H

#include <stddef.h>
#include <stdint.h>

#define BENCH_CPU_PIDS_MAX 8

/* utime + stime of `pid` (0: this process) in microseconds, or -1. */
int64_t bench_cpu_us(int pid);

/* Parses "PID[,PID...]" (at most BENCH_CPU_PIDS_MAX, each > 0) into pids.
 * Returns the count, or -1 if the list is malformed. */
int bench_cpu_parse_pids(const char *s, int pids[BENCH_CPU_PIDS_MAX]);

/* The utime + stime fields of a /proc/PID/stat line, in clock ticks:
 * 0 and *ticks set, or -1 if the line is malformed. Exposed for tests. */
int bench_cpu_parse_stat(const char *line, uint64_t *ticks);

#endif
