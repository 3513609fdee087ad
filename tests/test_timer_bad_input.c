/*
 * test_timer_bad_input: the timer API's documented errors and edge cases.
 *
 *  - NULL arguments: -EINVAL from weft_timer_create, _start, _start_at,
 *    _cancel.
 *  - weft_timer_cancel: never started -> -EALREADY; armed -> 0, then a
 *    second cancel -> -EALREADY.
 *  - weft_timer_create with a strand of another runtime -> -EXDEV; with a
 *    released strand that still has handlers pending -> -EBADF (a timer is
 *    bound to its strand at creation, so these are checked there); and
 *    weft_timer_start of a timer made before its strand was released ->
 *    -EBADF.
 *  - weft_timer_start with after_ns = UINT64_MAX (deadline overflow) ->
 *    -EINVAL; a deadline near UINT64_MAX with a period that makes the first
 *    period overflow -> -EINVAL (relative and absolute), while deadline +
 *    period = UINT64_MAX exactly is accepted. A failed start changes
 *    nothing: an idle timer stays idle, an armed one stays armed.
 *  - far deadlines that do not overflow (an hour .. 2^62 ns, including
 *    whole multiples of the wheel's span, and absolute deadlines up to
 *    UINT64_MAX) arm normally and do not stop the runtime.
 *  - period 0 is a one-shot: it fires exactly once.
 *  - -EBUSY: with 65535 firings of one timer queued (behind a gate on its
 *    strand), the next start fails with -EBUSY and queues nothing; once the
 *    firings have settled, the timer starts again.
 *  - weft_timer_create on a shut-down runtime -> -ESHUTDOWN.
 */
#include "testutil.h"

#define HOUR_NS 3600000000000ull

static tu_count g_calls;

static void count_handler(void *arg, int status, uint64_t missed) {
  (void)arg;
  TU_CHECKF(status == 0, "status %d (%s)", status, weft_strerror(status));
  TU_CHECKF(missed == 0, "missed %" PRIu64, missed);
  atomic_fetch_add(&g_calls, 1);
}

static void never_handler(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECKF(false, "a timer that should not fire was called (status %d)",
            status);
}

static void test_null_arguments(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_timer *t = NULL;
  weft_strand *s;
  tu_strand_create(rt, &s);
  tu_assert_rc(weft_timer_create(NULL, NULL, &t), -EINVAL);
  tu_assert_rc(weft_timer_create(NULL, s, &t), -EINVAL);
  tu_assert_rc(weft_timer_create(rt, NULL, NULL), -EINVAL);
  tu_assert_rc(weft_timer_create(rt, s, NULL), -EINVAL);
  for (unsigned k = 0; k < 2; k++) {
    t = NULL;
    tu_assert_rc(weft_timer_create(rt, k ? s : NULL, &t), 0);
    assert_non_null(t);
    tu_assert_rc(weft_timer_start(NULL, 0, 0, count_handler, NULL), -EINVAL);
    tu_assert_rc(weft_timer_start(t, 0, 0, NULL, NULL), -EINVAL);
    tu_assert_rc(weft_timer_start_at(NULL, 0, 0, count_handler, NULL), -EINVAL);
    tu_assert_rc(weft_timer_start_at(t, 0, 0, NULL, NULL), -EINVAL);
    tu_assert_rc(weft_timer_cancel(NULL), -EINVAL);
    /* the failed starts did not arm it */
    tu_assert_rc(weft_timer_cancel(t), -EALREADY);
    weft_timer_destroy(t);
  }
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_cancel_answers(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  weft_timer *t, *tr; /* t on s, tr on the runtime */
  tu_assert_rc(weft_timer_create(rt, s, &t), 0);
  tu_assert_rc(weft_timer_create(rt, NULL, &tr), 0);
  /* never started */
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_cancel(tr), -EALREADY);
  /* armed: 0, then twice -EALREADY */
  tu_assert_rc(weft_timer_start(t, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  /* again, periodic, on the strand and on the runtime */
  tu_assert_rc(weft_timer_start(t, HOUR_NS, HOUR_NS, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_start(tr, HOUR_NS, HOUR_NS, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_cancel(tr), 0);
  tu_assert_rc(weft_timer_cancel(tr), -EALREADY);
  /* re-arming an armed timer: still one arming to cancel */
  for (unsigned k = 0; k < 2; k++) {
    weft_timer *x = k ? tr : t;
    tu_assert_rc(weft_timer_start(x, HOUR_NS, 0, never_handler, NULL), 0);
    tu_assert_rc(weft_timer_start(x, 2 * HOUR_NS, 0, never_handler, NULL), 0);
    tu_assert_rc(weft_timer_cancel(x), 0);
    tu_assert_rc(weft_timer_cancel(x), -EALREADY);
  }
  weft_timer_destroy(t);
  weft_timer_destroy(tr);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A strand of another runtime: weft_timer_create -> -EXDEV, and nothing is
 * created (the call has no effect on either runtime: both still work and
 * are destroyed cleanly). */
static void test_foreign_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *a, *b;
  tu_rt_create(&a, 1, 0);
  tu_rt_create(&b, 1, 0);
  weft_strand *sa, *sb;
  tu_strand_create(a, &sa);
  tu_strand_create(b, &sb);
  weft_timer *t = NULL;
  tu_assert_rc(weft_timer_create(a, sb, &t), -EXDEV);
  tu_assert_rc(weft_timer_create(b, sa, &t), -EXDEV);
  /* the right pairs work, and fire on their strand */
  atomic_store(&g_calls, 0);
  weft_timer *ta, *tb;
  tu_assert_rc(weft_timer_create(a, sa, &ta), 0);
  tu_assert_rc(weft_timer_create(b, sb, &tb), 0);
  tu_assert_rc(weft_timer_start(ta, 0, 0, count_handler, NULL), 0);
  tu_assert_rc(weft_timer_start(tb, 0, 0, count_handler, NULL), 0);
  tu_wait_count(&g_calls, 2, "the timers of both runtimes");
  weft_timer_destroy(ta);
  weft_timer_destroy(tb);
  weft_strand_release(sa);
  weft_strand_release(sb);
  assert_int_equal(weft_rt_destroy(a), 0);
  assert_int_equal(weft_rt_destroy(b), 0);
  assert_int_equal(atomic_load(&g_calls), 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A released strand that still has handlers pending (so it still exists):
 * weft_timer_create -> -EBADF. */
static void test_released_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  weft_timer *early = NULL; /* made before the release: misused after it */
  tu_assert_rc(weft_timer_create(rt, s, &early), 0);
  tu_gate gate;
  tu_gate_init(&gate);
  /* handlers pending: the strand still exists after the release */
  tu_assert_rc(weft_post(s, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler");
  weft_strand_release(s);
  weft_timer *t = NULL;
  tu_assert_rc(weft_timer_create(rt, s, &t), -EBADF);
  tu_assert_rc(weft_timer_create(rt, s, &t), -EBADF);
  tu_assert_rc(weft_timer_start(early, 1000000, 0, count_handler, NULL),
               -EBADF);
  weft_timer_destroy(early);
  tu_gate_open(&gate);
  tu_wait_count(&gate.passed, 1, "the gate handler to finish");
  /* the runtime is unaffected: a timer without strand still works */
  atomic_store(&g_calls, 0);
  tu_assert_rc(weft_timer_create(rt, NULL, &t), 0);
  tu_assert_rc(weft_timer_start(t, 0, 0, count_handler, NULL), 0);
  tu_wait_count(&g_calls, 1, "a timer on the runtime");
  weft_timer_destroy(t);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&gate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_deadline_overflow(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, NULL, &t), 0);
  tu_assert_rc(weft_timer_start(t, UINT64_MAX, 0, never_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_start(t, UINT64_MAX - 1, 0, never_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY); /* not armed */
  /* armed: a failed re-arm leaves it armed */
  tu_assert_rc(weft_timer_start(t, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_start(t, UINT64_MAX, 0, never_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_cancel(t), 0);
  weft_timer_destroy(t);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* weft.h (weft_timer_start): -EINVAL when "the deadline or the first period
 * overflows": deadline + period_ns must fit in 64 bits. */
static void test_period_overflow(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  const uint64_t half = (uint64_t)1 << 63;
  for (unsigned k = 0; k < 2; k++) {
    weft_timer *t;
    tu_assert_rc(weft_timer_create(rt, k ? s : NULL, &t), 0);
    /* absolute: the deadline itself is valid, the first period is not */
    tu_assert_rc(
        weft_timer_start_at(t, UINT64_MAX - 10, 100, never_handler, NULL),
        -EINVAL);
    tu_assert_rc(weft_timer_start_at(t, UINT64_MAX, 1, never_handler, NULL),
                 -EINVAL);
    tu_assert_rc(weft_timer_start_at(t, half, half, never_handler, NULL),
                 -EINVAL);
    tu_assert_rc(weft_timer_start_at(t, 1, UINT64_MAX, never_handler, NULL),
                 -EINVAL);
    /* relative: now + 2^63 fits (now is far below 2^63 ns), + 2^63 not */
    tu_assert_rc(weft_timer_start(t, half, half, never_handler, NULL), -EINVAL);
    tu_assert_rc(weft_timer_start(t, 0, UINT64_MAX, never_handler, NULL),
                 -EINVAL);
    tu_assert_rc(weft_timer_cancel(t), -EALREADY); /* still idle */
    /* armed: a failed re-arm leaves the previous arming in place */
    tu_assert_rc(weft_timer_start(t, HOUR_NS, HOUR_NS, never_handler, NULL), 0);
    tu_assert_rc(
        weft_timer_start_at(t, UINT64_MAX - 10, 100, never_handler, NULL),
        -EINVAL);
    tu_assert_rc(weft_timer_start(t, half, half, never_handler, NULL), -EINVAL);
    tu_assert_rc(weft_timer_cancel(t), 0);
    tu_assert_rc(weft_timer_cancel(t), -EALREADY);
    /* exactly at the limit: deadline + period = UINT64_MAX is accepted */
    tu_assert_rc(
        weft_timer_start_at(t, UINT64_MAX - 100, 100, never_handler, NULL), 0);
    tu_assert_rc(weft_timer_cancel(t), 0);
    tu_assert_rc(weft_timer_start(t, half / 2, half / 2, never_handler, NULL),
                 0);
    tu_assert_rc(weft_timer_cancel(t), 0);
    weft_timer_destroy(t);
  }
  weft_strand_release(s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_period_zero_is_one_shot(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  atomic_store(&g_calls, 0);
  weft_timer *t[2];
  for (unsigned i = 0; i < 2; i++) {
    tu_assert_rc(weft_timer_create(rt, i ? s : NULL, &t[i]), 0);
    tu_assert_rc(weft_timer_start(t[i], 1000000, 0, count_handler, NULL), 0);
  }
  tu_wait_count(&g_calls, 2, "the one-shot timers");
  tu_sleep_ms(10); /* a chance to fire again, wrongly */
  for (unsigned i = 0; i < 2; i++)
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  /* not armed at the shutdown: no -ECANCELED call (count_handler checks) */
  for (unsigned i = 0; i < 2; i++)
    weft_timer_destroy(t[i]);
  weft_strand_release(s); /* after its timer is destroyed */
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_calls), 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_create_after_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_timer *t = NULL;
  tu_assert_rc(weft_timer_create(rt, NULL, &t), -ESHUTDOWN);
  tu_assert_rc(weft_timer_create(rt, s, &t), -ESHUTDOWN);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);

  tu_rt_create(&rt, 1, 0);
  tu_strand_create(rt, &s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  tu_assert_rc(weft_timer_create(rt, NULL, &t), -ESHUTDOWN);
  tu_assert_rc(weft_timer_create(rt, s, &t), -ESHUTDOWN);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Far deadlines that do not overflow are valid: weft_timer_start arms the
 * timer, the runtime keeps running other work, and cancel returns 0. The
 * wheel spans about 19.5 hours (2^46 ns); deadlines one or more whole spans
 * away, up to the absolute deadline UINT64_MAX, must not confuse it (weft.h:
 * deadlines beyond the wheel's range are kept and must not hang a worker).
 * workers = 1, so the one shard is every timer's home; each deadline on the
 * runtime and on a strand. A hung worker is reported after FAR_WAIT_S and
 * the runtime is then left alone (a cancel would wait for the hung worker). */
#define FAR_WAIT_S 10

static void post_count(void *arg) { atomic_fetch_add((tu_count *)arg, 1); }

static void test_far_deadlines(void **state) {
  (void)state;
  tu_reset_async_errors();
  const uint64_t far[] = {HOUR_NS,
                          24 * HOUR_NS,
                          (uint64_t)1 << 46,
                          ((uint64_t)1 << 46) + 1000000,
                          3 * ((uint64_t)1 << 46),
                          (uint64_t)1 << 62};
  const uint64_t far_at[] = {UINT64_MAX / 2, UINT64_MAX - 1, UINT64_MAX};
  const size_t nrel = sizeof far / sizeof far[0];
  const size_t nabs = sizeof far_at / sizeof far_at[0];
  for (size_t i = 0; i < 2 * (nrel + nabs); i++) {
    size_t j = i / 2;
    bool absolute = j >= nrel;
    uint64_t v = absolute ? far_at[j - nrel] : far[j];
    weft_rt *rt;
    tu_rt_create(&rt, 1, 0);
    weft_strand *s = NULL;
    if (i % 2)
      tu_strand_create(rt, &s);
    weft_timer *t;
    tu_assert_rc(weft_timer_create(rt, s, &t), 0);
    if (absolute)
      tu_assert_rc(weft_timer_start_at(t, v, 0, never_handler, NULL), 0);
    else
      tu_assert_rc(weft_timer_start(t, v, 0, never_handler, NULL), 0);
    tu_count ran;
    atomic_init(&ran, 0);
    if (s)
      tu_assert_rc(weft_post(s, post_count, &ran), 0);
    tu_assert_rc(weft_post_rt(rt, post_count, &ran), 0);
    uint64_t want = s ? 2 : 1;
    uint64_t dl = tu_deadline_ns(FAR_WAIT_S);
    while (atomic_load(&ran) < want) {
      if (tu_now_ns() > dl)
        fail_msg("after weft_timer_%s(%s = %" PRIu64 " ns, %.1f h, %s), the "
                 "runtime did not run a posted handler within %d s: its "
                 "worker is stuck",
                 absolute ? "start_at" : "start",
                 absolute ? "deadline_ns" : "after_ns", v, (double)v / 3.6e12,
                 s ? "on a strand" : "on the runtime", FAR_WAIT_S);
      tu_sleep_ms(1);
    }
    /* a near timer on the same wheel still fires */
    atomic_store(&g_calls, 0);
    weft_timer *near;
    tu_assert_rc(weft_timer_create(rt, s, &near), 0);
    tu_assert_rc(weft_timer_start(near, 1000000, 0, count_handler, NULL), 0);
    tu_wait_count(&g_calls, 1, "a 1 ms timer beside a far one");
    weft_timer_destroy(near);
    tu_assert_rc(weft_timer_cancel(t), 0);
    weft_timer_destroy(t);
    if (s)
      weft_strand_release(s);
    assert_int_equal(weft_rt_destroy(rt), 0);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* -EBUSY: "65535 firings of t queued". A timer on a strand held by a gate
 * fires at once on every start with a past deadline; each firing is queued
 * behind the gate, and makes the one before it stale. The 65536th start
 * fails with -EBUSY, queues nothing and leaves the timer as it was; a
 * cancel then drops the last firing. Once the gate opens the firings
 * settle without a call, and the timer then starts and fires again. */
#define MAX_QUEUED 65535u

typedef struct busy_ctx {
  weft_strand *s;
  tu_count calls;
  tu_count bad;
  uint64_t next; /* the arg expected of the next call */
} busy_ctx;

static busy_ctx g_busy;

static void busy_handler(void *arg, int status, uint64_t missed) {
  (void)missed;
  uint64_t k = (uint64_t)(uintptr_t)arg;
  if (status != 0 || weft_strand_current() != g_busy.s || k != g_busy.next) {
    if (atomic_fetch_add(&g_busy.bad, 1) < 5)
      TU_CHECKF(false,
                "firing with arg %" PRIu64 " (expected %" PRIu64 "), status %d",
                k, g_busy.next, status);
  }
  g_busy.next = k + 1; /* only on the strand: serial */
  atomic_fetch_add(&g_busy.calls, 1);
}

static void mark_handler(void *arg) { atomic_fetch_add((tu_count *)arg, 1); }

static void test_too_many_queued(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("65535 firings of one timer queued");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  memset(&g_busy, 0, sizeof g_busy);
  atomic_init(&g_busy.calls, 0);
  atomic_init(&g_busy.bad, 0);
  tu_strand_create(rt, &g_busy.s);
  tu_gate gate;
  tu_gate_init(&gate);
  tu_assert_rc(weft_post(g_busy.s, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler");
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, g_busy.s, &t), 0);
  for (uint64_t k = 0; k < MAX_QUEUED; k++) {
    int rc = weft_timer_start_at(t, 1, 0, busy_handler, (void *)(uintptr_t)k);
    if (rc != 0)
      fail_msg("start #%" PRIu64 " with %" PRIu64 " firings queued: %d (%s)",
               k + 1, k, rc, weft_strerror(rc));
  }
  tu_assert_rc(
      weft_timer_start_at(t, 1, 0, busy_handler, (void *)(uintptr_t)MAX_QUEUED),
      -EBUSY);
  tu_assert_rc(weft_timer_start(t, HOUR_NS, 0, busy_handler,
                                (void *)(uintptr_t)MAX_QUEUED),
               -EBUSY);
  /* Each start made the firing before it stale; the cancel drops the
   * last (its handler had not started): none of them calls. */
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_gate_open(&gate);
  tu_count marks;
  atomic_init(&marks, 0);
  tu_assert_rc(weft_post(g_busy.s, mark_handler, &marks), 0);
  tu_wait_count(&marks, 1, "the queued firings to settle");
  assert_int_equal(atomic_load(&g_busy.calls), 0);
  /* the firings have settled: it starts again */
  g_busy.next = MAX_QUEUED;
  tu_assert_rc(
      weft_timer_start_at(t, 1, 0, busy_handler, (void *)(uintptr_t)MAX_QUEUED),
      0);
  tu_wait_count(&g_busy.calls, 1, "a firing after the -EBUSY");
  tu_sleep_ms(5);
  assert_int_equal(atomic_load(&g_busy.calls), 1);
  assert_int_equal(atomic_load(&g_busy.bad), 0);
  weft_timer_destroy(t);
  weft_strand_release(g_busy.s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&gate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_cancel_answers),
      cmocka_unit_test(test_foreign_strand),
      cmocka_unit_test(test_released_strand),
      cmocka_unit_test(test_deadline_overflow),
      cmocka_unit_test(test_period_overflow),
      cmocka_unit_test(test_far_deadlines),
      cmocka_unit_test(test_period_zero_is_one_shot),
      cmocka_unit_test(test_too_many_queued),
      cmocka_unit_test(test_create_after_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
