/*
 * test_batch_fairness: a busy strand cannot starve others. With one worker
 * and batch = 4, strand A has 100 pending handlers and strand B gets one
 * handler posted after them: B's handler must run before A's 100 are done.
 * Asserted on the recorded order of events, never on time.
 *
 * Two ways of posting:
 *  - local: a handler on the worker posts A's 100 and then B's one (both
 *    strands land on that shard's run queue, A first);
 *  - foreign: the worker is held by a gate while the test thread posts A's
 *    100 and then B's one from outside; then the gate opens.
 * In both, A's handlers run in order, each exactly once. In the local case
 * the documented rule (after a batch, A requeues at the back of the run
 * queue, where B already waits) means B runs after at most 4 of A's.
 *
 * Posted from inside a turn: with two workers, one parked, and batch 64, a
 * handler of A's turn of 64 (each computing 1 ms of its thread's CPU time)
 * posts to B, the only thing then in its ring. Its worker would run B only
 * after the turn, so the parked worker is woken for it: B runs before A's
 * last handler.
 */
#include "testutil.h"

#define NA 100
#define BATCH 4

static weft_rt *g_rt;
static weft_strand *g_a, *g_b;
/* events: 0..NA-1 = A's handler i, NA = B's handler */
static int g_events[NA + 1];
static atomic_uint g_nevents;
static tu_count g_done;

static void record(int ev) {
  unsigned at = atomic_fetch_add(&g_nevents, 1);
  TU_CHECKF(at < NA + 1, "more events than handlers");
  if (at < NA + 1)
    g_events[at] = ev;
  atomic_fetch_add(&g_done, 1);
}

static void on_a(void *arg) {
  TU_CHECK(weft_strand_current() == g_a);
  record((int)(uintptr_t)arg);
}

static void on_b(void *arg) {
  (void)arg;
  TU_CHECK(weft_strand_current() == g_b);
  record(NA);
}

static void post_all(void) {
  for (unsigned i = 0; i < NA; i++) {
    int rc = weft_post(g_a, on_a, (void *)(uintptr_t)i);
    TU_CHECKF(rc == 0, "post to A: %d", rc);
  }
  int rc = weft_post(g_b, on_b, NULL);
  TU_CHECKF(rc == 0, "post to B: %d", rc);
}

static void poster_handler(void *arg) {
  (void)arg;
  post_all();
}

static void setup_rt(void) {
  atomic_store(&g_nevents, 0);
  atomic_store(&g_done, 0);
  memset(g_events, -1, sizeof g_events);
  /* No monitor: the order asserted needs the one worker to stay held while
   * the posts are made. Under a loaded sanitizer run posting 101 handlers
   * (or the gate) can pass the stall threshold, and a handoff would let a
   * second thread run A's handlers before B's is posted. */
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  cfg.batch = BATCH;
  cfg.flags = WEFT_CONFIG_NO_MONITOR;
  g_rt = NULL;
  tu_assert_rc(weft_rt_create(&g_rt, &cfg), 0);
  assert_int_equal(weft_rt_workers(g_rt), 1);
  tu_strand_create(g_rt, &g_a);
  tu_strand_create(g_rt, &g_b);
}

static bool pred_turns(void *ctx, char *buf, size_t len) {
  uint64_t want = *(uint64_t *)ctx;
  weft_stats st;
  memset(&st, 0, sizeof st);
  if (weft_rt_stats(g_rt, &st) != 0)
    return false;
  snprintf(buf, len, "strands_run %" PRIu64 ", want >= %" PRIu64,
           st.total.strands_run, want);
  return st.total.strands_run >= want;
}

/* max_b_at: the latest position B may take (NA - 1: before A is done). */
static void check_order(const char *how, int max_b_at) {
  tu_wait_count(&g_done, NA + 1, "A's and B's handlers");
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(atomic_load(&g_nevents), NA + 1);

  int b_at = -1, next_a = 0;
  for (int k = 0; k < NA + 1; k++) {
    if (g_events[k] == NA) {
      if (b_at >= 0)
        fail_msg("%s: B ran twice", how);
      b_at = k;
    } else {
      if (g_events[k] != next_a)
        fail_msg("%s: event %d is A's handler %d, expected %d", how, k,
                 g_events[k], next_a);
      next_a++;
    }
  }
  assert_int_equal(next_a, NA);
  if (b_at < 0)
    fail_msg("%s: B never ran", how);
  /* B ran before A's last handler: A could not starve it. */
  if (b_at >= NA)
    fail_msg("%s: B's handler ran only after all %d of A's (batch %d): a "
             "busy strand starved another",
             how, NA, BATCH);
  if (b_at > max_b_at)
    fail_msg("%s: B's handler ran after %d of A's handlers; with batch %d, "
             "A should have gone to the back of the run queue behind B "
             "after at most %d",
             how, b_at, BATCH, max_b_at);
  print_message("%s: B ran after %d of A's handlers\n", how, b_at);

  /* A needs at least NA / BATCH turns, B one: the batch bounds a turn. */
  uint64_t turns = NA / BATCH + 1;
  tu_wait_until(pred_turns, &turns, "stats.strands_run");
}

static void teardown_rt(void) {
  weft_strand_release(g_a);
  weft_strand_release(g_b);
  assert_int_equal(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_local_posts(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("local posts");
  setup_rt();
  tu_assert_rc(weft_post_rt(g_rt, poster_handler, NULL), 0);
  /* Both strands are on the worker's own run queue, A first: A runs at most
   * one batch, then requeues at the back, behind B. */
  check_order("posted from a handler", BATCH);
  teardown_rt();
}

#define NTURN 64

static atomic_uint g_a_ran, g_a_ran_at_b;
static tu_count g_turn_done;

static void turn_b(void *arg) {
  (void)arg;
  atomic_store(&g_a_ran_at_b, atomic_load(&g_a_ran) + 1);
  atomic_fetch_add(&g_turn_done, 1);
}

static void turn_a(void *arg) {
  if (arg)
    TU_CHECK_RC(weft_post(g_b, turn_b, NULL), 0);
  struct timespec t0, t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  do /* CPU time: a preempted thread does not shorten the turn */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) <
         1000000L);
  atomic_fetch_add(&g_a_ran, 1);
  atomic_fetch_add(&g_turn_done, 1);
}

static void post_turn(void *arg) {
  (void)arg;
  for (unsigned i = 0; i < NTURN; i++)
    TU_CHECK_RC(weft_post(g_a, turn_a, i == 0 ? (void *)1 : NULL), 0);
}

static void test_post_inside_turn(void **state) {
  (void)state;
  tu_reset_async_errors();
  atomic_store(&g_a_ran, 0);
  atomic_store(&g_a_ran_at_b, 0);
  atomic_store(&g_turn_done, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.batch = NTURN;
  cfg.stall_threshold_ns = 10000000000ull; /* no handoff: one turn */
  g_rt = NULL;
  tu_assert_rc(weft_rt_create(&g_rt, &cfg), 0);
  tu_strand_create(g_rt, &g_a);
  tu_strand_create(g_rt, &g_b);
  /* Through a strand of its own, so that A's handlers are queued on A
   * before its turn begins: the turn is all NTURN of them. */
  weft_strand *p;
  tu_strand_create(g_rt, &p);
  tu_on_strand(p, post_turn, NULL);
  weft_strand_release(p);
  tu_wait_count(&g_turn_done, NTURN + 1, "A's and B's handlers");
  unsigned at = atomic_load(&g_a_ran_at_b);
  print_message("B ran with %u of A's %d handlers done\n", at - 1, NTURN);
  if (at - 1 >= NTURN)
    fail_msg("B, posted by A's first handler, waited for A's whole turn "
             "of %d handlers while a worker was parked",
             NTURN);
  teardown_rt();
}

static void test_foreign_posts(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("foreign posts");
  setup_rt();
  tu_gate gate;
  tu_gate_init(&gate);
  weft_strand *g;
  tu_strand_create(g_rt, &g);
  tu_assert_rc(weft_post(g, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler to hold the worker");
  post_all();
  tu_gate_open(&gate);
  check_order("posted from outside", NA - 1);
  weft_strand_release(g);
  teardown_rt();
  tu_gate_destroy(&gate);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_posts),
      cmocka_unit_test(test_foreign_posts),
      cmocka_unit_test(test_post_inside_turn),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
