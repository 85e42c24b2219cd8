/* Paced writeback: the process's fdatasync(2), which a thread can make write
 * a file's dirty pages out over time before it syncs.
 *
 * LMDB makes a commit durable with fdatasync of its data file before it
 * writes the meta page. A commit of tens or hundreds of MB, synced at once,
 * is one burst that every other file's fsync on the disk queues behind (the
 * Raft logs' among them). base/sync.c defines fdatasync; in an executable,
 * liblmdb's call (through its PLT) binds to it. While a thread has a tk_pace
 * set, its fdatasync first writes the file out in 4 MiB slices
 * (sync_file_range, WAIT_BEFORE | WRITE | WAIT_AFTER), sleeping `factor`
 * times each slice's write time, at most 4 s in all, until *hurry is set;
 * then, and for every other call, it goes on to the next fdatasync
 * (dlsym(RTLD_NEXT): an LD_PRELOAD shim's, or libc's). The caller's order is
 * kept: the data is durable when the call returns. A slice's write error is
 * the call's error (the kernel reports it once). In libtierkv.so the version
 * script keeps the definition local: LMDB there syncs unpaced. */
#ifndef TK_BASE_SYNC_H
#define TK_BASE_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

struct tk_pace {
    unsigned factor;          /* sleep per write time; 0: not paced */
    const atomic_bool *hurry; /* set (by any thread): stop sleeping */
    uint64_t syncs;           /* fdatasyncs paced */
    uint64_t slices;          /* slices that had pages to write */
    uint64_t write_ns;        /* time writing those slices */
    uint64_t slept_ns;        /* time slept between them */
};

/* The calling thread's fdatasync calls are paced with p (NULL: not) until
 * tk_pace_end. */
void tk_pace_begin(struct tk_pace *p);
void tk_pace_end(void);

/* Paced CPU work: a thread doing a long piece of background work (a snapshot
 * read of the whole state) calls tk_pace_cpu between small steps of it. Once
 * the thread has used TK_PACE_CPU_SLICE_NS of CPU since its last nap, it
 * sleeps `factor` times that, until *hurry is set (NULL: never), so that the
 * work takes at most 1 / (factor + 1) of a core however idle the machine
 * looks: on a virtual machine, work at the lowest priority still takes the
 * memory bandwidth, caches and host time the busy threads share. */
#define TK_PACE_CPU_SLICE_NS 2000000ull
struct tk_cpu_pace {
    unsigned factor;          /* sleep per CPU time; 0: not paced */
    const atomic_bool *hurry; /* set (by any thread): stop sleeping */
    uint64_t mark_ns;         /* the thread's CPU time at the last nap */
    uint64_t cpu_ns;          /* CPU time used between naps, in all */
    uint64_t slept_ns;        /* time slept, in all */
};
void tk_pace_cpu(struct tk_cpu_pace *p);

#endif
