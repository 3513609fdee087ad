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

/* TU_UNDER_ASAN: defined in an AddressSanitizer build. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_UNDER_ASAN 1
#endif
#endif

/* TU_UNDER_TSAN: defined in a ThreadSanitizer build. */
#if defined(__SANITIZE_THREAD__)
#define TU_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TU_UNDER_TSAN 1
#endif
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

/* Creates a runtime whose stalls go to fn (not to stderr), with the given
 * workers and stall threshold (0: the default), failing on error. */
#define tu_rt_create_watched(rtp, workers, stall_ns, fn, ctx)                  \
  tu_rt_create_watched_(__FILE__, __LINE__, (rtp), (workers), (stall_ns),      \
                        (fn), (ctx))
static inline void tu_rt_create_watched_(const char *file, int line,
                                         weft_rt **rtp, unsigned workers,
                                         uint64_t stall_ns, weft_stall_fn fn,
                                         void *ctx) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = workers;
  cfg.stall_threshold_ns = stall_ns;
  cfg.on_stall = fn;
  cfg.on_stall_ctx = ctx;
  *rtp = NULL;
  int rc = weft_rt_create(rtp, &cfg);
  if (rc != 0 || *rtp == NULL) {
    print_error("weft_rt_create(workers=%u, stall %" PRIu64
                " ns) failed: %d (%s)\n",
                workers, stall_ns, rc, weft_strerror(rc));
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

/* ------------------------------------------------------------------ events */

/* A counter that waiters block on (a condition variable, no polling): for
 * loops that wait many times, where the 1 ms poll of tu_wait_count would
 * dominate. tu_event_add may be called from any thread, handlers included. */
typedef struct tu_event {
  pthread_mutex_t m;
  pthread_cond_t c;
  uint64_t v;
} tu_event;

static inline void tu_event_init(tu_event *e) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&e->m, NULL);
  pthread_cond_init(&e->c, &ca);
  pthread_condattr_destroy(&ca);
  e->v = 0;
}

static inline void tu_event_destroy(tu_event *e) {
  pthread_cond_destroy(&e->c);
  pthread_mutex_destroy(&e->m);
}

static inline void tu_event_add(tu_event *e, uint64_t n) {
  pthread_mutex_lock(&e->m);
  e->v += n;
  pthread_cond_broadcast(&e->c);
  pthread_mutex_unlock(&e->m);
}

static inline uint64_t tu_event_get(tu_event *e) {
  pthread_mutex_lock(&e->m);
  uint64_t v = e->v;
  pthread_mutex_unlock(&e->m);
  return v;
}

/* Waits until the count reaches target, at most TU_WAIT_S seconds. Any
 * thread: on timeout it records an async failure and returns false. */
static inline bool tu_event_wait_bg(tu_event *e, uint64_t target,
                                    const char *what) {
  struct timespec dl;
  bool ok = true;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += TU_WAIT_S;
  pthread_mutex_lock(&e->m);
  while (e->v < target) {
    if (pthread_cond_timedwait(&e->c, &e->m, &dl) == ETIMEDOUT &&
        e->v < target) {
      tu_async_fail(__FILE__, __LINE__,
                    "timed out after %d s waiting for %s: %" PRIu64
                    " of %" PRIu64,
                    TU_WAIT_S, what, e->v, target);
      ok = false;
      break;
    }
  }
  pthread_mutex_unlock(&e->m);
  return ok;
}

/* The same on the test thread: fails the test on timeout. */
#define tu_event_wait(e, target, what)                                         \
  do {                                                                         \
    if (!tu_event_wait_bg((e), (target), (what)))                              \
      fail_msg("timed out waiting for %s", (what));                            \
  } while (0)

/* As tu_assert_rc, from any thread (handlers, callbacks): records a failure
 * instead of failing at once. */
#define TU_CHECK_RC(call, want)                                                \
  do {                                                                         \
    int got_ = (call);                                                         \
    int want_ = (want);                                                        \
    if (got_ != want_)                                                         \
      tu_async_fail(__FILE__, __LINE__,                                        \
                    "%s returned %d (%s), expected %d (%s)", #call, got_,      \
                    weft_strerror(got_), want_, weft_strerror(want_));         \
  } while (0)

/* ------------------------------------------------------------------ timers */

/* A one-shot timer armed for `deadline` on `strand` (NULL: the runtime):
 * tu_tslot_handler checks that it fired with status 0 and missed 0, never
 * early, on its strand, exactly once, and counts it in *fired. */
typedef struct tu_tslot {
  uint64_t deadline;
  weft_strand *strand;
  atomic_uint calls;
  tu_count *fired;
} tu_tslot;

static inline void tu_tslot_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  tu_tslot *sl = arg;
  TU_CHECKF(status == 0, "status %d (%s)", status, weft_strerror(status));
  TU_CHECKF(missed == 0, "missed %" PRIu64, missed);
  TU_CHECKF(now >= sl->deadline, "fired %" PRIu64 " ns early",
            sl->deadline - now);
  TU_CHECKF(weft_strand_current() == sl->strand, "ran on strand %p, not %p",
            (void *)weft_strand_current(), (void *)sl->strand);
  unsigned c = atomic_fetch_add(&sl->calls, 1);
  TU_CHECKF(c == 0, "fired %u times", c + 1);
  atomic_fetch_add(sl->fired, 1);
}

/* ---------------------------------------------------------- on a strand */

/* Runs fn(arg) on strand s and waits (bounded) until it has returned. Test
 * thread only: weft_tcp_* calls that must run on a connection's strand. */
typedef struct tu_strand_call {
  weft_fn fn;
  void *arg;
  tu_event done;
} tu_strand_call;

static inline void tu_strand_call_handler(void *arg) {
  tu_strand_call *sc = arg;
  sc->fn(sc->arg);
  tu_event_add(&sc->done, 1);
}

#define tu_on_strand(s, fn, arg)                                               \
  tu_on_strand_(__FILE__, __LINE__, (s), (fn), (arg))
static inline void tu_on_strand_(const char *file, int line, weft_strand *s,
                                 weft_fn fn, void *arg) {
  tu_strand_call sc = {.fn = fn, .arg = arg};
  tu_event_init(&sc.done);
  int rc = weft_post(s, tu_strand_call_handler, &sc);
  if (rc != 0) {
    tu_event_destroy(&sc.done);
    print_error("weft_post to run on a strand failed: %d (%s)\n", rc,
                weft_strerror(rc));
    _fail(file, line);
    return;
  }
  bool ok = tu_event_wait_bg(&sc.done, 1, "a handler posted to a strand");
  tu_event_destroy(&sc.done);
  if (!ok)
    _fail(file, line);
}

/* ----------------------------------------------------------------- backend */

/* The backend that the environment variable WEFT_BACKEND names
 * (WEFT_BACKEND_URING, _EPOLL, _NONE), -1 when it is unset or empty, -2 when
 * it names none of them. */
static inline int tu_backend_from_env(void) {
  const char *e = getenv("WEFT_BACKEND");
  if (e == NULL || *e == '\0')
    return -1;
  if (strcmp(e, "uring") == 0)
    return WEFT_BACKEND_URING;
  if (strcmp(e, "epoll") == 0)
    return WEFT_BACKEND_EPOLL;
  if (strcmp(e, "none") == 0)
    return WEFT_BACKEND_NONE;
  return -2;
}

static inline const char *tu_backend_str(int b) {
  switch (b) {
  case WEFT_BACKEND_URING:
    return "uring";
  case WEFT_BACKEND_EPOLL:
    return "epoll";
  case WEFT_BACKEND_NONE:
    return "none";
  default:
    return "?";
  }
}

/* Fails the test if the runtime's backend is not the one WEFT_BACKEND
 * names (a silent fallback), or if its name does not match its number.
 * Test thread only. */
#define tu_assert_backend(rt) tu_assert_backend_(__FILE__, __LINE__, (rt))
static inline void tu_assert_backend_(const char *file, int line, weft_rt *rt) {
  int got = weft_rt_backend(rt);
  const char *name = weft_rt_backend_name(rt);
  if (name == NULL || strcmp(name, tu_backend_str(got)) != 0) {
    print_error("weft_rt_backend is %d but weft_rt_backend_name is \"%s\"\n",
                got, name ? name : "(null)");
    _fail(file, line);
    return;
  }
  int want = tu_backend_from_env();
  if (want == -2) {
    print_error("WEFT_BACKEND=\"%s\" names no backend\n",
                getenv("WEFT_BACKEND"));
    _fail(file, line);
  } else if (want >= 0 && got != want) {
    print_error("WEFT_BACKEND=%s, but the runtime uses %s\n",
                tu_backend_str(want), name);
    _fail(file, line);
  }
}

/* ----------------------------------------------------------------- sockets */

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

/* 127.0.0.1:port. */
static inline void tu_addr_loopback(struct sockaddr_in *a, uint16_t port) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons(port);
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

/* Where a test's server listens: 127.0.0.1 and a port picked at listen
 * (tcp), or the abstract Unix name "@NAME-PID". Returns its length. */
static inline unsigned tu_listen_addr(struct sockaddr_storage *ss, bool tcp,
                                      const char *name) {
  memset(ss, 0, sizeof(*ss));
  if (tcp) {
    tu_addr_loopback((struct sockaddr_in *)ss, 0);
    return sizeof(struct sockaddr_in);
  }
  char path[96];
  snprintf(path, sizeof(path), "@%s-%d", name, (int)getpid());
  int len = weft_unix_addr((struct sockaddr_un *)ss, path);
  assert_true(len > 0);
  return (unsigned)len;
}

/* The port of an IPv4 or IPv6 address, 0 for anything else. */
static inline uint16_t tu_addr_port(const struct sockaddr *a) {
  if (a->sa_family == AF_INET)
    return ntohs(((const struct sockaddr_in *)(const void *)a)->sin_port);
  if (a->sa_family == AF_INET6)
    return ntohs(((const struct sockaddr_in6 *)(const void *)a)->sin6_port);
  return 0;
}

/* Listens on 127.0.0.1, port 0, and returns the port picked. Test thread. */
#define tu_tcp_listen(rt, opts, fn, arg, lp)                                   \
  tu_tcp_listen_(__FILE__, __LINE__, (rt), (opts), (fn), (arg), (lp))
static inline uint16_t tu_tcp_listen_(const char *file, int line, weft_rt *rt,
                                      const weft_listen_opts *opts,
                                      weft_accept_fn fn, void *arg,
                                      weft_listener **lp) {
  struct sockaddr_in a;
  struct sockaddr_storage got;
  unsigned len = sizeof got;
  tu_addr_loopback(&a, 0);
  *lp = NULL;
  int rc =
      weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, opts, fn, arg, lp);
  if (rc == 0)
    rc = weft_listener_addr(*lp, (struct sockaddr *)&got, &len);
  if (rc != 0 || tu_addr_port((struct sockaddr *)&got) == 0) {
    print_error("listening on 127.0.0.1:0 failed: %d (%s)\n", rc,
                weft_strerror(rc));
    _fail(file, line);
    return 0;
  }
  return tu_addr_port((struct sockaddr *)&got);
}

/* A handler or callback that adds one to the tu_event arg. */
static inline void tu_event_one(void *arg) { tu_event_add(arg, 1); }

/* Closes listener l and waits for its done callback. */
static inline void tu_listener_close(weft_listener *l) {
  tu_event done;
  tu_event_init(&done);
  tu_assert_rc(weft_listener_close(l, tu_event_one, &done), 0);
  tu_event_wait(&done, 1, "the listener's done callback");
  tu_event_destroy(&done);
}

/* Gives c its data and close callback from the test thread: runs
 * weft_tcp_set_data (which must be called on c's strand) there and waits
 * until it has returned, failing the test unless it returned 0. For a test
 * that then closes c from its own thread (weft_tcp_close may be called from
 * any thread). c must not be closed yet. Test thread only. */
typedef struct tu_tcp_data_call {
  weft_tcp *c;
  void *data;
  weft_close_fn fn;
  int rc;
} tu_tcp_data_call;

static inline void tu_tcp_set_data_handler(void *arg) {
  tu_tcp_data_call *dc = arg;
  dc->rc = weft_tcp_set_data(dc->c, dc->data, dc->fn);
}

#define tu_tcp_set_data(c, data, fn)                                           \
  tu_tcp_set_data_(__FILE__, __LINE__, (c), (data), (fn))
static inline void tu_tcp_set_data_(const char *file, int line, weft_tcp *c,
                                    void *data, weft_close_fn fn) {
  tu_tcp_data_call dc = {c, data, fn, 1};
  tu_on_strand_(file, line, weft_tcp_strand(c), tu_tcp_set_data_handler, &dc);
  if (dc.rc != 0) {
    print_error("weft_tcp_set_data on the connection's strand returned %d "
                "(%s), expected 0\n",
                dc.rc, weft_strerror(dc.rc));
    _fail(file, line);
  }
}

/* The local port of a plain socket, 0 on error. */
static inline uint16_t tu_sock_port(int fd) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    return 0;
  return tu_addr_port((struct sockaddr *)&a);
}

/* The peer port of a plain socket, 0 on error. */
static inline uint16_t tu_sock_peer_port(int fd) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  if (getpeername(fd, (struct sockaddr *)&a, &len) != 0)
    return 0;
  return tu_addr_port((struct sockaddr *)&a);
}

/* Descriptors the process has open (entries of /proc/self/fd, counting
 * the one that reads it); 0 if it cannot be read. */
static inline unsigned tu_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  unsigned n = 0;
  if (d == NULL)
    return 0;
  while (readdir(d) != NULL)
    n++;
  closedir(d);
  return n;
}

/* A plain blocking TCP socket with SO_RCVBUF / SO_SNDBUF set (when not 0)
 * before it connects to 127.0.0.1:port, and send/receive timeouts of
 * TU_WAIT_S so that nothing blocks forever. Returns the fd or -errno. */
static inline int tu_sock_connect(uint16_t port, int rcvbuf, int sndbuf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  struct timeval tv = {TU_WAIT_S, 0};
  struct sockaddr_in a;
  tu_addr_loopback(&a, port);
  if ((rcvbuf > 0 &&
       setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0) ||
      (sndbuf > 0 &&
       setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) != 0) ||
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* A plain listening socket on 127.0.0.1, port 0; *port receives the port.
 * Returns the fd or -errno. */
static inline int tu_sock_listen(int backlog, uint16_t *port) {
  *port = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(fd, backlog) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  *port = tu_sock_port(fd);
  return fd;
}

/* Waits (bounded by ms) for events on fd: the revents, 0 on timeout, -errno
 * on error. */
static inline int tu_sock_poll(int fd, short events, int ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int n = poll(&p, 1, ms);
    if (n > 0)
      return p.revents;
    if (n == 0)
      return 0;
    if (errno != EINTR)
      return -errno;
  }
}

/* Accepts one connection on a plain listening socket, waiting at most
 * TU_WAIT_S. Returns the fd or -errno (-ETIMEDOUT). */
static inline int tu_sock_accept(int lfd) {
  int ev = tu_sock_poll(lfd, POLLIN, TU_WAIT_S * 1000);
  if (ev <= 0)
    return ev == 0 ? -ETIMEDOUT : ev;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  return fd >= 0 ? fd : -errno;
}

/* Sends all len bytes (MSG_NOSIGNAL). 0 or -errno. */
static inline int tu_sock_send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Receives exactly len bytes. 0, -EPIPE on an early EOF, or -errno. */
static inline int tu_sock_recv_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return -EPIPE;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Makes close(fd) send RST instead of FIN (SO_LINGER {1, 0}). */
static inline int tu_sock_linger0(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  return setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0 ? 0
                                                                    : -errno;
}

/* Reads and discards until the peer closes: 0 on EOF, -ECONNRESET on RST,
 * -ETIMEDOUT if neither came within ms, or another -errno. *bytes (if not
 * NULL) receives the number of bytes discarded. */
static inline int tu_sock_wait_closed(int fd, int ms, uint64_t *bytes) {
  char buf[4096];
  uint64_t deadline = tu_now_ns() + (uint64_t)ms * 1000000u;
  if (bytes)
    *bytes = 0;
  for (;;) {
    uint64_t now = tu_now_ns();
    if (now >= deadline)
      return -ETIMEDOUT;
    int ev = tu_sock_poll(fd, POLLIN, (int)((deadline - now) / 1000000u) + 1);
    if (ev < 0)
      return ev;
    if (ev == 0)
      continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0)
      return 0;
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      return -errno;
    if (n > 0 && bytes)
      *bytes += (uint64_t)n;
  }
}

/* A plain listener that connections cannot complete to: backlog 0 and its
 * accept queue filled by sockets that are never accepted, so the kernel
 * drops further SYNs (connects stay pending, retrying for minutes). */
#define TU_FULL_MAX 16
typedef struct tu_full_listener {
  int lfd;
  uint16_t port;
  int fill[TU_FULL_MAX];
  int nfill;
} tu_full_listener;

/* 0 once a probe connect stayed pending for 200 ms; -errno on failure. */
static inline int tu_full_listener_open(tu_full_listener *f) {
  f->nfill = 0;
  f->port = 0;
  f->lfd = tu_sock_listen(0, &f->port);
  if (f->lfd < 0)
    return f->lfd;
  struct sockaddr_in a;
  tu_addr_loopback(&a, f->port);
  while (f->nfill < TU_FULL_MAX) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return -errno;
    f->fill[f->nfill++] = fd;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 &&
        errno != EINPROGRESS)
      return -errno;
    if (tu_sock_poll(fd, POLLOUT, 200) == 0)
      return 0; /* this one is pending: the queue is full */
  }
  return -EAGAIN;
}

static inline void tu_full_listener_close(tu_full_listener *f) {
  while (f->nfill > 0)
    close(f->fill[--f->nfill]);
  if (f->lfd >= 0)
    close(f->lfd);
  f->lfd = -1;
}

/* Calls fn(fd, ctx) for every TCP socket of this process bound to local
 * port lport (any local port if 0) whose peer port is pport (listening
 * sockets if pport is 0); returns how many there were. Tests use it to
 * reach the sockets weft opened, e.g. to shrink their buffers: accepted
 * sockets inherit SO_SNDBUF and SO_RCVBUF from their listener. */
typedef void (*tu_fd_fn)(int fd, void *ctx);
static inline int tu_for_tcp_fds(uint16_t lport, uint16_t pport, tu_fd_fn fn,
                                 void *ctx) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL)
    return -errno;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    int fd = atoi(de->d_name);
    int type = 0, listening = 0;
    socklen_t len = sizeof type;
    if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM)
      continue;
    len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        (pport == 0) != (listening != 0))
      continue;
    if ((lport != 0 && tu_sock_port(fd) != lport) ||
        (pport != 0 && tu_sock_peer_port(fd) != pport))
      continue;
    fn(fd, ctx);
    n++;
  }
  closedir(d);
  return n;
}

static inline void tu_fd_set_bufs(int fd, void *ctx) {
  const int *v = ctx; /* {sndbuf, rcvbuf}; 0: leave it */
  if (v[0] > 0)
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v[0], sizeof v[0]);
  if (v[1] > 0)
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v[1], sizeof v[1]);
}

/* Sets SO_SNDBUF / SO_RCVBUF (0: leave it) on every listening socket of
 * this process on port: connections accepted afterwards inherit them, so a
 * weft listener's connections get small kernel buffers and writes stay
 * queued in weft. Returns the number of sockets changed. */
static inline int tu_shrink_listener_bufs(uint16_t port, int sndbuf,
                                          int rcvbuf) {
  int v[2] = {sndbuf, rcvbuf};
  return tu_for_tcp_fds(port, 0, tu_fd_set_bufs, v);
}

/* Predicate for tu_wait_until: stats.tcp_live <= value. */
static inline bool tu_pred_tcp_live_le(void *ctx, char *buf, size_t len) {
  tu_stat_wait *w = ctx;
  weft_stats st;
  memset(&st, 0, sizeof st);
  if (weft_rt_stats(w->rt, &st) != 0) {
    snprintf(buf, len, "weft_rt_stats failed");
    return false;
  }
  snprintf(buf, len, "tcp_live %" PRIu64 ", want <= %" PRIu64, st.tcp_live,
           w->value);
  return st.tcp_live <= w->value;
}

/* --------------------------------------------------------------- patterns */

/* A byte stream that is a pure function of (seed, offset): a receiver can
 * check any slice of it without the sender's help. */
static inline uint64_t tu_pattern_word(uint64_t seed, uint64_t word) {
  uint64_t z = seed ^ (word * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline void tu_pattern_fill(void *buf, size_t len, uint64_t seed,
                                   uint64_t off) {
  unsigned char *p = buf;
  uint64_t w = tu_pattern_word(seed, off >> 3);
  for (size_t i = 0; i < len; i++, off++) {
    if ((off & 7) == 0)
      w = tu_pattern_word(seed, off >> 3);
    p[i] = (unsigned char)(w >> (8 * (off & 7)));
  }
}

/* The index of the first byte of buf that differs from the pattern at off,
 * or len if none does. */
static inline size_t tu_pattern_check(const void *buf, size_t len,
                                      uint64_t seed, uint64_t off) {
  const unsigned char *p = buf;
  uint64_t w = tu_pattern_word(seed, off >> 3);
  for (size_t i = 0; i < len; i++, off++) {
    if ((off & 7) == 0)
      w = tu_pattern_word(seed, off >> 3);
    if (p[i] != (unsigned char)(w >> (8 * (off & 7))))
      return i;
  }
  return len;
}

/* A plain peer: receives from fd until EOF, checking every byte against
 * the pattern of seed from offset 0; fails the test on an error, a byte
 * that differs or more than max bytes. Returns the bytes received. */
#define tu_recv_pattern(fd, seed, max)                                         \
  tu_recv_pattern_(__FILE__, __LINE__, (fd), (seed), (max))
static inline uint64_t tu_recv_pattern_(const char *file, int line, int fd,
                                        uint64_t seed, uint64_t max) {
  unsigned char buf[16384];
  uint64_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0)
      return got;
    if (n < 0) {
      print_error("peer recv after %" PRIu64 " bytes: %s\n", got,
                  strerror(errno));
      _fail(file, line);
      return got;
    }
    size_t bad = tu_pattern_check(buf, (size_t)n, seed, got);
    if (bad != (size_t)n || got + (uint64_t)n > max) {
      print_error("peer: byte %" PRIu64 " differs or is past %" PRIu64 "\n",
                  got + bad, max);
      _fail(file, line);
      return got;
    }
    got += (uint64_t)n;
  }
}

/* FNV-1a, 64 bits, continued from h (start with TU_FNV_INIT). */
#define TU_FNV_INIT 0xcbf29ce484222325ull
static inline uint64_t tu_fnv1a(uint64_t h, const void *buf, size_t len) {
  const unsigned char *p = buf;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

#endif /* WEFT_TESTUTIL_H */
