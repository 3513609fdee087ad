/*
 * test_timer_spin: a thread that waits for a near timer by polling the
 * clock (weft_config.timer_spin_ns) still serves everything else, and the
 * flag that turns the polling off leaves timers exact.
 *
 *  - Work posted while spinning runs before the timer: workers = 1,
 *    timer_spin_ns = 4 s and a timer 3 s ahead, so the only thread polls
 *    the clock from the start. A handler posted from outside, then one
 *    posted from a handler, must both run while the timer is still armed
 *    (weft_timer_cancel then returns 0); a spin that ignored posted work
 *    would run them only after the timer, 3 s later, and cancel would
 *    return -EALREADY.
 *  - Timers fire exactly once and never early, with the default spin and
 *    with WEFT_CONFIG_NO_TIMER_SPIN: 200 one-shot timers 0..2 ms ahead on
 *    two strands, workers = 2.
 *  - timer_spin_ns larger than the wait of a timer far ahead does not stop
 *    the runtime from sleeping: covered by the idle-CPU benchmark, not
 *    here (tests assert behaviour, not time).
 */
#include "testutil.h"

#define NTIMERS 200

static tu_count ran_outside, ran_inner;
static weft_strand *strand_b;

static void inner(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran_inner, 1);
}

static void outside(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran_outside, 1);
  int rc = weft_post(strand_b, inner, NULL);
  TU_CHECKF(rc == 0, "post from a handler: %d (%s)", rc, weft_strerror(rc));
}

static void must_not_fire(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECKF(status == -ECANCELED, "the far timer fired: status %d", status);
}

static void test_post_while_spinning(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("posts while the only thread spins to a timer");
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  cfg.timer_spin_ns = 4000000000u;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  weft_strand *a;
  tu_strand_create(rt, &a);
  tu_strand_create(rt, &strand_b);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, a, &t), 0);
  atomic_store(&ran_outside, 0);
  atomic_store(&ran_inner, 0);
  tu_assert_rc(weft_timer_start(t, 3000000000u, 0, must_not_fire, NULL), 0);
  tu_sleep_ms(20); /* the thread is polling the clock by now */
  tu_assert_rc(weft_post(a, outside, NULL), 0);
  tu_wait_count(&ran_inner, 1, "the posted handlers to run");
  assert_int_equal(atomic_load(&ran_outside), 1);
  tu_assert_rc(weft_timer_cancel(t), 0); /* it had not fired */
  weft_timer_destroy(t);
  weft_strand_release(a);
  weft_strand_release(strand_b);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void exact_once(unsigned flags) {
  tu_reset_async_errors();
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.flags = flags;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  weft_strand *s[2];
  tu_strand_create(rt, &s[0]);
  tu_strand_create(rt, &s[1]);
  tu_tslot *sl = calloc(NTIMERS, sizeof *sl);
  weft_timer **t = calloc(NTIMERS, sizeof *t);
  assert_non_null(sl);
  assert_non_null(t);
  tu_count fired;
  atomic_init(&fired, 0);
  uint64_t base = weft_now_ns();
  for (unsigned i = 0; i < NTIMERS; i++) {
    sl[i].strand = s[i % 2];
    sl[i].fired = &fired;
    atomic_init(&sl[i].calls, 0);
    sl[i].deadline = base + (uint64_t)(i * 7919 % NTIMERS) * 10000u;
    tu_assert_rc(weft_timer_create(rt, sl[i].strand, &t[i]), 0);
    tu_assert_rc(
        weft_timer_start_at(t[i], sl[i].deadline, 0, tu_tslot_handler, &sl[i]),
        0);
  }
  tu_wait_count(&fired, NTIMERS, "every timer to fire");
  for (unsigned i = 0; i < NTIMERS; i++) {
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
    weft_timer_destroy(t[i]);
  }
  weft_strand_release(s[0]);
  weft_strand_release(s[1]);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NTIMERS; i++)
    assert_int_equal(atomic_load(&sl[i].calls), 1);
  free(sl);
  free(t);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_exact_with_spin(void **state) {
  (void)state;
  tu_phase("timers with the default spin");
  exact_once(0);
}

static void test_exact_without_spin(void **state) {
  (void)state;
  tu_phase("timers with WEFT_CONFIG_NO_TIMER_SPIN");
  exact_once(WEFT_CONFIG_NO_TIMER_SPIN);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_post_while_spinning),
      cmocka_unit_test(test_exact_with_spin),
      cmocka_unit_test(test_exact_without_spin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
