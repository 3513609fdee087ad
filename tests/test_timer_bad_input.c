/*
 * test_timer_bad_input: the timer API's documented errors and edge cases.
 *
 *  - NULL arguments: -EINVAL from weft_timer_create, _start, _start_at,
 *    _cancel.
 *  - weft_timer_cancel: never started -> -EALREADY; armed -> 0, then a
 *    second cancel -> -EALREADY.
 *  - weft_timer_start with a strand of another runtime -> -EXDEV; with a
 *    released strand that still has handlers pending -> -EBADF; with
 *    after_ns = UINT64_MAX (deadline overflow) -> -EINVAL. A failed start
 *    changes nothing: an idle timer stays idle, an armed one stays armed.
 *  - far deadlines that do not overflow (an hour .. 2^62 ns, including
 *    whole multiples of the wheel's span) arm normally and do not stop the
 *    runtime.
 *  - period 0 is a one-shot: it fires exactly once.
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
  tu_assert_rc(weft_timer_create(NULL, &t), -EINVAL);
  tu_assert_rc(weft_timer_create(rt, NULL), -EINVAL);
  tu_assert_rc(weft_timer_create(rt, &t), 0);
  assert_non_null(t);
  tu_assert_rc(weft_timer_start(NULL, NULL, 0, 0, count_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_start(t, NULL, 0, 0, NULL, NULL), -EINVAL);
  tu_assert_rc(weft_timer_start_at(NULL, NULL, 0, 0, count_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_start_at(t, NULL, 0, 0, NULL, NULL), -EINVAL);
  tu_assert_rc(weft_timer_cancel(NULL), -EINVAL);
  /* the failed starts did not arm it */
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  weft_timer_destroy(t);
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
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, &t), 0);
  /* never started */
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  /* armed: 0, then twice -EALREADY */
  tu_assert_rc(weft_timer_start(t, s, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  /* again, on the runtime, periodic */
  tu_assert_rc(weft_timer_start(t, NULL, HOUR_NS, HOUR_NS, never_handler, NULL),
               0);
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  /* re-arming an armed timer: still one arming to cancel */
  tu_assert_rc(weft_timer_start(t, s, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_start(t, s, 2 * HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_cancel(t), 0);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  weft_timer_destroy(t);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_foreign_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *a, *b;
  tu_rt_create(&a, 1, 0);
  tu_rt_create(&b, 1, 0);
  weft_strand *sb;
  tu_strand_create(b, &sb);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(a, &t), 0);
  tu_assert_rc(weft_timer_start(t, sb, 0, 0, never_handler, NULL), -EXDEV);
  tu_assert_rc(weft_timer_start_at(t, sb, 1, 0, never_handler, NULL), -EXDEV);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY); /* still idle */
  /* armed: a failed re-arm leaves it armed */
  tu_assert_rc(weft_timer_start(t, NULL, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_start(t, sb, 0, 0, never_handler, NULL), -EXDEV);
  tu_assert_rc(weft_timer_cancel(t), 0);
  weft_timer_destroy(t);
  weft_strand_release(sb);
  assert_int_equal(weft_rt_destroy(a), 0);
  assert_int_equal(weft_rt_destroy(b), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_released_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  tu_gate gate;
  tu_gate_init(&gate);
  /* handlers pending: the strand still exists after the release */
  tu_assert_rc(weft_post(s, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler");
  weft_strand_release(s);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, &t), 0);
  tu_assert_rc(weft_timer_start(t, s, 0, 0, never_handler, NULL), -EBADF);
  tu_assert_rc(weft_timer_start_at(t, s, 1, 1000, never_handler, NULL), -EBADF);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY);
  tu_gate_open(&gate);
  tu_wait_count(&gate.passed, 1, "the gate handler to finish");
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
  tu_assert_rc(weft_timer_create(rt, &t), 0);
  tu_assert_rc(weft_timer_start(t, NULL, UINT64_MAX, 0, never_handler, NULL),
               -EINVAL);
  tu_assert_rc(
      weft_timer_start(t, NULL, UINT64_MAX - 1, 0, never_handler, NULL),
      -EINVAL);
  tu_assert_rc(weft_timer_cancel(t), -EALREADY); /* not armed */
  /* armed: a failed re-arm leaves it armed */
  tu_assert_rc(weft_timer_start(t, NULL, HOUR_NS, 0, never_handler, NULL), 0);
  tu_assert_rc(weft_timer_start(t, NULL, UINT64_MAX, 0, never_handler, NULL),
               -EINVAL);
  tu_assert_rc(weft_timer_cancel(t), 0);
  weft_timer_destroy(t);
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
    tu_assert_rc(weft_timer_create(rt, &t[i]), 0);
    tu_assert_rc(
        weft_timer_start(t[i], i ? s : NULL, 1000000, 0, count_handler, NULL),
        0);
  }
  tu_wait_count(&g_calls, 2, "the one-shot timers");
  tu_sleep_ms(10); /* a chance to fire again, wrongly */
  for (unsigned i = 0; i < 2; i++)
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
  weft_strand_release(s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  /* not armed at the shutdown: no -ECANCELED call (count_handler checks) */
  for (unsigned i = 0; i < 2; i++)
    weft_timer_destroy(t[i]);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_calls), 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_create_after_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_timer *t = NULL;
  tu_assert_rc(weft_timer_create(rt, &t), -ESHUTDOWN);
  assert_int_equal(weft_rt_destroy(rt), 0);

  tu_rt_create(&rt, 1, 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  tu_assert_rc(weft_timer_create(rt, &t), -ESHUTDOWN);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Far deadlines that do not overflow are valid: weft_timer_start arms the
 * timer, the runtime keeps running other work, and cancel returns 0. The
 * wheel spans about 19.5 hours (2^46 ns); deadlines one or more whole spans
 * away must not confuse it. workers = 1, so the one shard is every timer's
 * home. A hung worker is reported after FAR_WAIT_S and the runtime is then
 * left alone (a cancel would wait for the hung worker). */
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
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
    weft_rt *rt;
    tu_rt_create(&rt, 1, 0);
    weft_timer *t;
    tu_assert_rc(weft_timer_create(rt, &t), 0);
    tu_assert_rc(weft_timer_start(t, NULL, far[i], 0, never_handler, NULL), 0);
    tu_count ran;
    atomic_init(&ran, 0);
    tu_assert_rc(weft_post_rt(rt, post_count, &ran), 0);
    uint64_t dl = tu_deadline_ns(FAR_WAIT_S);
    while (atomic_load(&ran) == 0) {
      if (tu_now_ns() > dl)
        fail_msg("after weft_timer_start(after_ns = %" PRIu64
                 " ns, %.1f h), the runtime did not run a posted handler "
                 "within %d s: its worker is stuck",
                 far[i], (double)far[i] / 3.6e12, FAR_WAIT_S);
      tu_sleep_ms(1);
    }
    tu_assert_rc(weft_timer_cancel(t), 0);
    weft_timer_destroy(t);
    assert_int_equal(weft_rt_destroy(rt), 0);
  }
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
      cmocka_unit_test(test_far_deadlines),
      cmocka_unit_test(test_period_zero_is_one_shot),
      cmocka_unit_test(test_create_after_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
