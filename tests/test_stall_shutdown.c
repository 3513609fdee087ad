/*
 * test_stall_shutdown: a shutdown finishes only when stuck handlers (whose
 * shards were handed off) and running blocking jobs have finished, and it
 * keeps the exactly-once promise for everything it cancels or drains.
 *
 * For DRAIN and for CANCEL (stall threshold 50 us, workers=2,
 * blocking_threads=2):
 *  - weft_rt_wait before any shutdown: -ETIMEDOUT, as it waits for one
 *    to be started too (NULL: -EINVAL); from a handler: -EDEADLK.
 *  - One gate handler per worker, each on its own strand, stuck (and handed
 *    off); behind each, handlers with cancel functions. Two blocking jobs
 *    stuck in work on the same gate, more queued behind them. One timer
 *    armed far in the future.
 *  - weft_rt_shutdown(how | NOWAIT) returns 0 at once; weft_rt_wait with a
 *    small timeout returns -ETIMEDOUT while the gate is shut (the stuck
 *    handlers are provably still inside); posts and weft_blocking fail with
 *    -ESHUTDOWN, a second shutdown with -EALREADY.
 *  - The gate opens; weft_rt_wait (generous) returns 0, and then:
 *      gate handlers returned once each; the handlers behind them ran once
 *      (DRAIN) or had their cancel function run once (CANCEL); the running
 *      jobs' done got their result; the queued jobs ran and their done got
 *      the result (DRAIN) or never ran and their done got -ECANCELED
 *      (CANCEL); the timer's handler ran once with -ECANCELED;
 *      stats.handlers_run + handlers_cancelled equals everything accepted,
 *      split as the mode says, and stats.blocking_done counts every done.
 *  - weft_rt_destroy then returns 0.
 */
#include "testutil.h"

#define NWORKERS 2
#define NBEHIND 50 /* handlers behind each stuck gate handler */
#define NRUNNING 2 /* = blocking_threads */
#define NQUEUED 5

typedef struct item {
  atomic_uint ran, cancelled;
} item;

typedef struct bjob {
  weft_strand *done_strand;
  bool queued; /* provably not started at shutdown */
  atomic_uint started, done_calls;
  atomic_long got;
} bjob;

static tu_gate g_gate;  /* the stuck handlers */
static tu_gate g_jgate; /* the stuck blocking jobs */
static item g_items[NWORKERS][NBEHIND];
static bjob g_jobs[NRUNNING + NQUEUED];
static tu_count g_work_entered;
static atomic_uint g_timer_calls;
static atomic_int g_timer_status;
static atomic_int g_wait_rc_in_handler;
static tu_count g_probe_done;
static weft_rt *g_rt;

static void quiet_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
}

static void item_run(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
}

static void item_cancel(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->cancelled, 1);
}

static long job_work(void *arg) {
  bjob *j = arg;
  atomic_fetch_add(&j->started, 1);
  atomic_fetch_add(&g_work_entered, 1);
  tu_gate_pass(&g_jgate);
  return 4242 + (long)(j - g_jobs);
}

static void job_done(void *arg, long result) {
  bjob *j = arg;
  TU_CHECK(weft_strand_current() == j->done_strand);
  atomic_store(&j->got, result);
  atomic_fetch_add(&j->done_calls, 1);
}

static void timer_fn(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  atomic_store(&g_timer_status, status);
  atomic_fetch_add(&g_timer_calls, 1);
}

static void wait_probe(void *arg) {
  (void)arg;
  atomic_store(&g_wait_rc_in_handler, weft_rt_wait(g_rt, 1000000));
  atomic_fetch_add(&g_probe_done, 1);
}

static void never(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a refused post ran");
}
static long work_never(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a refused job ran");
  return 0;
}
static void done_never(void *arg, long result) {
  (void)arg;
  (void)result;
  TU_CHECKF(false, "a refused job's done ran");
}

static bool pred_handoffs(void *ctx, char *buf, size_t len) {
  weft_stats st;
  if (weft_rt_stats(ctx, &st) != 0)
    return false;
  snprintf(buf, len, "handoffs %" PRIu64, st.total.handoffs);
  return st.total.handoffs >= NWORKERS;
}

static void run_stall_shutdown(int how) {
  bool cancel = how == WEFT_SHUTDOWN_CANCEL;
  tu_reset_async_errors();
  tu_phase(cancel ? "stall_shutdown CANCEL: setup"
                  : "stall_shutdown DRAIN: setup");
  tu_gate_init(&g_gate);
  tu_gate_init(&g_jgate);
  memset(g_items, 0, sizeof g_items);
  memset(g_jobs, 0, sizeof g_jobs);
  atomic_store(&g_work_entered, 0);
  atomic_store(&g_timer_calls, 0);
  atomic_store(&g_timer_status, 1);
  atomic_store(&g_wait_rc_in_handler, 1);
  atomic_store(&g_probe_done, 0);

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = NWORKERS;
  cfg.stall_threshold_ns = 50000;
  cfg.blocking_threads = NRUNNING;
  cfg.blocking_queue = 16;
  cfg.on_stall = quiet_stall;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  g_rt = rt;

  /* No shutdown yet. */
  tu_assert_rc(weft_rt_wait(rt, 1000000), -ETIMEDOUT);
  tu_assert_rc(weft_rt_wait(NULL, 1000000), -EINVAL);
  assert_int_equal(weft_post_rt(rt, wait_probe, NULL), 0);
  tu_wait_count(&g_probe_done, 1, "the weft_rt_wait probe handler");
  assert_int_equal(atomic_load(&g_wait_rc_in_handler), -EDEADLK);

  weft_strand *gated[NWORKERS], *plain;
  for (unsigned i = 0; i < NWORKERS; i++)
    tu_strand_create(rt, &gated[i]);
  tu_strand_create(rt, &plain);
  for (unsigned i = 0; i < NWORKERS; i++)
    assert_int_equal(weft_post(gated[i], tu_gate_handler, &g_gate), 0);
  tu_phase("stall_shutdown: waiting for the gate handlers");
  tu_wait_count(&g_gate.entered, NWORKERS, "gate handlers to enter");
  /* Every stuck shard is handed off (each gate handler is stuck until the
   * end, so this happens; it is not timed). */
  tu_wait_until(pred_handoffs, rt, "both stuck shards to be handed off");
  for (unsigned i = 0; i < NWORKERS; i++)
    for (unsigned k = 0; k < NBEHIND; k++)
      assert_int_equal(
          weft_post_ex(gated[i], item_run, item_cancel, &g_items[i][k]), 0);

  /* Blocking jobs: the first NRUNNING take the pool threads and get stuck
   * on the gate; the rest wait in the queue. Their done strands: a gated
   * one, a free one, or none. */
  tu_phase("stall_shutdown: blocking jobs");
  for (unsigned i = 0; i < NRUNNING + NQUEUED; i++) {
    bjob *j = &g_jobs[i];
    j->done_strand = i % 3 == 0   ? gated[i % NWORKERS]
                     : i % 3 == 1 ? plain
                                  : NULL;
    j->queued = i >= NRUNNING;
    assert_int_equal(
        weft_blocking(rt, job_work, j, j->done_strand, job_done, NULL), 0);
    if (i == NRUNNING - 1)
      tu_wait_count(&g_work_entered, NRUNNING, "running jobs to start");
  }
  weft_timer *tm;
  assert_int_equal(weft_timer_create(rt, NULL, &tm), 0);
  assert_int_equal(
      weft_timer_start(tm, 3600ull * 1000000000u, 0, timer_fn, NULL), 0);
  /* All pool threads are stuck: the queued jobs have not started. */
  for (unsigned i = NRUNNING; i < NRUNNING + NQUEUED; i++)
    assert_int_equal(atomic_load(&g_jobs[i].started), 0);

  tu_phase("stall_shutdown: NOWAIT shutdown with the gate shut");
  assert_int_equal(weft_rt_shutdown(rt, how | WEFT_SHUTDOWN_NOWAIT), 0);
  tu_assert_rc(weft_rt_wait(rt, 0), -ETIMEDOUT);
  tu_assert_rc(weft_rt_wait(rt, 2000000), -ETIMEDOUT);
  tu_assert_rc(weft_rt_shutdown(rt, how), -EALREADY);
  tu_assert_rc(weft_post(plain, never, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_rt(rt, never, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_blocking(rt, work_never, NULL, NULL, done_never, NULL),
               -ESHUTDOWN);
  tu_assert_rc(weft_rt_wait(rt, 1000000), -ETIMEDOUT);
  /* The stuck handlers were still inside through all of that. */
  assert_int_equal(atomic_load(&g_gate.passed), 0);
  assert_int_equal(atomic_load(&g_jgate.passed), 0);
  for (unsigned i = 0; i < NWORKERS; i++)
    for (unsigned k = 0; k < NBEHIND; k++)
      assert_int_equal(atomic_load(&g_items[i][k].ran), 0);

  /* Open one gate at a time: the shutdown waits for the other. */
  tu_phase("stall_shutdown: opening the handlers' gate");
  tu_gate_open(&g_gate);
  tu_wait_count(&g_gate.passed, NWORKERS, "the stuck handlers to return");
  tu_assert_rc(weft_rt_wait(rt, 1000000), -ETIMEDOUT);
  assert_int_equal(atomic_load(&g_jgate.passed), 0);
  tu_phase("stall_shutdown: opening the jobs' gate");
  tu_gate_open(&g_jgate);
  tu_assert_rc(weft_rt_wait(rt, (uint64_t)TU_WAIT_S * 1000000000u), 0);
  tu_assert_rc(weft_rt_wait(rt, 0), 0); /* still finished */

  /* Finished: every count is final. */
  assert_int_equal(atomic_load(&g_gate.passed), NWORKERS);
  for (unsigned i = 0; i < NWORKERS; i++)
    for (unsigned k = 0; k < NBEHIND; k++) {
      item *it = &g_items[i][k];
      unsigned r = atomic_load(&it->ran), c = atomic_load(&it->cancelled);
      if (r != (cancel ? 0u : 1u) || c != (cancel ? 1u : 0u))
        fail_msg("item %u/%u behind a stuck handler: ran %u, cancelled %u", i,
                 k, r, c);
    }
  for (unsigned i = 0; i < NRUNNING + NQUEUED; i++) {
    bjob *j = &g_jobs[i];
    unsigned started = atomic_load(&j->started);
    unsigned dc = atomic_load(&j->done_calls);
    long got = atomic_load(&j->got);
    long want = 4242 + (long)i;
    if (j->queued && cancel) {
      if (started != 0 || got != -ECANCELED)
        fail_msg("queued job %u at CANCEL: work ran %u times, done got %ld", i,
                 started, got);
    } else if (started != 1 || got != want) {
      fail_msg("job %u (%s): work ran %u times, done got %ld, want %ld", i,
               j->queued ? "queued" : "running", started, got, want);
    }
    if (dc != 1)
      fail_msg("job %u: done called %u times", i, dc);
  }
  assert_int_equal(atomic_load(&g_timer_calls), 1);
  assert_int_equal(atomic_load(&g_timer_status), -ECANCELED);

  weft_stats st;
  tu_stats(rt, &st);
  uint64_t jobs = NRUNNING + NQUEUED;
  uint64_t probe = 1, gates = NWORKERS, behind = NWORKERS * NBEHIND;
  uint64_t all = probe + gates + behind + jobs + 1 /* timer */;
  print_message("stall_shutdown %s: run %" PRIu64 ", cancelled %" PRIu64
                ", handoffs %" PRIu64 ", run after handoff %" PRIu64
                ", blocking_done %" PRIu64 "\n",
                cancel ? "CANCEL" : "DRAIN", st.total.handlers_run,
                st.total.handlers_cancelled, st.total.handoffs,
                st.handlers_run_after_handoff, st.blocking_done);
  if (st.total.handlers_run + st.total.handlers_cancelled != all)
    fail_msg("handlers_run %" PRIu64 " + handlers_cancelled %" PRIu64
             " != %" PRIu64 " accepted",
             st.total.handlers_run, st.total.handlers_cancelled, all);
  if (cancel) {
    /* Only the probe and the gate handlers ran; everything queued at the
     * shutdown (the handlers behind the gates, every job's done, the
     * timer's last call) went through its cancel path. */
    assert_int_equal(st.total.handlers_run, probe + gates);
  } else {
    assert_int_equal(st.total.handlers_cancelled, 0);
  }
  assert_int_equal(st.blocking_done, jobs);
  assert_true(st.total.handoffs >= NWORKERS);
  /* Both gate handlers returned on threads that had lost their shard. */
  assert_true(st.handlers_run_after_handoff >= 1);

  weft_timer_destroy(tm);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g_gate);
  tu_gate_destroy(&g_jgate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_stall_shutdown_drain(void **state) {
  (void)state;
  run_stall_shutdown(WEFT_SHUTDOWN_DRAIN);
}

static void test_stall_shutdown_cancel(void **state) {
  (void)state;
  run_stall_shutdown(WEFT_SHUTDOWN_CANCEL);
}

/* weft_rt_wait on a runtime shut down with nothing stuck, and destroy
 * after a NOWAIT shutdown that was never waited for. */
static void test_wait_plain(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("stall_shutdown: plain wait");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_wait(rt, 0), 0);
  tu_assert_rc(weft_rt_wait(rt, UINT64_MAX), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);

  tu_rt_create(&rt, 2, 0);
  assert_int_equal(
      weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL | WEFT_SHUTDOWN_NOWAIT), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stall_shutdown_drain),
      cmocka_unit_test(test_stall_shutdown_cancel),
      cmocka_unit_test(test_wait_plain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
