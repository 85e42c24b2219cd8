/* tk_opendir: see base/dir.h. */
#include "base/dir.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

DIR *tk_opendir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return d;
}
