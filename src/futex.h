/*
 * futex.h - the futex calls every sleeper of the runtime uses: parked
 * threads, spares, the monitor and weft__lock's waiters. Process-private
 * futexes on 32-bit atomic words.
 */
#ifndef WEFT_FUTEX_H
#define WEFT_FUTEX_H

#include "clock.h"

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef WEFT_MODEL
/* tests/model/model.c: the explorer's futexes, which sleep and wake its
 * simulated threads (deadline UINT64_MAX: none). */
void weft__model_futex_wait(_Atomic uint32_t *addr, uint32_t expected,
                            uint64_t deadline_ns, const char *file, int line);
void weft__model_futex_wake(_Atomic uint32_t *addr, int n, const char *file,
                            int line);
#define weft__futex_wait(addr, expected)                                       \
  weft__model_futex_wait((addr), (expected), UINT64_MAX, __FILE__, __LINE__)
#define weft__futex_wait_until(addr, expected, deadline_ns)                    \
  weft__model_futex_wait((addr), (expected), (deadline_ns), __FILE__, __LINE__)
#define weft__futex_wake(addr, n)                                              \
  weft__model_futex_wake((addr), (n), __FILE__, __LINE__)
#else

/* Sleeps while *addr == expected. EINTR and EAGAIN (the value changed)
 * both just return: callers loop on their own condition. */
static inline void weft__futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL,
          0);
}

/* The same, until CLOCK_MONOTONIC reaches deadline_ns. FUTEX_WAIT_BITSET
 * takes an absolute deadline: no drift between reading the clock and
 * sleeping. */
static inline void weft__futex_wait_until(_Atomic uint32_t *addr,
                                          uint32_t expected,
                                          uint64_t deadline_ns) {
  struct timespec ts = weft__timespec(deadline_ns);
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_BITSET_PRIVATE, expected, &ts,
          NULL, FUTEX_BITSET_MATCH_ANY);
}

static inline void weft__futex_wake(_Atomic uint32_t *addr, int n) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#endif

#endif
