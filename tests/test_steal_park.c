/*
 * test_steal_park: work posted from outside into an idle runtime all runs,
 * the runtime goes back to sleep, and it wakes again for the next round.
 *
 * Several rounds; in each, 4 foreign threads post (weft_post_rt, and weft_post
 * to 16 strands) into a runtime whose threads are parked; we wait until every
 * handler ran, then until the threads have parked again (weft_stats.parks
 * grew since the round began: parking is how weft waits, it never spins
 * forever). One round fans out: a few roots each post k more from inside
 * handlers, recursively, so the work starts on one shard and must be stolen
 * or shared to spread. Nothing may be lost, and stats.handlers_run must equal
 * exactly what was posted, in total and summed over the shards. Steal counts
 * are not asserted (timing decides who steals).
 */
#include "testutil.h"

#define NWORKERS 4
#define NPOSTERS 4
#define NSTRANDS 16
#define ROUNDS 4

static weft_rt *g_rt;
static weft_strand *g_strands[NSTRANDS];
static tu_count g_done;
static tu_barrier g_start;

static void on_leaf(void *arg) {
  (void)arg;
  TU_CHECK(weft_rt_current() == g_rt);
  atomic_fetch_add(&g_done, 1);
}

typedef struct poster {
  uint64_t n;
  pthread_t th;
  unsigned id;
} poster;

static void *poster_main(void *arg) {
  poster *p = arg;
  tu_barrier_wait(&g_start);
  for (uint64_t i = 0; i < p->n; i++) {
    int rc;
    if (i % 2 == 0)
      rc = weft_post_rt(g_rt, on_leaf, NULL);
    else
      rc = weft_post(g_strands[(i / 2 + p->id) % NSTRANDS], on_leaf, NULL);
    if (rc != 0) {
      TU_CHECKF(false, "post %" PRIu64 " failed: %d (%s)", i, rc,
                weft_strerror(rc));
      return NULL;
    }
  }
  return NULL;
}

/* Fan-out: a node at depth d < depth posts FANOUT children, alternating
 * weft_post_rt and weft_post to a strand. The arg encodes the depth. */
#define FANOUT 8
static unsigned g_depth;

static void on_node(void *arg) {
  unsigned d = (unsigned)(uintptr_t)arg;
  TU_CHECK(weft_rt_current() == g_rt);
  if (d < g_depth) {
    for (unsigned i = 0; i < FANOUT; i++) {
      void *child = (void *)(uintptr_t)(d + 1);
      int rc = (i % 2 == 0) ? weft_post_rt(g_rt, on_node, child)
                            : weft_post(g_strands[(d * FANOUT + i) % NSTRANDS],
                                        on_node, child);
      TU_CHECKF(rc == 0, "post from a handler failed: %d (%s)", rc,
                weft_strerror(rc));
    }
  }
  atomic_fetch_add(&g_done, 1);
}

static bool pred_parked_since(void *ctx, char *buf, size_t len) {
  uint64_t *since = ctx;
  weft_stats st;
  memset(&st, 0, sizeof st);
  if (weft_rt_stats(g_rt, &st) != 0)
    return false;
  snprintf(buf, len, "parks %" PRIu64 ", round began at %" PRIu64,
           st.total.parks, *since);
  return st.total.parks > *since;
}

/* After a round: all handlers counted by the runtime, the runtime parked
 * again, the counts exact in total and over the shards. */
static void end_round(uint64_t expected_total, uint64_t parks_at_start) {
  tu_stat_wait w = {g_rt, expected_total};
  tu_wait_until(tu_pred_handlers_run_ge, &w, "stats.handlers_run");
  tu_wait_until(pred_parked_since, &parks_at_start,
                "the workers to park again after the round");

  weft_stats st;
  tu_stats(g_rt, &st);
  assert_int_equal(st.total.handlers_run, expected_total);
  assert_int_equal(st.total.handlers_cancelled, 0);
  assert_int_equal(st.shards, NWORKERS);
  assert_int_equal(st.strands_live, NSTRANDS);

  /* Idle now: the per-shard counters add up to the totals. */
  uint64_t run = 0, parks = 0;
  for (unsigned i = 0; i < st.shards; i++) {
    weft_shard_stats ss;
    memset(&ss, 0, sizeof ss);
    assert_int_equal(weft_rt_shard_stats(g_rt, i, &ss), 0);
    run += ss.handlers_run;
    parks += ss.parks;
  }
  /* A handler preempted past the stall threshold may have had its shard
   * handed off; it is then counted in the total, not in a shard. */
  assert_int_equal(run + st.handlers_run_after_handoff, expected_total);
  assert_true(parks >= parks_at_start);
  assert_int_equal(atomic_load(&g_done), expected_total);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_rounds_and_fanout(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("setup");
  tu_rt_create(&g_rt, NWORKERS, 0);
  for (unsigned i = 0; i < NSTRANDS; i++)
    tu_strand_create(g_rt, &g_strands[i]);
  tu_barrier_init(&g_start, NPOSTERS);

  uint64_t total = TU_SCALED(1000000, 16000);
  /* Half of the work in flat rounds, half in the fan-out round. */
  uint64_t per_round = total / 2 / ROUNDS;
  uint64_t per_poster = per_round / NPOSTERS;
  uint64_t expected = 0;
  weft_stats st;

  for (unsigned r = 0; r < ROUNDS; r++) {
    tu_phase("flat round");
    tu_stats(g_rt, &st);
    uint64_t parks0 = st.total.parks;
    poster ps[NPOSTERS];
    for (unsigned p = 0; p < NPOSTERS; p++) {
      ps[p].n = per_poster;
      ps[p].id = p;
      tu_thread_start(&ps[p].th, poster_main, &ps[p]);
    }
    for (unsigned p = 0; p < NPOSTERS; p++)
      tu_thread_join(ps[p].th, "poster");
    expected += per_poster * NPOSTERS;
    tu_wait_count(&g_done, expected, "flat-round handlers");
    end_round(expected, parks0);
  }

  /* Fan-out: roots * (1 + F + F^2 + ... + F^depth) handlers. */
  tu_phase("fan-out round");
  uint64_t target = total / 2, roots = 4, per_root = 1, level = 1;
  g_depth = 0;
  while (roots * (per_root + level * FANOUT) <= target && g_depth < 8) {
    level *= FANOUT;
    per_root += level;
    g_depth++;
  }
  tu_stats(g_rt, &st);
  uint64_t parks0 = st.total.parks;
  for (uint64_t i = 0; i < roots; i++)
    assert_int_equal(weft_post_rt(g_rt, on_node, (void *)(uintptr_t)0), 0);
  expected += roots * per_root;
  tu_wait_count(&g_done, expected, "fan-out handlers");
  end_round(expected, parks0);

  /* And once more from idle, after the fan-out. */
  tu_phase("final round");
  tu_stats(g_rt, &st);
  parks0 = st.total.parks;
  for (uint64_t i = 0; i < 1000; i++)
    assert_int_equal(weft_post(g_strands[i % NSTRANDS], on_leaf, NULL), 0);
  expected += 1000;
  tu_wait_count(&g_done, expected, "final-round handlers");
  end_round(expected, parks0);

  tu_phase("teardown");
  for (unsigned i = 0; i < NSTRANDS; i++)
    weft_strand_release(g_strands[i]);
  assert_int_equal(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_stats(g_rt, &st);
  assert_int_equal(st.total.handlers_run, expected);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  tu_barrier_destroy(&g_start);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A runtime that was never given work parks and wakes for a single post,
 * repeatedly: the lost-wakeup shape (one post into a fully parked runtime). */
static void test_single_posts_wake(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("single posts");
  atomic_store(&g_done, 0);
  tu_rt_create(&g_rt, NWORKERS, 0);
  weft_strand *s;
  tu_strand_create(g_rt, &s);
  g_strands[0] = s;
  unsigned n = (unsigned)TU_SCALED(200, 20);
  for (unsigned i = 0; i < n; i++) {
    weft_stats st;
    tu_stats(g_rt, &st);
    uint64_t parks0 = st.total.parks;
    if (i % 2)
      assert_int_equal(weft_post(s, on_leaf, NULL), 0);
    else
      assert_int_equal(weft_post_rt(g_rt, on_leaf, NULL), 0);
    tu_wait_count(&g_done, i + 1, "a single post into a parked runtime");
    /* Let it park again before the next post (no timing: wait for it). */
    tu_wait_until(pred_parked_since, &parks0, "the workers to park again");
  }
  tu_stat_wait w = {g_rt, n};
  tu_wait_until(tu_pred_handlers_run_ge, &w, "stats.handlers_run");
  weft_stats st;
  tu_stats(g_rt, &st);
  assert_int_equal(st.total.handlers_run, n);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounds_and_fanout),
      cmocka_unit_test(test_single_posts_wake),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
