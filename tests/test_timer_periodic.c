/*
 * test_timer_periodic: periodic timers, missed periods, cancelling.
 *
 * weft.h: status 0 with `missed` = "the number of whole periods that passed
 * unfired before this firing (a periodic timer whose handler or strand was
 * held up skips them instead of firing them in a burst)"; "Periodic timers
 * do not drift: the next deadline is the previous deadline plus the
 * period", so every deadline is on the grid D0 + k * period.
 *
 *  - A timer with period P = 2 ms, first deadline D0, counted over N
 *    firings; once (firing STALL) its handler sleeps 5 periods. Firing i
 *    reports missed m_i and is for grid index k_i = k_(i-1) + 1 + m_i. Then:
 *      never early, on the grid: firing i runs at >= D0 + k_i * P;
 *      nothing skipped that had not passed: D0 + k_i * P is after the
 *        previous handler returned (so missed is 0 unless the previous
 *        handler returned a whole period late, and no passed deadline is
 *        left to fire in a burst);
 *      the firing after the stall reports missed >= 3;
 *      no burst after the stall: counting from the first post-stall
 *        firing, the j-th firing after it comes when at least j - 1 whole
 *        periods have elapsed (j <= elapsed periods + 1);
 *      firings of one timer never overlap (also on the runtime).
 *    The last firing cancels its own timer: -EALREADY (a firing is under
 *    way), no further firing, no -ECANCELED at shutdown (it is not armed).
 *    On a strand and on the runtime (strand NULL).
 *  - A cancel from another thread while the handler runs: -EALREADY, and it
 *    does not re-arm.
 *  - weft_timer_cancel on an idle periodic timer (never started; cancelled
 *    before) returns -EALREADY; a cancelled periodic timer never fires.
 *  - Restarted from its own handler, a periodic timer is re-armed by the
 *    restart's firing when it returns, not by the firing that restarted it
 *    (the firing after a stalled handler reports the stall as missed).
 *  - Many periodic timers keep firing while two spinning threads compete
 *    with the workers for the CPUs: every one of them reaches KEEP_FIRINGS
 *    firings. A re-arm may come after its thread lost the CPU while
 *    another thread moved the wheel on; a wheel that took such a re-arm for
 *    a slot a whole turn ahead would hold every timer of its shard.
 *
 * The only times compared are weft_now_ns() readings against deadlines
 * (never early) and against each other (the grid); nothing bounds lateness.
 */
#include "testutil.h"

#define PERIOD_NS 2000000ull /* 2 ms */
#define NFIRINGS 40
#define STALL 10        /* the firing whose handler stalls */
#define STALL_PERIODS 5 /* for this many periods */
#define HOUR_NS 3600000000000ull

typedef struct fire_rec {
  uint64_t at;     /* weft_now_ns() at entry */
  uint64_t ret;    /* weft_now_ns() just before returning */
  uint64_t missed; /* as reported */
} fire_rec;

typedef struct per_ctx {
  weft_timer *t;
  weft_strand *strand;
  fire_rec rec[NFIRINGS];
  tu_count calls;     /* status 0 calls */
  tu_count cancelled; /* status -ECANCELED calls */
  atomic_int self_cancel_rc;
  atomic_bool inside;
} per_ctx;

static void per_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  per_ctx *c = arg;
  TU_CHECKF(!atomic_exchange(&c->inside, true),
            "two firings of one periodic timer ran at once");
  TU_CHECKF(weft_strand_current() == c->strand, "ran on strand %p, not %p",
            (void *)weft_strand_current(), (void *)c->strand);
  if (status != 0) {
    TU_CHECKF(false, "status %d (%s): the timer was not armed at shutdown",
              status, weft_strerror(status));
    atomic_fetch_add(&c->cancelled, 1);
    atomic_store(&c->inside, false);
    return;
  }
  uint64_t i = atomic_load(&c->calls);
  TU_CHECKF(i < NFIRINGS,
            "firing #%" PRIu64 " after the timer cancelled "
            "itself in firing #%d",
            i, NFIRINGS - 1);
  if (i < NFIRINGS) {
    c->rec[i].at = now;
    c->rec[i].missed = missed;
    if (i == STALL)
      tu_sleep_ms((unsigned)(STALL_PERIODS * PERIOD_NS / 1000000));
    if (i == NFIRINGS - 1)
      atomic_store(&c->self_cancel_rc, weft_timer_cancel(c->t));
  }
  atomic_store(&c->inside, false);
  if (i < NFIRINGS)
    c->rec[i].ret = weft_now_ns();
  atomic_fetch_add(&c->calls, 1);
}

static void check_grid(per_ctx *c, uint64_t d0, const char *where) {
  const uint64_t P = PERIOD_NS;
  uint64_t k = 0, nonzero = 0;
  for (unsigned i = 0; i < NFIRINGS; i++) {
    fire_rec *r = &c->rec[i];
    if (i == 0) {
      if (r->missed != 0)
        fail_msg("%s: first firing reported missed %" PRIu64, where, r->missed);
      k = 0;
    } else {
      k += 1 + r->missed;
      if (r->missed && i != STALL + 1)
        nonzero++;
      /* The deadline it fired for came after the previous handler
       * returned: no passed period left unskipped. */
      uint64_t dl = d0 + k * P;
      if (dl <= c->rec[i - 1].ret)
        fail_msg("%s: firing %u (missed %" PRIu64 ", grid index %" PRIu64
                 ") is for deadline D0+%" PRIu64 " us, which had passed "
                 "when the previous handler returned (D0+%" PRIu64
                 " us): missed is too small",
                 where, i, r->missed, k, (dl - d0) / 1000,
                 (c->rec[i - 1].ret - d0) / 1000);
    }
    uint64_t dl = d0 + k * P;
    if (r->at < dl)
      fail_msg("%s: firing %u (grid index %" PRIu64 ", missed %" PRIu64
               ") ran %" PRIu64 " ns before its deadline D0+%" PRIu64 " us",
               where, i, k, r->missed, dl - r->at, (dl - d0) / 1000);
  }
  uint64_t m = c->rec[STALL + 1].missed;
  if (m < 3)
    fail_msg("%s: after a handler stalled %d periods, the next firing "
             "reported missed %" PRIu64 ", expected >= 3",
             where, STALL_PERIODS, m);
  /* No burst: j firings after the first post-stall one span at least
   * j - 1 periods. */
  uint64_t t0 = c->rec[STALL + 1].at;
  for (unsigned i = STALL + 2; i < NFIRINGS; i++) {
    uint64_t j = i - (STALL + 1);
    uint64_t periods = (c->rec[i].at - t0) / P;
    if (j > periods + 1)
      fail_msg("%s: burst after the stall: %" PRIu64 " firings within %" PRIu64
               " elapsed periods",
               where, j, periods);
  }
  print_message("[ INFO     ] %s: missed after the stall %" PRIu64
                ", other firings with missed != 0: %" PRIu64 "\n",
                where, m, nonzero);
}

static void run_periodic(bool on_strand) {
  const char *where = on_strand ? "on a strand" : "on the runtime";
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  per_ctx *c = calloc(1, sizeof *c);
  assert_non_null(c);
  atomic_init(&c->calls, 0);
  atomic_init(&c->cancelled, 0);
  atomic_init(&c->self_cancel_rc, 1);
  atomic_init(&c->inside, false);
  if (on_strand)
    tu_strand_create(rt, &c->strand);
  tu_assert_rc(weft_timer_create(rt, c->strand, &c->t), 0);
  uint64_t d0 = weft_now_ns() + PERIOD_NS;
  tu_assert_rc(weft_timer_start_at(c->t, d0, PERIOD_NS, per_handler, c), 0);
  tu_wait_count(&c->calls, NFIRINGS, "the periodic timer's firings");
  /* It cancelled itself during its last firing: not armed then. */
  tu_assert_rc(atomic_load(&c->self_cancel_rc), -EALREADY);
  /* Idle now: nothing to cancel. */
  tu_assert_rc(weft_timer_cancel(c->t), -EALREADY);
  /* Give it several periods to (wrongly) fire again. */
  tu_sleep_ms((unsigned)(5 * PERIOD_NS / 1000000));
  assert_int_equal(atomic_load(&c->calls), NFIRINGS);
  weft_timer_destroy(c->t);
  if (c->strand)
    weft_strand_release(c->strand);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&c->calls), NFIRINGS);
  assert_int_equal(atomic_load(&c->cancelled), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  check_grid(c, d0, where);
  free(c);
}

static void test_periodic_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("periodic timer on a strand");
  run_periodic(true);
}

static void test_periodic_runtime(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("periodic timer on the runtime");
  run_periodic(false);
}

/* --------------------------------- cancel from outside during a firing */

typedef struct gated_ctx {
  tu_gate gate;
  tu_count calls;
  tu_count other; /* calls with a status != 0 */
} gated_ctx;

static void gated_handler(void *arg, int status, uint64_t missed) {
  (void)missed;
  gated_ctx *g = arg;
  if (status != 0) {
    atomic_fetch_add(&g->other, 1);
    return;
  }
  if (atomic_fetch_add(&g->calls, 1) == 0)
    tu_gate_pass(&g->gate); /* the first firing waits for the test */
}

static void test_cancel_while_running(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("cancel a periodic timer while its handler runs");
  for (int on_strand = 0; on_strand < 2; on_strand++) {
    weft_rt *rt;
    tu_rt_create(&rt, 2, 0);
    weft_strand *s = NULL;
    if (on_strand)
      tu_strand_create(rt, &s);
    gated_ctx g;
    tu_gate_init(&g.gate);
    atomic_init(&g.calls, 0);
    atomic_init(&g.other, 0);
    weft_timer *t;
    tu_assert_rc(weft_timer_create(rt, s, &t), 0);
    tu_assert_rc(weft_timer_start(t, 0, PERIOD_NS, gated_handler, &g), 0);
    tu_wait_count(&g.gate.entered, 1, "the first firing to start");
    /* Its handler is running: the timer is not armed. */
    tu_assert_rc(weft_timer_cancel(t), -EALREADY);
    tu_gate_open(&g.gate);
    tu_wait_count(&g.gate.passed, 1, "the first firing to finish");
    tu_sleep_ms((unsigned)(5 * PERIOD_NS / 1000000));
    tu_assert_rc(weft_timer_cancel(t), -EALREADY);
    tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
    weft_timer_destroy(t);
    /* released after its timer is destroyed (weft_timer_create) */
    if (s)
      weft_strand_release(s);
    assert_int_equal(weft_rt_destroy(rt), 0);
    if (atomic_load(&g.calls) != 1)
      fail_msg("a periodic timer cancelled during its firing fired %" PRIu64
               " times in all (on_strand %d), expected 1",
               (uint64_t)atomic_load(&g.calls), on_strand);
    assert_int_equal(atomic_load(&g.other), 0);
    tu_gate_destroy(&g.gate);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------ idle periodic timers */

static void never_handler(void *arg, int status, uint64_t missed) {
  (void)missed;
  TU_CHECKF(false, "a cancelled periodic timer was called (status %d)", status);
  atomic_fetch_add((tu_count *)arg, 1);
}

static void test_cancel_idle(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("cancel idle periodic timers");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  tu_count calls;
  atomic_init(&calls, 0);
  weft_timer *t[4];
  for (unsigned i = 0; i < 4; i++) /* t[1], t[3] on s; t[0], t[2] on none */
    tu_assert_rc(weft_timer_create(rt, (i % 2) ? s : NULL, &t[i]), 0);
  /* never started */
  tu_assert_rc(weft_timer_cancel(t[0]), -EALREADY);
  /* armed (first deadline an hour away, then every 2 ms), cancelled, idle */
  for (unsigned i = 1; i < 4; i++) {
    tu_assert_rc(
        weft_timer_start(t[i], HOUR_NS, PERIOD_NS, never_handler, &calls), 0);
    tu_assert_rc(weft_timer_cancel(t[i]), 0);
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
  }
  /* re-armed and cancelled again: the same answers */
  tu_assert_rc(
      weft_timer_start(t[3], HOUR_NS, PERIOD_NS, never_handler, &calls), 0);
  tu_assert_rc(weft_timer_cancel(t[3]), 0);
  tu_assert_rc(weft_timer_cancel(t[3]), -EALREADY);
  assert_int_equal(atomic_load(&calls), 0);
  for (unsigned i = 0; i < 4; i++)
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
  /* not armed at shutdown: no -ECANCELED call either */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  for (unsigned i = 0; i < 4; i++)
    weft_timer_destroy(t[i]);
  weft_strand_release(s); /* after its timers are destroyed */
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&calls), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------ cancel with a queued firing */

/* A handler on strand s arms periodic timers on s and cancels them: a
 * firing that came meanwhile is queued behind this handler (s is busy) and
 * has not started, so cancel returns 0, its handler never runs and the
 * timer does not re-arm (weft.h, weft_timer_cancel). t[0] has surely fired
 * (a past deadline), t[1] (100 us) may have: 0 either way. */
typedef struct queued_ctx {
  weft_strand *s;
  weft_timer *t[2];
  atomic_int rc[2];
  tu_count calls[2];
  tu_count done;
} queued_ctx;

static void queued_handler(void *arg, int status, uint64_t missed) {
  tu_count *calls = arg;
  TU_CHECKF(status == 0, "status %d", status);
  TU_CHECKF(missed == 0, "missed %" PRIu64, missed);
  atomic_fetch_add(calls, 1);
}

static void queued_driver(void *arg) {
  queued_ctx *q = arg;
  /* t[0]: deadline in the past, so it fires at once (queued behind us);
   * t[1]: 100 us, and we linger 300 us: it fires or not, both are fine. */
  int rc =
      weft_timer_start_at(q->t[0], 1, PERIOD_NS, queued_handler, &q->calls[0]);
  TU_CHECKF(rc == 0, "start: %d", rc);
  rc = weft_timer_start(q->t[1], 100000, PERIOD_NS, queued_handler,
                        &q->calls[1]);
  TU_CHECKF(rc == 0, "start: %d", rc);
  uint64_t until = weft_now_ns() + 300000;
  while (weft_now_ns() < until) {
  }
  atomic_store(&q->rc[0], weft_timer_cancel(q->t[0]));
  atomic_store(&q->rc[1], weft_timer_cancel(q->t[1]));
  atomic_fetch_add(&q->done, 1);
}

static void test_cancel_queued_firing(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("cancel a periodic timer whose firing is queued");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  queued_ctx q;
  memset(&q, 0, sizeof q);
  tu_strand_create(rt, &q.s);
  for (unsigned i = 0; i < 2; i++)
    tu_assert_rc(weft_timer_create(rt, q.s, &q.t[i]), 0);
  tu_assert_rc(weft_post(q.s, queued_driver, &q), 0);
  tu_wait_count(&q.done, 1, "the driver handler");
  tu_assert_rc(atomic_load(&q.rc[0]), 0);
  tu_assert_rc(atomic_load(&q.rc[1]), 0);
  tu_sleep_ms((unsigned)(5 * PERIOD_NS / 1000000)); /* a chance to re-arm */
  for (unsigned i = 0; i < 2; i++)
    tu_assert_rc(weft_timer_cancel(q.t[i]), -EALREADY);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  for (unsigned i = 0; i < 2; i++)
    weft_timer_destroy(q.t[i]);
  weft_strand_release(q.s); /* after its timers are destroyed */
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&q.calls[0]), 0);
  assert_int_equal(atomic_load(&q.calls[1]), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A periodic timer restarted from its own handler: the restart's first
 * firing (F2) is queued behind this handler on the strand. F1 must not
 * re-arm the restarted timer when it returns (weft.h: a firing under way
 * "will not re-arm a periodic timer that was started again"); F2 re-arms
 * it when it returns. F2 sleeps STALL_PERIODS periods, so the firing after
 * it (F3) must count them as missed, not come on time right behind F2. */
typedef struct restart_ctx {
  weft_timer *t;
  unsigned n;      /* firings so far: only ever on the strand */
  uint64_t f2_end; /* when F2's handler returned */
  uint64_t f3_at, f3_missed;
  tu_count done;
} restart_ctx;

static void restart_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  restart_ctx *r = arg;
  TU_CHECKF(status == 0, "status %d", status);
  unsigned k = ++r->n;
  if (k == 1) {
    /* 2 us in the past: due now whatever the wheel's 1.024 us ticks, so
     * F2 is queued inside this call, and the period counts from now. */
    int rc =
        weft_timer_start_at(r->t, now - 2048, PERIOD_NS, restart_handler, r);
    TU_CHECKF(rc == 0, "restart: %d", rc);
  } else if (k == 2) {
    tu_sleep_ms((unsigned)(STALL_PERIODS * PERIOD_NS / 1000000));
    r->f2_end = weft_now_ns();
  } else if (k == 3) {
    r->f3_at = now;
    r->f3_missed = missed;
    int rc = weft_timer_cancel(r->t);
    TU_CHECKF(rc == -EALREADY, "cancel from the last firing: %d", rc);
    atomic_fetch_add(&r->done, 1);
  } else {
    TU_CHECKF(false, "firing %u after the cancel", k);
  }
}

static void test_restart_from_handler(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("a periodic timer restarted from its own handler");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  restart_ctx r;
  memset(&r, 0, sizeof r);
  tu_assert_rc(weft_timer_create(rt, s, &r.t), 0);
  tu_assert_rc(weft_timer_start(r.t, PERIOD_NS, PERIOD_NS, restart_handler, &r),
               0);
  tu_wait_count(&r.done, 1, "three firings");
  tu_sleep_ms((unsigned)(3 * PERIOD_NS / 1000000)); /* a chance to misfire */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_timer_destroy(r.t);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(r.n, 3);
  assert_true(r.f3_at >= r.f2_end);
  if (r.f3_missed < STALL_PERIODS - 2)
    fail_msg("the firing after a %d-period stall reported missed %" PRIu64
             ": it was armed before the stalled handler returned",
             STALL_PERIODS, r.f3_missed);
}

/* ------------------------------------ many timers under CPU contention */

#define KEEP_PERIOD_NS 1000000ull /* 1 ms */
#define KEEP_FIRINGS 300u

typedef struct keep_ctx {
  weft_timer *t;
  weft_strand *s;
  uint64_t calls; /* on its strand only */
} keep_ctx;

static tu_count g_keep_reached;
static atomic_bool g_hog_stop;

static void keep_handler(void *arg, int status, uint64_t missed) {
  keep_ctx *k = arg;
  (void)missed;
  if (status != 0)
    return; /* the -ECANCELED call at shutdown */
  if (++k->calls == KEEP_FIRINGS)
    atomic_fetch_add(&g_keep_reached, 1);
}

static void *hog_main(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&g_hog_stop, memory_order_relaxed))
    ;
  return NULL;
}

static void test_many_keep_firing(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("many periodic timers under CPU contention");
  unsigned n = (unsigned)TU_SCALED(1000, 100);
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  keep_ctx *k = calloc(n, sizeof *k);
  assert_non_null(k);
  atomic_store(&g_keep_reached, 0);
  atomic_store(&g_hog_stop, false);
  pthread_t hog[2];
  for (int i = 0; i < 2; i++)
    tu_thread_start(&hog[i], hog_main, NULL);
  uint64_t d0 = weft_now_ns() + KEEP_PERIOD_NS;
  for (unsigned i = 0; i < n; i++) {
    tu_strand_create(rt, &k[i].s);
    tu_assert_rc(weft_timer_create(rt, k[i].s, &k[i].t), 0);
    tu_assert_rc(weft_timer_start_at(k[i].t, d0 + i * KEEP_PERIOD_NS / n,
                                     KEEP_PERIOD_NS, keep_handler, &k[i]),
                 0);
  }
  tu_wait_count(&g_keep_reached, n, "every timer's firings");
  atomic_store(&g_hog_stop, true);
  for (int i = 0; i < 2; i++)
    tu_thread_join(hog[i], "a spinning thread");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  for (unsigned i = 0; i < n; i++) {
    weft_timer_destroy(k[i].t);
    weft_strand_release(k[i].s);
  }
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  free(k);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_periodic_strand),
      cmocka_unit_test(test_periodic_runtime),
      cmocka_unit_test(test_cancel_while_running),
      cmocka_unit_test(test_cancel_idle),
      cmocka_unit_test(test_cancel_queued_firing),
      cmocka_unit_test(test_restart_from_handler),
      cmocka_unit_test(test_many_keep_firing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
