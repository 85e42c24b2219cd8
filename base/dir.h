/* Directory listing that thread checkers can follow.
 *
 * opendir() takes a descriptor without ThreadSanitizer seeing it created, so
 * when the number was another thread's socket a moment before (one node's
 * dial while another node of the same process lists its data directory),
 * the closedir() reads as a race on that descriptor. tk_opendir opens the
 * directory with open() (which the checker sees) and wraps it with
 * fdopendir(); closedir() closes it as usual. */
#ifndef TK_BASE_DIR_H
#define TK_BASE_DIR_H

#include <dirent.h>

/* opendir(path): NULL with errno set on failure. */
DIR *tk_opendir(const char *path);

#endif
