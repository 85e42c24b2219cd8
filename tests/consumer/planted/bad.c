/* Exports node_start beside the header's tk_planted: check-exports.sh must
 * reject both the shared and the static form (tests/consumer/meson.build). */
#include "bad.h"

__attribute__((visibility("default"))) int node_start(void);

int tk_planted(void)
{
    return 1;
}

int node_start(void)
{
    return 2;
}
