/*
 * test_two_runtimes: two runtimes in one process do not know of each other.
 *
 * Handlers on strands of runtime A post to strands of runtime B (for B these
 * are foreign posts) and weft_post_rt to B; B's handlers see B as the current
 * runtime, A's see A. The counts are exact, the per-strand order of A's posts
 * into B holds (A's handlers on one strand are serial, so their posts are
 * ordered), and each runtime's stats count only its own handlers. Shutting A
 * down leaves B working.
 */
#include "testutil.h"

#define NSTRANDS 8

typedef struct side {
  weft_rt *rt;
  weft_strand *s[NSTRANDS];
} side;

static side g_a, g_b;
static tu_count g_a_ran, g_b_ran, g_b_rt_ran;
/* next sequence expected on B's strand i from A's strand i; touched only by
 * handlers of B's strand i */
static uint64_t g_b_seen[NSTRANDS];
/* sequence sent from A's strand i; touched only by A's strand i */
static uint64_t g_a_sent[NSTRANDS];

typedef struct bmsg {
  unsigned strand;
  uint64_t seq;
} bmsg;

static void on_b(void *arg) {
  bmsg *m = arg;
  TU_CHECK(weft_rt_current() == g_b.rt);
  TU_CHECK(weft_strand_current() == g_b.s[m->strand]);
  TU_CHECKF(m->seq == g_b_seen[m->strand] + 1,
            "B strand %u got seq %" PRIu64 " after %" PRIu64, m->strand, m->seq,
            g_b_seen[m->strand]);
  g_b_seen[m->strand] = m->seq;
  free(m);
  atomic_fetch_add(&g_b_ran, 1);
}

static void on_b_rt(void *arg) {
  (void)arg;
  TU_CHECK(weft_rt_current() == g_b.rt);
  TU_CHECK(weft_strand_current() == NULL);
  atomic_fetch_add(&g_b_rt_ran, 1);
}

static void on_a(void *arg) {
  unsigned i = (unsigned)(uintptr_t)arg;
  TU_CHECK(weft_rt_current() == g_a.rt);
  TU_CHECK(weft_strand_current() == g_a.s[i]);
  bmsg *m = malloc(sizeof *m);
  TU_CHECK(m != NULL);
  if (m) {
    m->strand = i;
    m->seq = ++g_a_sent[i];
    int rc = weft_post(g_b.s[i], on_b, m);
    TU_CHECKF(rc == 0, "A handler posting to B's strand: %d (%s)", rc,
              weft_strerror(rc));
    if (rc != 0) {
      --g_a_sent[i];
      free(m);
    }
  }
  int rc = weft_post_rt(g_b.rt, on_b_rt, NULL);
  TU_CHECKF(rc == 0, "A handler posting to B's runtime: %d (%s)", rc,
            weft_strerror(rc));
  /* weft_post_rt into its own runtime is unaffected */
  atomic_fetch_add(&g_a_ran, 1);
}

static void test_two_runtimes(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("two runtimes");
  tu_rt_create(&g_a.rt, 2, 0);
  tu_rt_create(&g_b.rt, 3, 0);
  assert_ptr_not_equal(g_a.rt, g_b.rt);
  assert_int_equal(weft_rt_workers(g_a.rt), 2);
  assert_int_equal(weft_rt_workers(g_b.rt), 3);
  for (unsigned i = 0; i < NSTRANDS; i++) {
    tu_strand_create(g_a.rt, &g_a.s[i]);
    tu_strand_create(g_b.rt, &g_b.s[i]);
  }

  uint64_t n = TU_SCALED(100000, 5000);
  for (uint64_t k = 0; k < n; k++) {
    unsigned i = (unsigned)(k % NSTRANDS);
    tu_assert_rc(weft_post(g_a.s[i], on_a, (void *)(uintptr_t)i), 0);
  }
  tu_wait_count(&g_a_ran, n, "A's handlers");
  tu_wait_count(&g_b_ran, n, "B's strand handlers");
  tu_wait_count(&g_b_rt_ran, n, "B's runtime handlers");
  TU_ASSERT_NO_ASYNC_ERRORS();

  /* Each runtime counts only its own. */
  tu_stat_wait wa = {g_a.rt, n}, wb = {g_b.rt, 2 * n};
  tu_wait_until(tu_pred_handlers_run_ge, &wa, "A's stats.handlers_run");
  tu_wait_until(tu_pred_handlers_run_ge, &wb, "B's stats.handlers_run");
  weft_stats sa, sb;
  tu_stats(g_a.rt, &sa);
  tu_stats(g_b.rt, &sb);
  assert_int_equal(sa.total.handlers_run, n);
  assert_int_equal(sb.total.handlers_run, 2 * n);
  assert_int_equal(sa.shards, 2);
  assert_int_equal(sb.shards, 3);
  assert_int_equal(sa.strands_live, NSTRANDS);
  assert_int_equal(sb.strands_live, NSTRANDS);
  for (unsigned i = 0; i < NSTRANDS; i++)
    assert_int_equal(g_b_seen[i], g_a_sent[i]);

  /* Shutting A down does not touch B. */
  for (unsigned i = 0; i < NSTRANDS; i++)
    weft_strand_release(g_a.s[i]);
  assert_int_equal(weft_rt_shutdown(g_a.rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_post_rt(g_a.rt, on_b_rt, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_rt(g_b.rt, on_b_rt, NULL), 0);
  weft_strand *s = NULL;
  tu_assert_rc(weft_strand_create(g_b.rt, &s), 0);
  weft_strand_release(s);
  tu_wait_count(&g_b_rt_ran, n + 1, "B's handler after A's shutdown");
  assert_int_equal(weft_rt_destroy(g_a.rt), 0);

  /* B still works after A is gone. */
  tu_assert_rc(weft_post_rt(g_b.rt, on_b_rt, NULL), 0);
  tu_wait_count(&g_b_rt_ran, n + 2, "B's handler after A's destroy");
  for (unsigned i = 0; i < NSTRANDS; i++)
    weft_strand_release(g_b.s[i]);
  assert_int_equal(weft_rt_shutdown(g_b.rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_stats(g_b.rt, &sb);
  assert_int_equal(sb.total.handlers_run, 2 * n + 2);
  assert_int_equal(weft_rt_destroy(g_b.rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_runtimes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
