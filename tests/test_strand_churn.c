/*
 * test_strand_churn: 10^6 strands (divided by WEFT_TEST_SCALE) are created,
 * posted to and released, in batches of 10^4 with two batches in flight:
 *
 *   kind 0: two handlers, released by the creator right after posting
 *           (usually while they are pending);
 *   kind 1: three handlers; the second posts the third to its own strand
 *           and then releases the strand from inside (the third is pending
 *           at release);
 *   kind 2: no handler, released at once;
 *   kind 3: one handler, released at once.
 *
 * Every handler runs exactly once, in order within its strand; after
 * everything ran stats.strands_live comes back to 0 (released strands are
 * reclaimed); the ASan build checks at exit that nothing leaked. Also: a
 * strand released while its handlers are surely pending (held by a gate).
 */
#include "testutil.h"

#define NWORKERS 4
#define BATCH 10000u
#define HPS 3u /* handler slots per strand */

static weft_rt *g_rt;
static weft_strand *g_strands[2][BATCH];
static atomic_uchar g_flags[2][BATCH * HPS];
static tu_count g_done;
/* handlers done per half: waiting on g_done alone would not do, since the
 * batch just posted can run while the previous one is still pending */
static tu_count g_batch_done[2];

static unsigned kind_of(uint64_t global) { return (unsigned)(global % 4); }

static void *encode(unsigned parity, unsigned j, unsigned k) {
  return (void *)(uintptr_t)(((uintptr_t)parity * BATCH + j) * HPS + k);
}

static void on_handler(void *arg) {
  uintptr_t v = (uintptr_t)arg;
  unsigned k = (unsigned)(v % HPS);
  unsigned j = (unsigned)((v / HPS) % BATCH);
  unsigned parity = (unsigned)(v / HPS / BATCH);
  atomic_uchar *f = &g_flags[parity][j * HPS];

  weft_strand *self = weft_strand_current();
  TU_CHECKF(self == g_strands[parity][j],
            "weft_strand_current() is not the strand being run");
  /* In order within the strand: the previous handlers already ran. */
  for (unsigned p = 0; p < k; p++)
    TU_CHECKF(atomic_load(&f[p]) == 1,
              "strand slot %u: handler %u ran before handler %u", j, k, p);
  unsigned before = atomic_fetch_add(&f[k], 1);
  TU_CHECKF(before == 0, "strand slot %u handler %u ran twice", j, k);
  atomic_fetch_add(&g_batch_done[parity], 1);
  atomic_fetch_add(&g_done, 1);
}

/* Kind 1's second handler. Separate function so the kind needs no lookup. */
static void on_handler_release_self(void *arg) {
  uintptr_t v = (uintptr_t)arg;
  unsigned j = (unsigned)((v / HPS) % BATCH);
  unsigned parity = (unsigned)(v / HPS / BATCH);
  weft_strand *self = weft_strand_current();
  TU_CHECKF(self == g_strands[parity][j],
            "weft_strand_current() is not the strand being run");
  /* Checked like any handler; the release comes before g_done is bumped,
   * since the test thread may reuse the slot once the count is reached. */
  uintptr_t k = v % HPS;
  atomic_uchar *f = &g_flags[parity][j * HPS];
  TU_CHECKF(k == 1 && atomic_load(&f[0]) == 1,
            "release-self handler out of order");
  unsigned before = atomic_fetch_add(&f[k], 1);
  TU_CHECKF(before == 0, "strand slot %u handler %u ran twice", j, (unsigned)k);
  if (self) {
    /* Queue our third handler, then let go of the strand with it pending. */
    int rc = weft_post(self, on_handler, encode(parity, j, 2));
    TU_CHECKF(rc == 0, "post to own strand from its handler: %d (%s)", rc,
              weft_strerror(rc));
    weft_strand_release(self);
  }
  atomic_fetch_add(&g_batch_done[parity], 1);
  atomic_fetch_add(&g_done, 1);
}

/* Posts one batch of strands; returns the number of handlers posted. */
static uint64_t post_batch(uint64_t first, unsigned n, unsigned parity) {
  uint64_t posted = 0;
  atomic_store(&g_batch_done[parity], 0);
  for (unsigned j = 0; j < n; j++) {
    weft_strand *s = NULL;
    int rc = weft_strand_create(g_rt, &s);
    if (rc != 0)
      fail_msg("weft_strand_create #%" PRIu64 " failed: %d (%s)", first + j, rc,
               weft_strerror(rc));
    g_strands[parity][j] = s;
    for (unsigned k = 0; k < HPS; k++)
      atomic_store(&g_flags[parity][j * HPS + k], 0);
    switch (kind_of(first + j)) {
    case 0:
      tu_assert_rc(weft_post(s, on_handler, encode(parity, j, 0)), 0);
      tu_assert_rc(weft_post(s, on_handler, encode(parity, j, 1)), 0);
      weft_strand_release(s);
      posted += 2;
      break;
    case 1:
      tu_assert_rc(weft_post(s, on_handler, encode(parity, j, 0)), 0);
      tu_assert_rc(weft_post(s, on_handler_release_self, encode(parity, j, 1)),
                   0);
      posted += 3; /* the third is posted by the second */
      break;
    case 2:
      weft_strand_release(s);
      break;
    default:
      tu_assert_rc(weft_post(s, on_handler, encode(parity, j, 0)), 0);
      weft_strand_release(s);
      posted += 1;
      break;
    }
  }
  return posted;
}

static void check_batch(uint64_t first, unsigned n, unsigned parity) {
  static const unsigned handlers_of_kind[4] = {2, 3, 0, 1};
  for (unsigned j = 0; j < n; j++) {
    unsigned want = handlers_of_kind[kind_of(first + j)];
    for (unsigned k = 0; k < HPS; k++) {
      unsigned got = atomic_load(&g_flags[parity][j * HPS + k]);
      if (got != (k < want ? 1u : 0u))
        fail_msg("strand #%" PRIu64 " (kind %u) handler %u ran %u times",
                 first + j, kind_of(first + j), k, got);
    }
  }
}

static void test_churn(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("churn");
  tu_rt_create(&g_rt, NWORKERS, 0);

  uint64_t total = TU_SCALED(1000000, 20000);
  uint64_t expected = 0, prev_posted = 0;
  uint64_t first = 0, prev_first = 0;
  unsigned prev_n = 0, batches = 0;
  atomic_store(&g_done, 0);
  while (first < total) {
    unsigned parity = batches % 2;
    unsigned n = (unsigned)(total - first < BATCH ? total - first : BATCH);
    uint64_t posted = post_batch(first, n, parity);
    /* Two batches in flight: before reusing the other half, wait for the
     * previous batch and check it. */
    if (batches > 0) {
      tu_wait_count(&g_batch_done[parity ^ 1u], prev_posted,
                    "the previous batch");
      TU_ASSERT_NO_ASYNC_ERRORS();
      check_batch(prev_first, prev_n, parity ^ 1u);
    }
    expected += posted;
    prev_posted = posted;
    prev_first = first;
    prev_n = n;
    first += n;
    batches++;
  }
  tu_wait_count(&g_batch_done[(batches - 1) % 2], prev_posted,
                "the last batch");
  tu_wait_count(&g_done, expected, "every handler");
  TU_ASSERT_NO_ASYNC_ERRORS();
  check_batch(prev_first, prev_n, (batches - 1) % 2);

  tu_phase("waiting for strands_live to reach 0");
  tu_stat_wait w = {g_rt, 0};
  tu_wait_until(tu_pred_strands_live_le, &w,
                "every released strand to be reclaimed");
  tu_stat_wait h = {g_rt, expected};
  tu_wait_until(tu_pred_handlers_run_ge, &h, "stats.handlers_run");
  weft_stats st;
  tu_stats(g_rt, &st);
  assert_int_equal(st.strands_live, 0);
  assert_int_equal(st.total.handlers_run, expected);
  assert_int_equal(atomic_load(&g_done), expected);

  assert_int_equal(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Release while the handlers are surely pending: a gate holds the strand. */
static tu_count g_gated_ran;
static void gated_handler(void *arg) {
  unsigned i = (unsigned)(uintptr_t)arg;
  uint64_t before = atomic_fetch_add(&g_gated_ran, 1);
  TU_CHECKF(before == i, "handler %u ran as number %" PRIu64, i, before);
}

static void test_release_with_pending(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("release with pending handlers");
  atomic_store(&g_gated_ran, 0);
  tu_rt_create(&g_rt, 2, 0);
  weft_stats st;
  unsigned rounds = (unsigned)TU_SCALED(200, 20);
  for (unsigned r = 0; r < rounds; r++) {
    atomic_store(&g_gated_ran, 0);
    tu_gate gate;
    tu_gate_init(&gate);
    weft_strand *s;
    tu_strand_create(g_rt, &s);
    tu_assert_rc(weft_post(s, tu_gate_handler, &gate), 0);
    for (unsigned i = 0; i < 10; i++)
      tu_assert_rc(weft_post(s, gated_handler, (void *)(uintptr_t)i), 0);
    if (r % 2)
      tu_wait_count(&gate.entered, 1, "the gate handler to start");
    weft_strand_release(s);
    tu_stats(g_rt, &st);
    assert_int_equal(st.strands_live, 1); /* pending work keeps it */
    tu_gate_open(&gate);
    tu_wait_count(&g_gated_ran, 10, "the handlers of a released strand");
    tu_stat_wait w = {g_rt, 0};
    tu_wait_until(tu_pred_strands_live_le, &w,
                  "the released strand to be reclaimed");
    /* the gate is touched by the gate handler until it returns; it has
     * returned once the handlers behind it ran */
    tu_gate_destroy(&gate);
  }
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_churn),
      cmocka_unit_test(test_release_with_pending),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
