/* Error names and messages, generated from the single TK_ERRORS list in
 * err.h so a new code cannot be added without its message. Both functions
 * return static strings and are safe to call from any thread. */
#include "base/err.h"

const char *tk_strerror(int rc)
{
    switch (rc) {
#define TK__ERR_MSG(name, value, msg)                                                    \
    case (value):                                                                        \
        return (msg);
        TK_ERRORS(TK__ERR_MSG)
#undef TK__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *tk_errname(int rc)
{
    switch (rc) {
#define TK__ERR_NAME(name, value, msg)                                                   \
    case (value):                                                                        \
        return #name;
        TK_ERRORS(TK__ERR_NAME)
#undef TK__ERR_NAME
    default:
        return "TK_E?";
    }
}
