/*
 * test_released_debug (built and registered only with WEFT_DEBUG=ON):
 * posting to a strand that was released and whose handlers have all run is
 * a bug that debug builds still catch with -EBADF: they keep the strand's
 * memory poisoned instead of reusing it. So even after many new strands
 * were created (which a release build would place in the freed memory), the
 * old handles are refused and the new strands work.
 */
#include "testutil.h"

#define N 1000

static tu_count g_ran;

static void count_fn(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_ran, 1);
}

static void must_not_run(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a handler posted to a released strand ran");
}

static void test_released_then_idle(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("released strands");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  static weft_strand *old[N], *fresh[N];

  for (unsigned i = 0; i < N; i++) {
    tu_strand_create(rt, &old[i]);
    tu_assert_rc(weft_post(old[i], count_fn, NULL), 0);
    if (i % 2)
      tu_assert_rc(weft_post(old[i], count_fn, NULL), 0);
    weft_strand_release(old[i]);
  }
  /* Also strands released with nothing ever posted. */
  weft_strand *never_used;
  tu_strand_create(rt, &never_used);
  weft_strand_release(never_used);

  tu_wait_count(&g_ran, N + N / 2, "the handlers of the released strands");
  /* All ran; wait until the runtime is done with them too. */
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_strands_live_le, &w,
                "the released strands to be reclaimed");

  for (unsigned i = 0; i < N; i++) {
    int rc = weft_post(old[i], must_not_run, NULL);
    if (rc != -EBADF)
      fail_msg("post to released, idle strand %u returned %d (%s), expected "
               "-EBADF",
               i, rc, weft_strerror(rc));
  }
  tu_assert_rc(weft_post(never_used, must_not_run, NULL), -EBADF);

  /* New strands (in a release build they would reuse that memory). */
  for (unsigned i = 0; i < N; i++) {
    tu_strand_create(rt, &fresh[i]);
    tu_assert_rc(weft_post(fresh[i], count_fn, NULL), 0);
  }
  for (unsigned i = 0; i < N; i++) {
    int rc = weft_post_ex(old[i], must_not_run, must_not_run, NULL);
    if (rc != -EBADF)
      fail_msg("post to released strand %u after new strands were created "
               "returned %d (%s), expected -EBADF",
               i, rc, weft_strerror(rc));
  }
  tu_wait_count(&g_ran, 2 * N + N / 2, "the handlers of the new strands");
  for (unsigned i = 0; i < N; i++)
    weft_strand_release(fresh[i]);

  tu_stat_wait h = {rt, 2 * N + N / 2};
  tu_wait_until(tu_pred_handlers_run_ge, &h, "stats.handlers_run");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.total.handlers_run, 2 * N + N / 2);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_ran), 2 * N + N / 2);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_released_then_idle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
