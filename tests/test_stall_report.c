/*
 * test_stall_report: weft_config.on_stall reports each stall once, naming
 * the handler and its strand; short handlers are not reported; without a
 * monitor nothing is.
 *
 *  - A handler that sleeps 20 ms on strand S (threshold 50 us): exactly one
 *    report, with .handler == that function, .strand == S, .shard < workers
 *    and .running_ns >= the threshold; stats.stalls == 1. The same in a
 *    weft_post_rt handler: .strand == NULL.
 *  - 1000 short handlers: no report names them. A report for a short
 *    handler is legitimate only if its thread was held up (descheduled) for
 *    a while inside it, so each short handler records when it started and
 *    ended, per thread; a handler whose whole time inside the runtime
 *    (from the previous short handler's end on its thread to the next one's
 *    start) was short could not have been reported. Reports naming the
 *    short handler must not outnumber the handlers that could have been
 *    held up. Nothing here bounds time: the times only excuse reports.
 *  - An on_stall that reads weft_rt_stats 100 ms after a report, while
 *    weft_rt_destroy runs: destroy waits for it, and the read works.
 *  - WEFT_CONFIG_NO_MONITOR: a 20 ms sleeper is not reported, stats.stalls
 *    and stats.handoffs stay 0.
 *  - max_threads == workers: the stall is reported with handed_off 0,
 *    nothing is handed off, no thread is added.
 *  - on_stall NULL: the report is a line on stderr naming the handler.
 *  - log_fn set: the report goes there instead, once, at WEFT_LOG_WARN,
 *    naming a timer's callback (not weft's code that calls it).
 */
#include "testutil.h"

#define THRESHOLD_NS 50000u
#define MAXREP 4096

typedef struct report_log {
  pthread_mutex_t m;
  unsigned n;
  weft_stall r[MAXREP];
} report_log;

static report_log g_log = {.m = PTHREAD_MUTEX_INITIALIZER};

static void on_stall(const weft_stall *st, void *ctx) {
  report_log *l = ctx;
  pthread_mutex_lock(&l->m);
  if (l->n < MAXREP)
    l->r[l->n] = *st;
  l->n++;
  pthread_mutex_unlock(&l->m);
}

static unsigned log_count(void) {
  pthread_mutex_lock(&g_log.m);
  unsigned n = g_log.n;
  pthread_mutex_unlock(&g_log.m);
  return n;
}

static void log_reset(void) {
  pthread_mutex_lock(&g_log.m);
  g_log.n = 0;
  pthread_mutex_unlock(&g_log.m);
}

static tu_count g_slept;

/* Sleeps 20 ms. The report is made while the handler runs, by the monitor
 * thread; so that a monitor thread descheduled for all of the 20 ms cannot
 * make the test flaky, a sleeper with want_reports set then also waits
 * (bounded) until that many reports exist: the report provably came while
 * the handler was still inside. */
static unsigned log_count(void);
static weft_rt *g_wait_stalls_rt;

/* Not static, and the test is linked with -rdynamic (tests/CMakeLists.txt):
 * a report can name it. */
void sleeper(void *arg);
void sleeper(void *arg) {
  unsigned want_reports = (unsigned)(uintptr_t)arg;
  tu_sleep_ms(20);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  if (want_reports) {
    while (log_count() < want_reports && tu_now_ns() < dl)
      tu_sleep_ms(1);
    TU_CHECKF(log_count() >= want_reports,
              "no stall report while the sleeper was inside");
  }
  if (g_wait_stalls_rt) {
    weft_stats st;
    for (;;) {
      TU_CHECK(weft_rt_stats(g_wait_stalls_rt, &st) == 0);
      if (st.total.stalls >= 1 || tu_now_ns() > dl)
        break;
      tu_sleep_ms(1);
    }
    TU_CHECKF(st.total.stalls >= 1, "no stall noticed while inside");
  }
  atomic_fetch_add(&g_slept, 1);
}

static weft_rt *make_rt(unsigned flags, weft_stall_fn fn) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = THRESHOLD_NS;
  cfg.flags = flags;
  cfg.on_stall = fn;
  cfg.on_stall_ctx = &g_log;
  weft_rt *rt = NULL;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

/* One stall, on a strand and then without one. */
static void test_sleeper_reported_once(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: sleeper on a strand");
  log_reset();
  atomic_store(&g_slept, 0);
  weft_rt *rt = make_rt(0, on_stall);
  weft_strand *s;
  tu_strand_create(rt, &s);
  assert_int_equal(weft_post(s, sleeper, (void *)(uintptr_t)1), 0);
  tu_wait_count(&g_slept, 1, "the sleeper");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(log_count(), 1);
  weft_stall r = g_log.r[0];
  assert_ptr_equal(r.handler, (void *)sleeper);
  assert_ptr_equal(r.strand, s);
  assert_true(r.shard < 2);
  if (r.running_ns < THRESHOLD_NS)
    fail_msg("running_ns %" PRIu64 " < threshold %u", r.running_ns,
             THRESHOLD_NS);
  assert_true(r.handed_off == 0 || r.handed_off == 1);
  assert_int_equal(st.total.stalls, 1);
  assert_true(st.total.handoffs <= 1);
  if (r.handed_off)
    assert_int_equal(st.total.handoffs, 1);
  {
    weft_shard_stats ss;
    assert_int_equal(weft_rt_shard_stats(rt, r.shard, &ss), 0);
    assert_int_equal(ss.stalls, 1);
  }

  tu_phase("report: sleeper posted with weft_post_rt");
  assert_int_equal(weft_post_rt(rt, sleeper, (void *)(uintptr_t)2), 0);
  tu_wait_count(&g_slept, 2, "the second sleeper");
  tu_stats(rt, &st);
  assert_int_equal(log_count(), 2);
  r = g_log.r[1];
  assert_ptr_equal(r.handler, (void *)sleeper);
  assert_null(r.strand);
  assert_true(r.running_ns >= THRESHOLD_NS);
  assert_int_equal(st.total.stalls, 2);

  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(log_count(), 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------------- short ones */

#define NSHORT 1000
#define NSHORT_STRANDS 4

typedef struct short_rec {
  uint64_t t0, t1; /* its own start and end */
  int prev, next;  /* neighbours on the same thread, -1: none */
  atomic_uint ran;
} short_rec;

static short_rec g_short[NSHORT];
static tu_count g_short_done;

typedef struct thr_rec {
  int last; /* index of this thread's previous short handler, -1: none */
} thr_rec;
static _Thread_local thr_rec *tls_rec;
static thr_rec g_thr[256];
static atomic_uint g_nthr;

static void short_handler(void *arg) {
  uint64_t t0 = tu_now_ns();
  short_rec *me = arg;
  if (!tls_rec) {
    unsigned i = atomic_fetch_add(&g_nthr, 1);
    TU_CHECK(i < 256);
    tls_rec = &g_thr[i % 256];
    tls_rec->last = -1;
  }
  int idx = (int)(me - g_short);
  me->prev = tls_rec->last;
  me->next = -1;
  if (me->prev >= 0)
    g_short[me->prev].next = idx; /* written by this thread only */
  tls_rec->last = idx;
  TU_CHECK(atomic_fetch_add(&me->ran, 1) == 0);
  me->t0 = t0;
  me->t1 = tu_now_ns();
  atomic_fetch_add(&g_short_done, 1);
}

/* The monitor counts a stall in the stats before it calls on_stall, and
 * a report can come after weft_rt_shutdown has returned: a thread
 * descheduled inside a short handler (TSan runs slowly on 2 vCPUs) has
 * its shard handed on, the spare inherits its place in the park
 * protocol, finds nothing, parks and so completes the shutdown, while the
 * monitor has yet to count and report the stall (4 runs in 40 under TSan
 * failed an exact comparison of the stats read after shutdown with the log
 * read after destroy, before and after 2026-12-01's changes alike). So the
 * stats and the log are compared once they agree, the log read first; the
 * wait is bounded. */
typedef struct stalls_logged {
  weft_rt *rt;
  weft_stats st;
  unsigned n;
} stalls_logged;

static bool stalls_match(void *ctx, char *buf, size_t len) {
  stalls_logged *w = ctx;
  w->n = log_count();
  tu_stats(w->rt, &w->st);
  snprintf(buf, len, "stats.stalls %" PRIu64 ", %u reports", w->st.total.stalls,
           w->n);
  return w->st.total.stalls == w->n;
}

static void test_short_not_reported(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: short handlers");
  log_reset();
  memset(g_short, 0, sizeof g_short);
  atomic_store(&g_short_done, 0);
  atomic_store(&g_nthr, 0);
  weft_rt *rt = make_rt(0, on_stall);
  weft_strand *s[NSHORT_STRANDS];
  for (unsigned i = 0; i < NSHORT_STRANDS; i++)
    tu_strand_create(rt, &s[i]);
  for (unsigned i = 0; i < NSHORT; i++)
    assert_int_equal(
        weft_post(s[i % NSHORT_STRANDS], short_handler, &g_short[i]), 0);
  tu_wait_count(&g_short_done, NSHORT, "the short handlers");
  /* Everything has run; the monitor has seen what it was going to see.
   * Shut down, let a report in progress finish, then read the log. */
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  stalls_logged w = {.rt = rt};
  tu_wait_until(stalls_match, &w, "every stall counted to be reported");
  weft_stats st = w.st;
  assert_int_equal(weft_rt_destroy(rt), 0);

  for (unsigned i = 0; i < NSHORT; i++)
    assert_int_equal(atomic_load(&g_short[i].ran), 1);
  /* Handlers whose time inside the runtime is not bounded by neighbours
   * on the same thread, or whose bound is long enough for the monitor
   * to have seen them twice, could have been held up. */
  unsigned could = 0;
  for (unsigned i = 0; i < NSHORT; i++) {
    short_rec *r = &g_short[i];
    if (r->prev < 0 || r->next < 0) {
      could++;
      continue;
    }
    uint64_t from = g_short[r->prev].t1, to = g_short[r->next].t0;
    if (to - from >= THRESHOLD_NS / 4)
      could++;
  }
  unsigned n = log_count(), named = 0, other = 0;
  for (unsigned i = 0; i < n && i < MAXREP; i++) {
    if (g_log.r[i].handler == (void *)short_handler)
      named++;
    else
      other++;
  }
  print_message("short handlers: %u reports naming them, %u others, %u of "
                "%u could have been held up; stats.stalls %" PRIu64 "\n",
                named, other, could, NSHORT, st.total.stalls);
  if (named) {
    /* Say why they could have been: the longest runs seen. */
    uint64_t own = 0, covered = 0;
    for (unsigned i = 0; i < NSHORT; i++) {
      short_rec *r = &g_short[i];
      if (r->t1 - r->t0 > own)
        own = r->t1 - r->t0;
      if (r->prev >= 0 && r->next >= 0 &&
          g_short[r->next].t0 - g_short[r->prev].t1 > covered)
        covered = g_short[r->next].t0 - g_short[r->prev].t1;
    }
    for (unsigned i = 0; i < n && i < MAXREP; i++)
      if (g_log.r[i].handler == (void *)short_handler)
        print_message("  report: running_ns %" PRIu64
                      " (longest own run %" PRIu64
                      " ns, longest bounded window %" PRIu64 " ns)\n",
                      g_log.r[i].running_ns, own, covered);
  }
  if (other)
    fail_msg("%u reports name a handler that never ran", other);
  if (named > could)
    fail_msg("%u reports name the short handler, but at most %u of its "
             "runs were long enough to be noticed",
             named, could);
  /* Reports made after the wait (a thread still inside a short handler
   * when it ended) are in n but not in st. */
  assert_true(st.total.stalls <= n);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------- on_stall during a destroy
 * The monitor may report a stall it saw just before the runtime finished,
 * while weft_rt_destroy runs; an on_stall that reads the statistics then
 * must find the runtime whole. The callback here holds the monitor for
 * 100 ms (longer than a callback should: it widens the window) before it
 * reads them, and weft_rt_destroy is called meanwhile: it must wait for
 * the callback to return before it takes anything down. */
static weft_rt *g_destroy_rt;
static atomic_int g_in_cb, g_cb_stats;

static void on_stall_then_stats(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  if (atomic_fetch_add(&g_in_cb, 1) != 0)
    return; /* the first report only */
  tu_sleep_ms(100);
  weft_stats s;
  TU_CHECK(weft_rt_stats(g_destroy_rt, &s) == 0);
  atomic_store(&g_cb_stats, 1);
}

static void test_destroy_during_on_stall(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: destroy while on_stall runs");
  atomic_store(&g_slept, 0);
  atomic_store(&g_in_cb, 0);
  atomic_store(&g_cb_stats, 0);
  g_destroy_rt = make_rt(0, on_stall_then_stats);
  assert_int_equal(weft_post_rt(g_destroy_rt, sleeper, NULL), 0);
  while (!atomic_load(&g_in_cb))
    tu_sleep_ms(1);
  assert_int_equal(weft_rt_destroy(g_destroy_rt), 0);
  assert_int_equal(atomic_load(&g_cb_stats), 1);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* -------------------------------------------------------------- no monitor */

static void test_no_monitor(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: WEFT_CONFIG_NO_MONITOR");
  log_reset();
  atomic_store(&g_slept, 0);
  weft_rt *rt = make_rt(WEFT_CONFIG_NO_MONITOR, on_stall);
  weft_strand *s;
  tu_strand_create(rt, &s);
  assert_int_equal(weft_post(s, sleeper, NULL), 0);
  assert_int_equal(weft_post_rt(rt, sleeper, NULL), 0);
  tu_wait_count(&g_slept, 2, "the sleepers");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.total.stalls, 0);
  assert_int_equal(st.total.handoffs, 0);
  assert_int_equal(st.handlers_run_after_handoff, 0);
  assert_int_equal(st.threads, 2); /* no spares without a monitor */
  assert_int_equal(st.total.handlers_run, 2);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(log_count(), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------- no room for a spare thread
 * max_threads == workers: there is never a thread to hand a shard to, so
 * a stall is reported with handed_off 0 and nothing is handed off. */
static void test_no_spare_room(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: max_threads == workers");
  log_reset();
  atomic_store(&g_slept, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.max_threads = 2;
  cfg.stall_threshold_ns = THRESHOLD_NS;
  cfg.on_stall = on_stall;
  cfg.on_stall_ctx = &g_log;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  assert_int_equal(weft_post(s, sleeper, (void *)(uintptr_t)1), 0);
  tu_wait_count(&g_slept, 1, "the sleeper");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(log_count(), 1);
  assert_ptr_equal(g_log.r[0].handler, (void *)sleeper);
  assert_ptr_equal(g_log.r[0].strand, s);
  assert_int_equal(g_log.r[0].handed_off, 0);
  assert_true(g_log.r[0].running_ns >= THRESHOLD_NS);
  assert_int_equal(st.total.stalls, 1);
  assert_int_equal(st.total.handoffs, 0);
  assert_int_equal(st.handlers_run_after_handoff, 0);
  assert_int_equal(st.threads, 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------ default: stderr */

static void test_default_prints(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: default report on stderr");
  atomic_store(&g_slept, 0);
  char path[] = "/tmp/weft_stall_report_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_true(dup2(fd, 2) == 2);
  weft_rt *rt = make_rt(0, NULL);
  g_wait_stalls_rt = rt; /* the sleeper waits until its stall is noticed */
  assert_int_equal(weft_post_rt(rt, sleeper, NULL), 0);
  tu_wait_count(&g_slept, 1, "the sleeper");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(weft_rt_destroy(rt), 0); /* the monitor has stopped */
  g_wait_stalls_rt = NULL;
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char buf[4096];
  ssize_t len = pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  assert_true(len >= 0);
  buf[len] = '\0';
  fprintf(stderr, "captured: %s", buf);
  assert_int_equal(st.total.stalls, 1);
  assert_non_null(strstr(buf, "weft: stall: sleeper ("));
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------- the log hook, a timer's callback */

/* With log_fn set and on_stall NULL, the report is one message at
 * WEFT_LOG_WARN through log_fn, not on stderr; it names the user's timer
 * callback, not weft's code that called it. */
typedef struct msg_log {
  pthread_mutex_t m;
  unsigned n, warn;
  char first[512];
} msg_log;

static void on_log(void *ctx, int level, const char *msg) {
  msg_log *l = ctx;
  /* Frame lines of a backtrace belong to the stall line before them: one
   * taken if the monitor came only after the sleep, while the sleeper
   * polled (test_stall_backtrace tests them). */
  if (strncmp(msg, "  #", 3) == 0)
    return;
  pthread_mutex_lock(&l->m);
  if (!l->n++)
    snprintf(l->first, sizeof(l->first), "%s", msg);
  if (level == WEFT_LOG_WARN)
    l->warn++;
  pthread_mutex_unlock(&l->m);
}

void timer_sleeper(void *arg, int status, uint64_t missed);
void timer_sleeper(void *arg, int status, uint64_t missed) {
  (void)missed;
  TU_CHECK(status == 0);
  sleeper(arg);
}

static void test_log_hook_names_callback(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("report: through log_fn, naming a timer's callback");
  atomic_store(&g_slept, 0);
  msg_log ml = {.m = PTHREAD_MUTEX_INITIALIZER};
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = THRESHOLD_NS;
  cfg.log_fn = on_log;
  cfg.log_ctx = &ml;
  weft_rt *rt = NULL;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  g_wait_stalls_rt = rt;
  weft_strand *s;
  tu_strand_create(rt, &s);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, s, &t), 0);
  tu_assert_rc(weft_timer_start(t, 0, 0, timer_sleeper, NULL), 0);
  tu_wait_count(&g_slept, 1, "the sleeping timer callback");
  g_wait_stalls_rt = NULL;
  weft_timer_destroy(t);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  print_message("[ INFO     ] logged: %s\n", ml.first);
  assert_int_equal(ml.n, 1);
  assert_int_equal(ml.warn, 1);
  assert_non_null(strstr(ml.first, "stall: timer_sleeper ("));
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* log_level out of range is refused. */
static void test_log_level_checked(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt = NULL;
  cfg.log_level = WEFT_LOG_DEBUG + 1;
  assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
  cfg.log_level = -1;
  assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sleeper_reported_once),
      cmocka_unit_test(test_short_not_reported),
      cmocka_unit_test(test_destroy_during_on_stall),
      cmocka_unit_test(test_no_monitor),
      cmocka_unit_test(test_no_spare_room),
      cmocka_unit_test(test_default_prints),
      cmocka_unit_test(test_log_hook_names_callback),
      cmocka_unit_test(test_log_level_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
