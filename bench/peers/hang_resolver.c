/*
 * hang_resolver.c - an LD_PRELOAD library for bench/resolve_isolation: a
 * getaddrinfo that never answers for names ending in ".hang.test" (a name
 * server that drops every query, without the timeouts that would end the
 * wait), and passes every other name to the C library's.
 */
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                      struct addrinfo **);

int getaddrinfo(const char *node, const char *service,
                const struct addrinfo *hints, struct addrinfo **res) {
  static const char tail[] = ".hang.test";
  size_t n = node ? strlen(node) : 0;
  if (n >= sizeof(tail) - 1 && !strcmp(node + n - (sizeof(tail) - 1), tail))
    for (;;)
      pause(); /* until the process exits */
  gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  return real ? real(node, service, hints, res) : EAI_SYSTEM;
}
