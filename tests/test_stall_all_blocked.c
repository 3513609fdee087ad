/*
 * test_stall_all_blocked: a handler that runs long delays only its own
 * strand, even when EVERY worker is stuck in one.
 *
 * With workers=2 and workers=4 (stall threshold 50 us): one gate handler per
 * worker, each on its own strand, blocks until the test opens the gate.
 * While all of them are provably still inside (entered == workers, passed
 * == 0, checked again after the work is done):
 *   - 100 other strands each run a chain of 100 handlers (the first posted
 *     from outside, each posting the next from inside), in order;
 *   - 50 timers of 1-5 ms fire (half on strands, half on any worker);
 *   - every stuck shard is handed off (stats.handoffs >= workers) and the
 *     runtime runs more threads than workers.
 * Then the gate opens: the stuck handlers return and everything is
 * accounted exactly once (per-handler counters and stats.handlers_run after
 * a DRAIN shutdown). Nothing here measures time.
 */
#include "testutil.h"

#define NCHAINS 100
#define DEPTH 100
#define NTIMERS 50

typedef struct chain {
  weft_strand *s;
  atomic_uint next; /* index the next handler expects */
  atomic_uint ran[DEPTH];
  atomic_int inside;
} chain;

typedef struct ttimer {
  weft_timer *t;
  weft_strand *s; /* NULL: any worker */
  atomic_uint fired;
  atomic_uint bad_status;
} ttimer;

typedef struct link_arg {
  chain *c;
  unsigned idx;
} link_arg;

static chain g_chains[NCHAINS];
static link_arg g_links[NCHAINS][DEPTH];
static ttimer g_timers[NTIMERS];
static tu_count g_chain_done, g_timer_done, g_stall_reports;
static tu_gate g_gate;

static weft_strand *g_gated[8];
static atomic_uint g_gate_reports[8];
static unsigned g_workers;

/* On the monitor thread: count the reports naming a gate handler. */
static void on_stall(const weft_stall *st, void *ctx) {
  (void)ctx;
  atomic_fetch_add(&g_stall_reports, 1);
  if (st->handler != (void *)tu_gate_handler)
    return;
  for (unsigned i = 0; i < g_workers; i++)
    if (st->strand == g_gated[i])
      atomic_fetch_add(&g_gate_reports[i], 1);
}

static bool pred_gates_reported(void *ctx, char *buf, size_t len) {
  (void)ctx;
  unsigned n = 0;
  for (unsigned i = 0; i < g_workers; i++)
    n += atomic_load(&g_gate_reports[i]) > 0;
  snprintf(buf, len, "%u of %u gate handlers reported", n, g_workers);
  return n == g_workers;
}

static void chain_link(void *arg) {
  link_arg *a = arg;
  chain *c = a->c;
  TU_CHECKF(atomic_fetch_add(&c->inside, 1) == 0,
            "two handlers of one strand at once");
  TU_CHECK(weft_strand_current() == c->s);
  unsigned want = atomic_load(&c->next);
  TU_CHECKF(want == a->idx, "chain handler %u ran when %u was expected", a->idx,
            want);
  atomic_store(&c->next, a->idx + 1);
  atomic_fetch_add(&c->ran[a->idx], 1);
  if (a->idx + 1 < DEPTH) {
    int rc = weft_post(c->s, chain_link, &g_links[c - g_chains][a->idx + 1]);
    TU_CHECKF(rc == 0, "posting the next link failed: %d", rc);
  }
  atomic_fetch_sub(&c->inside, 1);
  atomic_fetch_add(&g_chain_done, 1);
}

static void timer_fn(void *arg, int status, uint64_t missed) {
  ttimer *t = arg;
  (void)missed;
  if (status != 0)
    atomic_fetch_add(&t->bad_status, 1);
  if (t->s)
    TU_CHECK(weft_strand_current() == t->s);
  atomic_fetch_add(&t->fired, 1);
  atomic_fetch_add(&g_timer_done, 1);
}

typedef struct stat_ge {
  weft_rt *rt;
  uint64_t handoffs;
} stat_ge;

static bool pred_handoffs(void *ctx, char *buf, size_t len) {
  stat_ge *w = ctx;
  weft_stats st;
  if (weft_rt_stats(w->rt, &st) != 0)
    return false;
  snprintf(buf, len,
           "handoffs %" PRIu64 ", threads %u, want handoffs >= %" PRIu64,
           st.total.handoffs, st.threads, w->handoffs);
  return st.total.handoffs >= w->handoffs;
}

static void run_all_blocked(unsigned workers) {
  tu_reset_async_errors();
  tu_phase("all_blocked: setup");
  memset(g_chains, 0, sizeof g_chains);
  memset(g_timers, 0, sizeof g_timers);
  atomic_store(&g_chain_done, 0);
  atomic_store(&g_timer_done, 0);
  atomic_store(&g_stall_reports, 0);
  tu_gate_init(&g_gate);

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = workers;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = on_stall;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);

  assert_true(workers <= 8);
  g_workers = workers;
  for (unsigned i = 0; i < workers; i++) {
    atomic_store(&g_gate_reports[i], 0);
    tu_strand_create(rt, &g_gated[i]);
  }
  for (unsigned i = 0; i < workers; i++)
    assert_int_equal(weft_post(g_gated[i], tu_gate_handler, &g_gate), 0);
  tu_phase("all_blocked: waiting for every gate handler to be inside");
  tu_wait_count(&g_gate.entered, workers, "gate handlers to enter");

  /* Every worker's worth of handlers is stuck now. */
  tu_phase("all_blocked: chains and timers while stuck");
  for (unsigned i = 0; i < NCHAINS; i++) {
    chain *c = &g_chains[i];
    tu_strand_create(rt, &c->s);
    for (unsigned k = 0; k < DEPTH; k++)
      g_links[i][k] = (link_arg){c, k};
  }
  for (unsigned i = 0; i < NTIMERS; i++) {
    ttimer *t = &g_timers[i];
    t->s = (i % 2) ? g_chains[i].s : NULL;
    assert_int_equal(weft_timer_create(rt, t->s, &t->t), 0);
  }
  for (unsigned i = 0; i < NCHAINS; i++)
    assert_int_equal(weft_post(g_chains[i].s, chain_link, &g_links[i][0]), 0);
  for (unsigned i = 0; i < NTIMERS; i++) {
    ttimer *t = &g_timers[i];
    uint64_t after = (1 + i % 5) * 1000000ull;
    assert_int_equal(weft_timer_start(t->t, after, 0, timer_fn, t), 0);
  }

  tu_wait_count(&g_chain_done, (uint64_t)NCHAINS * DEPTH,
                "chain handlers while every gate handler is stuck");
  tu_wait_count(&g_timer_done, NTIMERS,
                "timers while every gate handler is stuck");
  /* Each stuck gate handler is reported (once, checked below), naming its
   * handler and strand; and the stuck shards are handed off. */
  tu_wait_until(pred_gates_reported, NULL, "a stall report per gate handler");
  stat_ge w = {rt, workers};
  tu_wait_until(pred_handoffs, &w, "every stuck shard to be handed off");

  weft_stats st;
  tu_stats(rt, &st);
  /* The gate handlers are provably still inside: none has passed. */
  assert_int_equal(atomic_load(&g_gate.passed), 0);
  assert_int_equal(atomic_load(&g_gate.entered), workers);
  if (!(st.threads > workers))
    fail_msg("stats.threads %u, expected more than the %u workers (all of "
             "which are stuck)",
             st.threads, workers);
  if (st.total.handoffs < workers)
    fail_msg("stats.handoffs %" PRIu64 " < workers %u", st.total.handoffs,
             workers);
  if (st.total.stalls < workers)
    fail_msg("stats.stalls %" PRIu64 " < workers %u", st.total.stalls, workers);
  if (atomic_load(&g_stall_reports) < workers)
    fail_msg("%" PRIu64 " stall reports < workers %u",
             (uint64_t)atomic_load(&g_stall_reports), workers);

  tu_phase("all_blocked: opening the gate");
  tu_gate_open(&g_gate);
  tu_wait_count(&g_gate.passed, workers, "gate handlers to return");
  for (unsigned i = 0; i < NTIMERS; i++)
    weft_timer_destroy(g_timers[i].t);

  tu_phase("all_blocked: shutdown");
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_stats(rt, &st);
  assert_int_equal(atomic_load(&g_gate.passed), workers);
  for (unsigned i = 0; i < NCHAINS; i++) {
    chain *c = &g_chains[i];
    for (unsigned k = 0; k < DEPTH; k++) {
      unsigned r = atomic_load(&c->ran[k]);
      if (r != 1)
        fail_msg("chain %u handler %u ran %u times", i, k, r);
    }
  }
  for (unsigned i = 0; i < NTIMERS; i++) {
    ttimer *t = &g_timers[i];
    if (atomic_load(&t->fired) != 1 || atomic_load(&t->bad_status) != 0)
      fail_msg("timer %u fired %u times (%u with a nonzero status)", i,
               atomic_load(&t->fired), atomic_load(&t->bad_status));
  }
  uint64_t want = workers + (uint64_t)NCHAINS * DEPTH + NTIMERS;
  if (st.total.handlers_run != want || st.total.handlers_cancelled != 0)
    fail_msg("stats.handlers_run %" PRIu64 " (cancelled %" PRIu64
             "), expected %" PRIu64 " (gates + chains + timer firings)",
             st.total.handlers_run, st.total.handlers_cancelled, want);
  /* The chains ran while every gate handler was stuck, so at least one
   * of those threads had lost its shard (only shard holders run handlers). */
  if (st.handlers_run_after_handoff < 1)
    fail_msg("handlers_run_after_handoff is 0, but a gate handler must "
             "have returned on a thread that had lost its shard");
  for (unsigned i = 0; i < workers; i++)
    if (atomic_load(&g_gate_reports[i]) != 1)
      fail_msg("gate handler %u was reported %u times, expected once", i,
               atomic_load(&g_gate_reports[i]));
  /* Per-shard counters add up to the total minus the orphans. */
  uint64_t sum = 0, hsum = 0;
  for (unsigned i = 0; i < workers; i++) {
    weft_shard_stats ss;
    assert_int_equal(weft_rt_shard_stats(rt, i, &ss), 0);
    sum += ss.handlers_run;
    hsum += ss.handoffs;
  }
  assert_int_equal(sum + st.handlers_run_after_handoff, st.total.handlers_run);
  assert_int_equal(hsum, st.total.handoffs);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g_gate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_all_blocked_2(void **state) {
  (void)state;
  run_all_blocked(2);
}

static void test_all_blocked_4(void **state) {
  (void)state;
  run_all_blocked(4);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_blocked_2),
      cmocka_unit_test(test_all_blocked_4),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
