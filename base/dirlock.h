/* One owner per data directory: an exclusive flock(2) on DIR/LOCK.
 *
 * A node's data directory (the Raft log and the state machine) must be opened
 * by one process at a time: two nodes on one directory both write segments
 * and LMDB pages, and the directory is corrupt once they stop. The owner
 * takes the lock before anything in the directory is read or written and
 * holds it (an open descriptor) for as long as it uses the directory. A
 * second taker is refused with TK_EBUSY and a message naming the directory
 * and the holder's pid, which the holder writes into LOCK (decimal and a
 * newline) once it has the lock.
 *
 * The lock belongs to the open file description, not to the process: two
 * takes in one process (two nodes of an in-process cluster given the same
 * directory) conflict like two processes. The kernel drops it when the
 * holder exits or crashes, so a LOCK file left behind (with a dead pid in it)
 * never blocks the next start. The file stays in the directory; removing it
 * while a process holds it would let a second process lock a new file, so
 * only a holder may remove it (tk_dirlock_take checks, after locking, that
 * the file it locked is still the one the directory names).
 *
 * Threads: any; nothing is shared. A child made by fork(2) shares the
 * descriptor, and with it the lock; the descriptor is close-on-exec. */
#ifndef TK_BASE_DIRLOCK_H
#define TK_BASE_DIRLOCK_H

#include <stddef.h>

/* The lock file's name inside the directory. */
#define TK_DIRLOCK_FILE "LOCK"

/* Enough for every message below with a path of a few hundred bytes. */
#define TK_DIRLOCK_MSG_MAX 1024

/* Takes the lock of `dir` (which must exist): creates DIR/LOCK (mode 0600)
 * if missing, locks it without waiting, and writes this process's pid into
 * it. Returns 0 with the held descriptor in *fd_out (release it with
 * tk_dirlock_release) and err empty. Otherwise no descriptor is left open and
 * err says why, naming the directory: TK_EBUSY when another open descriptor
 * (another process, or another take in this one) holds the lock, with the
 * holder's pid when LOCK holds one; TK_EINVAL when the path is too long;
 * TK_EIO when LOCK cannot be opened, locked or written (a read-only volume,
 * a symlink in its place, a file system without flock). */
int tk_dirlock_take(const char *dir, int *fd_out, char *err, size_t cap);

/* Releases a lock taken by tk_dirlock_take: empties LOCK (its pid would be
 * stale) and closes the descriptor. A negative fd is ignored. */
void tk_dirlock_release(int fd);

#endif
