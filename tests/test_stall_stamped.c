/*
 * test_stall_stamped: the monitor's two ways of timing a handler
 * (monitor.c). While handlers are few, threads stamp each handler's start
 * and the monitor sleeps up to 1.4 thresholds; while they are many, it
 * samples every half threshold. Either way a stall is noticed, reported
 * once, and never before the threshold.
 *
 *  - Quiet: a ticker strand runs one handler every 200 us (it sleeps, then
 *    re-posts itself). The monitor turns stamping on (rt->mon.stamp; waited
 *    for, bounded). A sleeper on another strand (20 ms, threshold 2 ms):
 *    exactly one report names it, with running_ns >= the threshold, made
 *    while it was inside; its thread had stamped it (hstart != 0). No
 *    report claims more time than has passed since the sleeper was posted
 *    (a stamp newer than the monitor's clock once made it wrap).
 *  - Busy: two strands re-post an empty handler without end. The monitor
 *    turns stamping off (waited for). A sleeper is reported the same way.
 *  - No monitor (WEFT_CONFIG_NO_MONITOR): nothing turns stamping on, and
 *    no handler is stamped (hstart stays 0).
 * Without membarrier (an old kernel, seccomp) the monitor never stamps,
 * and the quiet case says so and is skipped (outside TSan builds, which
 * need no barrier).
 * Reports naming the ticker are not counted: a 200 us handler is
 * legitimately reported if its thread loses its CPU for the threshold.
 */
#include "testutil.h"

#include "shard.h" /* rt->mon.stamp, a thread's hstart */

#define THRESHOLD_NS 2000000u

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_reports;      /* naming the sleeper */
static weft_stall g_report;     /* the first of them */
static uint64_t g_report_stamp; /* rt->mon.stamp when it was made */
static uint64_t g_report_at;    /* the clock in the callback */
static weft_rt *g_rt;

static void sleeper(void *arg);

static void on_stall(const weft_stall *st, void *ctx) {
  (void)ctx;
  if (st->handler != (void *)sleeper)
    return;
  pthread_mutex_lock(&g_mu);
  if (!g_reports++) {
    g_report = *st;
    g_report_stamp = atomic_load(&g_rt->mon.stamp);
    g_report_at = tu_now_ns();
  }
  pthread_mutex_unlock(&g_mu);
}

static unsigned reports(void) {
  pthread_mutex_lock(&g_mu);
  unsigned n = g_reports;
  pthread_mutex_unlock(&g_mu);
  return n;
}

static tu_count g_slept;
static _Atomic uint64_t g_sleeper_hstart;

/* Sleeps 20 ms, then stays (bounded) until it has been reported, so that
 * the report provably came while it was inside. */
static void sleeper(void *arg) {
  (void)arg;
  struct weft__thread *t = weft__self();
  atomic_store(&g_sleeper_hstart, atomic_load(&t->hstart));
  tu_sleep_ms(20);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (reports() < 1 && tu_now_ns() < dl)
    tu_sleep_ms(1);
  TU_CHECKF(reports() >= 1, "no stall report while the sleeper was inside");
  atomic_fetch_add(&g_slept, 1);
}

/* The re-posting handlers stop at g_stop and count themselves in g_quit,
 * after which their strands can be released (a released strand takes no
 * more posts). */
static atomic_bool g_stop;
static tu_count g_quit, g_ticks, g_stamped_ticks;

static void ticker(void *arg) {
  atomic_fetch_add(&g_ticks, 1);
  if (atomic_load(&weft__self()->hstart))
    atomic_fetch_add(&g_stamped_ticks, 1);
  usleep(200);
  if (atomic_load(&g_stop))
    atomic_fetch_add(&g_quit, 1);
  else
    TU_CHECK(weft_post(arg, ticker, arg) == 0);
}

static void spinner(void *arg) {
  if (atomic_load_explicit(&g_stop, memory_order_relaxed))
    atomic_fetch_add(&g_quit, 1);
  else
    TU_CHECK(weft_post(arg, spinner, arg) == 0);
}

typedef struct stamp_wait {
  weft_rt *rt;
  uint32_t want;
} stamp_wait;

static bool stamp_is(void *ctx, char *buf, size_t len) {
  stamp_wait *w = ctx;
  uint32_t v = atomic_load(&w->rt->mon.stamp);
  snprintf(buf, len, "rt->mon.stamp is %u", v);
  return v == w->want;
}

static weft_rt *make_rt(unsigned flags) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = THRESHOLD_NS;
  cfg.flags = flags;
  cfg.on_stall = on_stall;
  weft_rt *rt = NULL;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  g_rt = rt;
  pthread_mutex_lock(&g_mu);
  g_reports = 0;
  pthread_mutex_unlock(&g_mu);
  atomic_store(&g_slept, 0);
  atomic_store(&g_stop, false);
  atomic_store(&g_quit, 0);
  return rt;
}

/* Posts the sleeper and checks its one report. */
static void sleeper_reported(weft_rt *rt, bool stamped) {
  weft_strand *s;
  tu_strand_create(rt, &s);
  uint64_t posted = tu_now_ns();
  assert_int_equal(weft_post(s, sleeper, NULL), 0);
  tu_wait_count(&g_slept, 1, "the sleeper");
  weft_strand_release(s);
  assert_int_equal(reports(), 1);
  if (g_report.running_ns < THRESHOLD_NS)
    fail_msg("reported after %" PRIu64 " ns, under the threshold %u",
             g_report.running_ns, THRESHOLD_NS);
  if (g_report.running_ns > g_report_at - posted)
    fail_msg("reported as running %" PRIu64 " ns, only %" PRIu64
             " ns after it was posted",
             g_report.running_ns, g_report_at - posted);
  assert_ptr_equal(g_report.strand, s);
  if (stamped) {
    assert_int_equal(g_report_stamp, 1);
    assert_true(atomic_load(&g_sleeper_hstart) != 0);
  }
  weft_stats st;
  tu_stats(rt, &st);
  assert_true(st.total.stalls >= 1);
}

/* Stops the re-posting handlers on s[0..n), releases their strands and
 * ends the runtime. */
static void stop_and_destroy(weft_rt *rt, weft_strand **s, unsigned n) {
  atomic_store(&g_stop, true);
  tu_wait_count(&g_quit, n, "the re-posting handlers to stop");
  for (unsigned i = 0; i < n; i++)
    weft_strand_release(s[i]);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
}

static void test_quiet_stamped(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("stamped: a quiet runtime");
  weft_rt *rt = make_rt(0);
#ifndef WEFT_TSAN
  if (!rt->mon.membarrier_ok) { /* the monitor never stamps (stamp_mode) */
    assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
    assert_int_equal(weft_rt_destroy(rt), 0);
    fprintf(stderr, "test_quiet_stamped: no membarrier here: skipped\n");
    skip();
  }
#endif
  weft_strand *tk;
  tu_strand_create(rt, &tk);
  assert_int_equal(weft_post(tk, ticker, tk), 0);
  stamp_wait w = {rt, 1};
  tu_wait_until(stamp_is, &w, "stamping on (few handlers)");
  sleeper_reported(rt, true);
  stop_and_destroy(rt, &tk, 1);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_busy_sampled(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("stamped: a busy runtime");
  weft_rt *rt = make_rt(0);
  weft_strand *sp[2];
  for (unsigned i = 0; i < 2; i++) {
    tu_strand_create(rt, &sp[i]);
    assert_int_equal(weft_post(sp[i], spinner, sp[i]), 0);
  }
  /* It may have turned on before the spinners got going. */
  stamp_wait w = {rt, 0};
  tu_wait_until(stamp_is, &w, "stamping off (many handlers)");
  sleeper_reported(rt, false);
  stop_and_destroy(rt, sp, 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_no_monitor(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("stamped: no monitor");
  weft_rt *rt = make_rt(WEFT_CONFIG_NO_MONITOR);
  weft_strand *tk;
  tu_strand_create(rt, &tk);
  assert_int_equal(weft_post(tk, ticker, tk), 0);
  atomic_store(&g_stamped_ticks, 0);
  uint64_t until = atomic_load(&g_ticks) + 50;
  tu_wait_count(&g_ticks, until, "50 ticks");
  assert_int_equal(atomic_load(&rt->mon.stamp), 0);
  assert_int_equal(atomic_load(&g_stamped_ticks), 0);
  stop_and_destroy(rt, &tk, 1);
  assert_int_equal(reports(), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quiet_stamped),
      cmocka_unit_test(test_busy_sampled),
      cmocka_unit_test(test_no_monitor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
