/* Paced writeback (base/sync.h). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/sync.h"

#define PACE_SLICE ((off_t)4 << 20)
#define PACE_MIN_NS 200000 /* a slice written faster had little to write */
#define PACE_NAP_MAX_NS (4ull * 1000000000) /* slept per sync at most */

/* The pacing of this thread's fdatasync calls (tk_pace_begin), or NULL. */
static _Thread_local struct tk_pace *pace_here;

/* Writes fd's dirty pages out slice by slice (4 MiB of the file each, in file
 * order), sleeping p->factor times the time each slice took to write, until
 * the owner hurries or the naps reach PACE_NAP_MAX_NS. Returns 0 or an errno:
 * sync_file_range consumes a write error that fdatasync would then not
 * report, so the caller returns it instead. */
static int pace_writeback(int fd, struct tk_pace *p)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0; /* fdatasync writes it all */
    p->syncs++;
    uint64_t left = PACE_NAP_MAX_NS;
    for (off_t off = 0; off < st.st_size && left > 0; off += PACE_SLICE) {
        if (atomic_load_explicit(p->hurry, memory_order_relaxed))
            break;
        uint64_t t0 = tk_mono_ns();
        if (sync_file_range(fd, off, PACE_SLICE,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) != 0)
            return errno;
        uint64_t took = tk_mono_ns() - t0;
        if (took < PACE_MIN_NS)
            continue;
        p->slices++;
        p->write_ns += took;
        uint64_t nap = took * p->factor;
        nap = nap < left ? nap : left;
        struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        p->slept_ns += nap;
        left -= nap;
    }
    return 0;
}

typedef int sync_fn(int fd);
static _Atomic(sync_fn *) next_fdatasync;

/* The process's fdatasync(2). liblmdb calls fdatasync through its PLT, so
 * this definition in the executable (default visibility; the shared library's
 * version script keeps it local there, and LMDB then syncs unpaced) takes
 * LMDB's calls as well as everyone else's: a thread in a paced commit
 * (pace_here) writes the file out paced first; every call then goes on to the
 * next definition (an LD_PRELOAD fault shim's, as tests/chaos uses, or
 * libc's), as it would have without this one. */
__attribute__((visibility("default"))) int fdatasync(int fd)
{
    struct tk_pace *p = pace_here;
    if (p != NULL && p->factor > 0) {
        int err = pace_writeback(fd, p);
        if (err != 0) {
            errno = err;
            return -1;
        }
    }
    sync_fn *next = atomic_load_explicit(&next_fdatasync, memory_order_acquire);
    if (next == NULL) {
        void *sym = dlsym(RTLD_NEXT, "fdatasync");
        memcpy(&next, &sym, sizeof(next)); /* ISO C has no object-to-function cast */
        if (next == NULL) {
            errno = ENOSYS;
            return -1;
        }
        atomic_store_explicit(&next_fdatasync, next, memory_order_release);
    }
    return next(fd);
}

void tk_pace_cpu(struct tk_cpu_pace *p)
{
    if (p == NULL || p->factor == 0)
        return;
    uint64_t now = tk_thread_cpu_ns();
    if (p->mark_ns == 0 || now < p->mark_ns) {
        p->mark_ns = now;
        return;
    }
    uint64_t used = now - p->mark_ns;
    if (used < TK_PACE_CPU_SLICE_NS)
        return;
    p->cpu_ns += used;
    p->mark_ns = now;
    if (p->hurry != NULL && atomic_load_explicit(p->hurry, memory_order_relaxed))
        return;
    uint64_t nap = used * p->factor;
    struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    p->slept_ns += nap;
}

void tk_pace_begin(struct tk_pace *p)
{
    pace_here = p;
}

void tk_pace_end(void)
{
    pace_here = NULL;
}
