/*
 * fake_gai.h - what the tests of name lookups (test_resolve, test_dial)
 * share around getaddrinfo, which they wrap at link time
 * (-Wl,--wrap=getaddrinfo; each test's __wrap_getaddrinfo decides what a
 * name gives): a gate that names under ".hang.test" wait at (a name server
 * that does not answer) until the test opens it, and address lists made
 * of numeric addresses. Header-only, for one test file each.
 */
#ifndef WEFT_FAKE_GAI_H
#define WEFT_FAKE_GAI_H

#include "testutil.h"

#include <netdb.h>

int __real_getaddrinfo(const char *node, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res);
int __wrap_getaddrinfo(const char *node, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res);

static pthread_mutex_t fg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fg_cond = PTHREAD_COND_INITIALIZER;
static bool fg_open;
static unsigned fg_hung, fg_hung_max; /* waiting now; most at once */

static inline bool fg_ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* In the wrapper: a name under .hang.test waits until the gate opens;
 * true if node was one. */
static inline bool fg_hang(const char *node) {
  if (!node || !fg_ends_with(node, ".hang.test"))
    return false;
  pthread_mutex_lock(&fg_lock);
  fg_hung++;
  if (fg_hung > fg_hung_max)
    fg_hung_max = fg_hung;
  pthread_cond_broadcast(&fg_cond);
  while (!fg_open)
    pthread_cond_wait(&fg_cond, &fg_lock);
  fg_hung--;
  pthread_mutex_unlock(&fg_lock);
  return true;
}

static inline void fg_gate_reset(void) {
  pthread_mutex_lock(&fg_lock);
  fg_open = false;
  fg_hung = fg_hung_max = 0;
  pthread_mutex_unlock(&fg_lock);
}

static inline void fg_gate_open(void) {
  pthread_mutex_lock(&fg_lock);
  fg_open = true;
  pthread_cond_broadcast(&fg_cond);
  pthread_mutex_unlock(&fg_lock);
}

static inline unsigned fg_hung_most(void) {
  pthread_mutex_lock(&fg_lock);
  unsigned n = fg_hung_max;
  pthread_mutex_unlock(&fg_lock);
  return n;
}

/* Waits until n lookups wait at the gate. Test thread. */
static inline void fg_wait_hung(unsigned n) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    pthread_mutex_lock(&fg_lock);
    unsigned got = fg_hung;
    pthread_mutex_unlock(&fg_lock);
    if (got >= n)
      return;
    if (tu_now_ns() > deadline)
      fail_msg("only %u of %u lookups reached the name server", got, n);
    tu_sleep_ms(1);
  }
}

/* The numeric addresses in hosts (NULL-terminated) as one list, in that
 * order; glibc frees each node on its own, so a chain of several
 * getaddrinfo results is freed whole by freeaddrinfo. */
static inline int fg_chain(const char *const *hosts, const char *service,
                           const struct addrinfo *hints,
                           struct addrinfo **res) {
  struct addrinfo h = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                       .ai_socktype = hints ? hints->ai_socktype : 0};
  struct addrinfo *head = NULL, **tail = &head;
  for (; *hosts; hosts++) {
    struct addrinfo *r;
    int e = __real_getaddrinfo(*hosts, service, &h, &r);
    if (e != 0) {
      if (head)
        freeaddrinfo(head);
      return e;
    }
    *tail = r;
    while (*tail)
      tail = &(*tail)->ai_next;
  }
  *res = head;
  return 0;
}

#endif
