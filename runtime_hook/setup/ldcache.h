/* runtime_hook/setup/ldcache.c: `gpuwire-hook ldcache ARG...` done in C, or declined */
#include <stddef.h>

#define LDCACHE_DECLINED 1

/* 0: done; LDCACHE_DECLINED: nothing changed, the Python hook is to do it. `state`: the OCI
 * state the runtime wrote on stdin. */
int ldcache_hook(int argc, char **argv, const char *state, size_t size);

/* write all of `data` to `fd` (restarted where interrupted); 0, or -1 with errno */
int write_all(int fd, const void *data, size_t size);
