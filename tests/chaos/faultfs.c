/* faultfs: an LD_PRELOAD shim that injects disk faults into tierkvd's raft
 * log without touching its code (tests/chaos/run loads it for the disk
 * cells; see tests/chaos/README.md).
 *
 * It watches only the log's segment files: files opened through open/open64
 * whose name ends in ".seg" or is "segment.prepare". LMDB and everything else
 * pass through untouched.
 *
 *   TKFAULT_EIO_FILE=path   while `path` exists, fdatasync/fsync of a
 *                           segment fails with EIO (and does not sync).
 *   TKFAULT_UNDO_DIR=dir    before each pwritev/pwrite to a segment, the old
 *                           bytes of the range are appended to
 *                           dir/<inode>.undo; a successful fdatasync of the
 *                           file empties its undo file. After a kill -9 the
 *                           runner applies the undo records newest first,
 *                           which loses every write that was not synced: the
 *                           worst a power cut may do to the page cache.
 *
 * Undo record: u64 offset, u64 length (little-endian host order), then the
 * old bytes. A range past the end of the file records only the bytes that
 * existed (segments are preallocated, so this does not happen in practice).
 *
 * Threads: the shim's own state (the table of watched fds) is guarded by one
 * mutex; the real calls are made outside it except for the undo bookkeeping
 * of one write, which must not interleave with a sync of the same file.
 * Bounds: at most FD_MAX watched descriptors (others pass through), one
 * undo record buffer of at most the write's size, allocated per write. */
/* This file defines open and open64 (and pwrite/pwrite64...) separately: the
 * 64-bit file offset redirection would turn `open` into a second open64. */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define FD_MAX 4096

typedef int open_fn(const char *, int, ...);
typedef ssize_t pwritev_fn(int, const struct iovec *, int, off_t);
typedef ssize_t pwrite_fn(int, const void *, size_t, off_t);
typedef ssize_t pread_fn(int, void *, size_t, off_t);
typedef int sync_fn(int);
typedef int close_fn(int);

static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    open_fn *open, *open64;
    pwritev_fn *pwritev, *pwritev64;
    pwrite_fn *pwrite, *pwrite64;
    pread_fn *pread64;
    sync_fn *fdatasync, *fsync;
    close_fn *close;
    const char *eio_file;
    const char *undo_dir;
    int undo_fd[FD_MAX]; /* per watched fd: its undo file, or 0 */
    bool watched[FD_MAX];
} g = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

/* dlsym returns an object pointer; copying it into a function pointer's
 * bytes is the POSIX-sanctioned way around ISO C's objection. */
#define RESOLVE(field, name)                                                             \
    do {                                                                                 \
        void *p_ = dlsym(RTLD_NEXT, (name));                                             \
        memcpy(&g.field, &p_, sizeof(p_));                                               \
    } while (0)

static void init(void)
{
    RESOLVE(open, "open");
    RESOLVE(open64, "open64");
    RESOLVE(pwritev, "pwritev");
    RESOLVE(pwritev64, "pwritev64");
    RESOLVE(pwrite, "pwrite");
    RESOLVE(pwrite64, "pwrite64");
    RESOLVE(pread64, "pread64");
    RESOLVE(fdatasync, "fdatasync");
    RESOLVE(fsync, "fsync");
    RESOLVE(close, "close");
    g.eio_file = getenv("TKFAULT_EIO_FILE");
    g.undo_dir = getenv("TKFAULT_UNDO_DIR");
}

static void ensure_init(void)
{
    pthread_once(&g.once, init);
}

static bool is_segment(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    return strcmp(base, "segment.prepare") == 0 ||
           (n > 4 && strcmp(base + n - 4, ".seg") == 0);
}

static void watch(int fd, const char *path)
{
    if (fd < 0 || fd >= FD_MAX || !is_segment(path))
        return;
    int ufd = 0;
    if (g.undo_dir != NULL) {
        struct stat st;
        if (fstat(fd, &st) == 0) {
            char up[4096];
            snprintf(up, sizeof(up), "%s/%llu.undo", g.undo_dir,
                     (unsigned long long)st.st_ino);
            ufd = g.open64(up, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (ufd < 0)
                ufd = 0;
        }
    }
    pthread_mutex_lock(&g.mu);
    g.watched[fd] = true;
    g.undo_fd[fd] = ufd;
    pthread_mutex_unlock(&g.mu);
}

static int do_open(open_fn *real, const char *path, int flags, va_list ap)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE))
        mode = (mode_t)va_arg(ap, int);
    int fd = real(path, flags, mode);
    if (fd >= 0)
        watch(fd, path);
    return fd;
}

int open(const char *path, int flags, ...)
{
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int fd = do_open(g.open, path, flags, ap);
    va_end(ap);
    return fd;
}

int open64(const char *path, int flags, ...)
{
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int fd = do_open(g.open64, path, flags, ap);
    va_end(ap);
    return fd;
}

int close(int fd)
{
    ensure_init();
    if (fd >= 0 && fd < FD_MAX) {
        pthread_mutex_lock(&g.mu);
        if (g.watched[fd] && g.undo_fd[fd] > 0)
            g.close(g.undo_fd[fd]);
        g.watched[fd] = false;
        g.undo_fd[fd] = 0;
        pthread_mutex_unlock(&g.mu);
    }
    return g.close(fd);
}

static bool watched_fd(int fd)
{
    return fd >= 0 && fd < FD_MAX && g.watched[fd];
}

/* Appends the old bytes of [off, off + len) to fd's undo file. Called with
 * g.mu held. Failure to record aborts: a silent gap would make the test lie. */
static void record_undo(int fd, off_t off, size_t len)
{
    int ufd = g.undo_fd[fd];
    if (ufd <= 0 || len == 0)
        return;
    uint8_t *buf = malloc(16 + len);
    if (buf == NULL) {
        fprintf(stderr, "faultfs: out of memory\n");
        abort();
    }
    ssize_t got = g.pread64(fd, buf + 16, len, off);
    if (got < 0)
        got = 0;
    uint64_t hdr[2] = {(uint64_t)off, (uint64_t)got};
    memcpy(buf, hdr, 16);
    size_t total = 16 + (size_t)got;
    size_t done = 0;
    while (done < total) {
        ssize_t w = write(ufd, buf + done, total - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "faultfs: cannot write the undo log: %s\n", strerror(errno));
            abort();
        }
        done += (size_t)w;
    }
    free(buf);
}

static ssize_t do_pwritev(pwritev_fn *real, int fd, const struct iovec *iov, int n,
                          off_t off)
{
    ensure_init();
    if (!watched_fd(fd) || g.undo_dir == NULL)
        return real(fd, iov, n, off);
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    pthread_mutex_lock(&g.mu);
    record_undo(fd, off, len);
    ssize_t r = real(fd, iov, n, off);
    pthread_mutex_unlock(&g.mu);
    return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    ensure_init();
    return do_pwritev(g.pwritev, fd, iov, n, off);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int n, off_t off)
{
    ensure_init();
    return do_pwritev(g.pwritev64, fd, iov, n, off);
}

static ssize_t do_pwrite(pwrite_fn *real, int fd, const void *p, size_t len, off_t off)
{
    if (!watched_fd(fd) || g.undo_dir == NULL)
        return real(fd, p, len, off);
    pthread_mutex_lock(&g.mu);
    record_undo(fd, off, len);
    ssize_t r = real(fd, p, len, off);
    pthread_mutex_unlock(&g.mu);
    return r;
}

ssize_t pwrite(int fd, const void *p, size_t len, off_t off)
{
    ensure_init();
    return do_pwrite(g.pwrite, fd, p, len, off);
}

ssize_t pwrite64(int fd, const void *p, size_t len, off_t off)
{
    ensure_init();
    return do_pwrite(g.pwrite64, fd, p, len, off);
}

static int do_sync(sync_fn *real, int fd)
{
    if (!watched_fd(fd))
        return real(fd);
    if (g.eio_file != NULL && access(g.eio_file, F_OK) == 0) {
        errno = EIO;
        return -1;
    }
    pthread_mutex_lock(&g.mu);
    int r = real(fd);
    if (r == 0 && g.undo_fd[fd] > 0 && ftruncate(g.undo_fd[fd], 0) != 0) {
        fprintf(stderr, "faultfs: cannot reset the undo log: %s\n", strerror(errno));
        abort();
    }
    pthread_mutex_unlock(&g.mu);
    return r;
}

int fdatasync(int fd)
{
    ensure_init();
    return do_sync(g.fdatasync, fd);
}

int fsync(int fd)
{
    ensure_init();
    return do_sync(g.fsync, fd);
}
