/*
 * testutil.h - small helpers shared by weft's tests.
 *
 *  - TU_SCALED(n, floor): stress iterations divided by WEFT_TEST_SCALE
 *    (1 normal, 8 under ASan, 16 under TSan), never below floor.
 *  - Checks from threads other than the cmocka test thread (handlers, helper
 *    threads): TU_CHECK / TU_CHECKF record a failure (cmocka's assert macros
 *    longjmp and must only be used on the test thread); the test thread then
 *    calls TU_ASSERT_NO_ASYNC_ERRORS().
 *  - Bounded waits: every wait polls with a 1 ms sleep for at most
 *    TU_WAIT_S seconds, then fails the test with what it saw. A watchdog
 *    aborts the process, naming the phase, before ctest's TIMEOUT would.
 *  - A gate (a handler that blocks until opened), a tiny barrier, helper
 *    threads with bounded joins, a deterministic PRNG.
 *
 * Nothing here measures speed: timeouts only turn a hang into a failure.
 */
#ifndef WEFT_TESTUTIL_H
#define WEFT_TESTUTIL_H

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "weft.h"

#ifndef WEFT_TEST_SCALE
#define WEFT_TEST_SCALE 1
#endif

/* Seconds a single bounded wait may take before the test fails. Generous:
 * the machine is shared and sanitizers are slow; this only catches hangs. */
#ifndef TU_WAIT_S
#define TU_WAIT_S 60
#endif

/* Seconds after which the watchdog aborts the whole test program. Set by
 * tests/CMakeLists.txt a little below the ctest TIMEOUT. */
#ifndef WEFT_TEST_WATCHDOG_S
#define WEFT_TEST_WATCHDOG_S 220
#endif

typedef _Atomic uint64_t tu_count;

/* ------------------------------------------------------------------ scale */

static inline uint64_t tu_scaled(uint64_t n, uint64_t floor_) {
  uint64_t scale = (WEFT_TEST_SCALE) > 0 ? (uint64_t)(WEFT_TEST_SCALE) : 1;
  uint64_t v = n / scale;
  return v < floor_ ? floor_ : v;
}
#define TU_SCALED(n, floor_) tu_scaled((uint64_t)(n), (uint64_t)(floor_))

/* ------------------------------------------------------------------- time */

static inline uint64_t tu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void tu_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline uint64_t tu_deadline_ns(unsigned seconds) {
  return tu_now_ns() + (uint64_t)seconds * 1000000000u;
}

/* --------------------------------------------------- failures off-thread */

static inline atomic_uint *tu_async_errors(void) {
  static atomic_uint n;
  return &n;
}

static inline void tu_async_fail(const char *file, int line, const char *fmt,
                                 ...) __attribute__((format(printf, 3, 4)));
static inline void tu_async_fail(const char *file, int line, const char *fmt,
                                 ...) {
  unsigned n = atomic_fetch_add(tu_async_errors(), 1);
  if (n < 20) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d: check failed: %s\n", file, line, buf);
  } else if (n == 20) {
    fprintf(stderr, "(further failed checks are counted, not printed)\n");
  }
}

/* Usable from any thread, handlers included. */
#define TU_CHECK(cond)                                                         \
  do {                                                                         \
    if (!(cond))                                                               \
      tu_async_fail(__FILE__, __LINE__, "%s", #cond);                          \
  } while (0)
#define TU_CHECKF(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond))                                                               \
      tu_async_fail(__FILE__, __LINE__, __VA_ARGS__);                          \
  } while (0)

/* Test thread only. */
#define TU_ASSERT_NO_ASYNC_ERRORS()                                            \
  do {                                                                         \
    unsigned n_ = atomic_load(tu_async_errors());                              \
    if (n_ != 0) {                                                             \
      print_error("%u check(s) failed in handlers or helper threads (see "     \
                  "stderr above)\n",                                           \
                  n_);                                                         \
      _fail(__FILE__, __LINE__);                                               \
    }                                                                          \
  } while (0)

static inline void tu_reset_async_errors(void) {
  atomic_store(tu_async_errors(), 0);
}

/* ---------------------------------------------------------------- watchdog */

static inline _Atomic(const char *) *tu_phase_slot(void) {
  static _Atomic(const char *) phase;
  return &phase;
}

/* Names what the test is doing, for the watchdog's message. */
static inline void tu_phase(const char *what) {
  atomic_store(tu_phase_slot(), what);
}

static inline void *tu_watchdog_main(void *arg) {
  unsigned seconds = (unsigned)(uintptr_t)arg;
  uint64_t deadline = tu_deadline_ns(seconds);
  while (tu_now_ns() < deadline)
    tu_sleep_ms(200);
  const char *p = atomic_load(tu_phase_slot());
  fprintf(stderr,
          "WATCHDOG: test still running after %u s, in phase \"%s\": "
          "aborting (a hang is a failure)\n",
          seconds, p ? p : "?");
  fflush(stderr);
  abort();
  return NULL;
}

/* Starts (once per process) a detached thread that aborts the process if it
 * is still running after WEFT_TEST_WATCHDOG_S seconds. Call from main(). */
static inline void tu_watchdog_start(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, tu_watchdog_main,
                     (void *)(uintptr_t)(WEFT_TEST_WATCHDOG_S)) != 0) {
    fprintf(stderr, "cannot start the watchdog thread\n");
    abort();
  }
  pthread_detach(t);
}

/* ---------------------------------------------------------- bounded waits */

/* Waits until *c >= target; fails the test (test thread only) on timeout. */
#define tu_wait_count(c, target, what)                                         \
  tu_wait_count_(__FILE__, __LINE__, (c), (target), (what))
static inline void tu_wait_count_(const char *file, int line, tu_count *c,
                                  uint64_t target, const char *what) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    uint64_t v = atomic_load(c);
    if (v >= target)
      return;
    if (tu_now_ns() > deadline) {
      print_error("timed out after %d s waiting for %s: %" PRIu64 " of %" PRIu64
                  "\n",
                  TU_WAIT_S, what, v, target);
      _fail(file, line);
      return;
    }
    tu_sleep_ms(1);
  }
}

/* As tu_wait_count, from any thread: returns false on timeout and records an
 * async failure instead of failing at once. */
static inline bool tu_wait_count_bg(tu_count *c, uint64_t target,
                                    const char *what) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    uint64_t v = atomic_load(c);
    if (v >= target)
      return true;
    if (tu_now_ns() > deadline) {
      tu_async_fail(__FILE__, __LINE__,
                    "timed out waiting for %s: %" PRIu64 " of %" PRIu64, what,
                    v, target);
      return false;
    }
    tu_sleep_ms(1);
  }
}

/* A predicate for tu_wait_until: returns true when satisfied, and otherwise
 * may describe the state it saw in buf (for the failure message). */
typedef bool (*tu_pred)(void *ctx, char *buf, size_t len);

#define tu_wait_until(pred, ctx, what)                                         \
  tu_wait_until_(__FILE__, __LINE__, (pred), (ctx), (what))
static inline void tu_wait_until_(const char *file, int line, tu_pred pred,
                                  void *ctx, const char *what) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  char buf[256];
  for (;;) {
    buf[0] = '\0';
    if (pred(ctx, buf, sizeof buf))
      return;
    if (tu_now_ns() > deadline) {
      print_error("timed out after %d s waiting for %s (%s)\n", TU_WAIT_S, what,
                  buf);
      _fail(file, line);
      return;
    }
    tu_sleep_ms(1);
  }
}

/* Reads the runtime's stats, failing the test if that fails. */
#define tu_stats(rt, st) tu_stats_(__FILE__, __LINE__, (rt), (st))
static inline void tu_stats_(const char *file, int line, weft_rt *rt,
                             weft_stats *st) {
  memset(st, 0, sizeof *st);
  int rc = weft_rt_stats(rt, st);
  if (rc != 0) {
    print_error("weft_rt_stats failed: %d (%s)\n", rc, weft_strerror(rc));
    _fail(file, line);
  }
}

/* Predicate contexts on the runtime's stats. */
typedef struct tu_stat_wait {
  weft_rt *rt;
  uint64_t value;
} tu_stat_wait;

static inline bool tu_pred_handlers_run_ge(void *ctx, char *buf, size_t len) {
  tu_stat_wait *w = ctx;
  weft_stats st;
  memset(&st, 0, sizeof st);
  if (weft_rt_stats(w->rt, &st) != 0) {
    snprintf(buf, len, "weft_rt_stats failed");
    return false;
  }
  snprintf(buf, len, "handlers_run %" PRIu64 ", want %" PRIu64,
           st.total.handlers_run, w->value);
  return st.total.handlers_run >= w->value;
}

static inline bool tu_pred_strands_live_le(void *ctx, char *buf, size_t len) {
  tu_stat_wait *w = ctx;
  weft_stats st;
  memset(&st, 0, sizeof st);
  if (weft_rt_stats(w->rt, &st) != 0) {
    snprintf(buf, len, "weft_rt_stats failed");
    return false;
  }
  snprintf(buf, len, "strands_live %" PRIu64 ", want <= %" PRIu64,
           st.strands_live, w->value);
  return st.strands_live <= w->value;
}

/* ------------------------------------------------------------------- gate */

/* A gate: tu_gate_pass blocks (bounded) until tu_gate_open. Posting
 * tu_gate_handler to a strand holds everything queued behind it. */
typedef struct tu_gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  bool open;
  tu_count entered; /* threads that reached tu_gate_pass */
  tu_count passed;  /* threads that left it */
} tu_gate;

static inline void tu_gate_init(tu_gate *g) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&g->m, NULL);
  pthread_cond_init(&g->c, &ca);
  pthread_condattr_destroy(&ca);
  g->open = false;
  atomic_init(&g->entered, 0);
  atomic_init(&g->passed, 0);
}

static inline void tu_gate_open(tu_gate *g) {
  pthread_mutex_lock(&g->m);
  g->open = true;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

/* Returns false (and records a failure) if the gate stayed shut for
 * TU_WAIT_S seconds; it never blocks forever. */
static inline bool tu_gate_pass(tu_gate *g) {
  struct timespec dl;
  bool ok = true;
  atomic_fetch_add(&g->entered, 1);
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += TU_WAIT_S;
  pthread_mutex_lock(&g->m);
  while (!g->open) {
    if (pthread_cond_timedwait(&g->c, &g->m, &dl) == ETIMEDOUT && !g->open) {
      tu_async_fail(__FILE__, __LINE__, "gate not opened within %d s",
                    TU_WAIT_S);
      ok = false;
      break;
    }
  }
  pthread_mutex_unlock(&g->m);
  atomic_fetch_add(&g->passed, 1);
  return ok;
}

/* A weft handler that passes the gate given as arg. */
static inline void tu_gate_handler(void *arg) { tu_gate_pass(arg); }

static inline void tu_gate_destroy(tu_gate *g) {
  pthread_cond_destroy(&g->c);
  pthread_mutex_destroy(&g->m);
}

/* ---------------------------------------------------------------- barrier */

/* A reusable barrier for n threads; bounded like everything else. */
typedef struct tu_barrier {
  pthread_mutex_t m;
  pthread_cond_t c;
  unsigned n, waiting;
  uint64_t generation;
} tu_barrier;

static inline void tu_barrier_init(tu_barrier *b, unsigned n) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&b->m, NULL);
  pthread_cond_init(&b->c, &ca);
  pthread_condattr_destroy(&ca);
  b->n = n;
  b->waiting = 0;
  b->generation = 0;
}

static inline bool tu_barrier_wait(tu_barrier *b) {
  struct timespec dl;
  bool ok = true;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += TU_WAIT_S;
  pthread_mutex_lock(&b->m);
  uint64_t gen = b->generation;
  if (++b->waiting == b->n) {
    b->waiting = 0;
    b->generation++;
    pthread_cond_broadcast(&b->c);
  } else {
    while (gen == b->generation) {
      if (pthread_cond_timedwait(&b->c, &b->m, &dl) == ETIMEDOUT &&
          gen == b->generation) {
        tu_async_fail(__FILE__, __LINE__, "barrier timed out");
        ok = false;
        break;
      }
    }
  }
  pthread_mutex_unlock(&b->m);
  return ok;
}

static inline void tu_barrier_destroy(tu_barrier *b) {
  pthread_cond_destroy(&b->c);
  pthread_mutex_destroy(&b->m);
}

/* ---------------------------------------------------------------- threads */

#define tu_thread_start(t, fn, arg)                                            \
  do {                                                                         \
    int rc_ = pthread_create((t), NULL, (fn), (arg));                          \
    if (rc_ != 0)                                                              \
      fail_msg("pthread_create: %s", strerror(rc_));                           \
  } while (0)

/* Joins a helper thread, failing the test if it has not ended within
 * TU_WAIT_S seconds (the thread is then left behind; the test has failed). */
#define tu_thread_join(t, what) tu_thread_join_(__FILE__, __LINE__, (t), (what))
static inline void tu_thread_join_(const char *file, int line, pthread_t t,
                                   const char *what) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += TU_WAIT_S;
  int rc = pthread_timedjoin_np(t, NULL, &dl);
  if (rc != 0) {
    print_error("thread \"%s\" did not end within %d s (%s)\n", what, TU_WAIT_S,
                strerror(rc));
    _fail(file, line);
  }
}

/* ------------------------------------------------------------------- misc */

/* splitmix64: a deterministic PRNG step. */
static inline uint64_t tu_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Creates a runtime with the given workers and batch, failing on error. */
#define tu_rt_create(rtp, workers, batch)                                      \
  tu_rt_create_(__FILE__, __LINE__, (rtp), (workers), (batch))
static inline void tu_rt_create_(const char *file, int line, weft_rt **rtp,
                                 unsigned workers, unsigned batch) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = workers;
  cfg.batch = batch;
  *rtp = NULL;
  int rc = weft_rt_create(rtp, &cfg);
  if (rc != 0 || *rtp == NULL) {
    print_error("weft_rt_create(workers=%u, batch=%u) failed: %d (%s)\n",
                workers, batch, rc, weft_strerror(rc));
    _fail(file, line);
  }
}

#define tu_strand_create(rt, sp)                                               \
  do {                                                                         \
    int rc_ = weft_strand_create((rt), (sp));                                  \
    if (rc_ != 0)                                                              \
      fail_msg("weft_strand_create failed: %d (%s)", rc_, weft_strerror(rc_)); \
  } while (0)

/* Asserts that a call returned the expected code, naming both codes. */
#define tu_assert_rc(call, want)                                               \
  do {                                                                         \
    int got_ = (call);                                                         \
    int want_ = (want);                                                        \
    if (got_ != want_)                                                         \
      fail_msg("%s returned %d (%s), expected %d (%s)", #call, got_,           \
               weft_strerror(got_), want_, weft_strerror(want_));              \
  } while (0)

#endif /* WEFT_TESTUTIL_H */
