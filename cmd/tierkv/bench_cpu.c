/* CPU time of a process from /proc (bench_cpu.h). */
#include "cmd/tierkv/bench_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bench_cpu_parse_stat(const char *line, uint64_t *ticks)
{
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
     * the fields are counted from the last ')'. utime and stime are fields 14
     * and 15 (proc(5)); after ')' the next token is field 3. */
    const char *p = strrchr(line, ')');
    if (p == NULL)
        return -1;
    p++;
    uint64_t v[2];
    for (int field = 3; field <= 15; field++) {
        while (*p == ' ')
            p++;
        if (*p == 0 || *p == '\n')
            return -1;
        if (field >= 14) {
            char *end;
            v[field - 14] = strtoull(p, &end, 10);
            if (end == p)
                return -1;
            p = end;
        } else {
            while (*p != ' ' && *p != 0)
                p++;
        }
    }
    *ticks = v[0] + v[1];
    return 0;
}

int64_t bench_cpu_us(int pid)
{
    char path[64], line[1024];
    if (pid == 0)
        snprintf(path, sizeof(path), "/proc/self/stat");
    else
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[n] = 0;
    uint64_t ticks;
    long hz = sysconf(_SC_CLK_TCK);
    if (n == 0 || hz <= 0 || bench_cpu_parse_stat(line, &ticks) != 0)
        return -1;
    return (int64_t)(ticks * 1000000u / (uint64_t)hz);
}

int bench_cpu_parse_pids(const char *s, int pids[BENCH_CPU_PIDS_MAX])
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 0x7fffffff || n == BENCH_CPU_PIDS_MAX)
            return -1;
        pids[n++] = (int)v;
        if (*end == ',')
            end++;
        else if (*end != 0)
            return -1;
        s = end;
    }
    return n > 0 ? n : -1;
}
