/*
 * test_sim_stall - a handler that blocks, under simulation (weft/sim.h,
 * weft_sim_stall and WEFT_SIM_FAULT_STALL; linked with the weft_sim
 * library): the rest of the runtime keeps its pace, and the monitor
 * notices, reports and hands the shard on as it would for real, the same
 * way for every seed.
 *
 * The workload: tickers (periodic timers, each on a strand of its own)
 * whose gaps between firings are the pace, and one or two slow strands
 * whose first handler blocks for SLOW thresholds and whose second, posted
 * with it, must run after it on the same strand.
 */
#include "testutil.h"

#define MS 1000000ull
#define TH MS /* the default stall threshold */
#define PERIOD (TH / 4)
#define TICKERS 4
#define SLOW (8 * TH)
#define RUN (20 * TH)

struct ticker {
  weft_strand *s;
  weft_timer *t;
  uint64_t last, max_gap;
  unsigned n;
};

struct slow {
  weft_strand *s;
  uint64_t ns, began, ended, after_at;
  int r;
  bool strand_kept; /* weft_strand_current was s again after the stall */
};

struct run {
  weft_rt *rt;
  struct ticker tk[TICKERS];
  struct slow sl[2];
  unsigned nslow;
  unsigned stalls, handed;
  weft_stall seen[2];
};

/* The simulation calls it on the thread that drives it: plain fields. */
static void on_stall(const weft_stall *st, void *ctx) {
  struct run *r = ctx;
  if (r->stalls < 2)
    r->seen[r->stalls] = *st;
  r->stalls++;
  r->handed += st->handed_off != 0;
}

static void tick(void *arg, int status, uint64_t missed) {
  struct ticker *k = arg;
  (void)missed;
  if (status)
    return;
  uint64_t now = weft_now_ns();
  if (k->n && now - k->last > k->max_gap)
    k->max_gap = now - k->last;
  k->last = now;
  k->n++;
}

static void slow_fn(void *arg) {
  struct slow *s = arg;
  s->began = weft_now_ns();
  s->r = weft_sim_stall(s->ns);
  s->ended = weft_now_ns();
  s->strand_kept = weft_strand_current() == s->s;
}

/* Four stalls of 0.9 thresholds, or two of 8, in one handler. */
static void pieces_fn(void *arg) {
  struct slow *s = arg;
  unsigned n = s->ns < TH ? 4 : 2;
  s->began = weft_now_ns();
  for (unsigned i = 0; i < n && s->r != -1; i++)
    s->r = weft_sim_stall(s->ns);
  s->ended = weft_now_ns();
  s->strand_kept = weft_strand_current() == s->s;
}

static void after_fn(void *arg) {
  struct slow *s = arg;
  s->after_at = weft_now_ns();
}

/* One run of RUN virtual ns; cfg's other fields as given. */
static void run_one(struct run *r, weft_config *cfg, unsigned nslow,
                    uint64_t ns) {
  memset(r, 0, sizeof(*r));
  cfg->on_stall = on_stall;
  cfg->on_stall_ctx = r;
  assert_int_equal(weft_rt_create(&r->rt, cfg), 0);
  for (unsigned i = 0; i < TICKERS; i++) {
    struct ticker *k = &r->tk[i];
    assert_int_equal(weft_strand_create(r->rt, &k->s), 0);
    assert_int_equal(weft_timer_create(r->rt, k->s, &k->t), 0);
    assert_int_equal(weft_timer_start(k->t, PERIOD, PERIOD, tick, k), 0);
  }
  r->nslow = nslow;
  for (unsigned i = 0; i < nslow; i++) {
    struct slow *s = &r->sl[i];
    s->ns = ns;
    s->r = 1;
    assert_int_equal(weft_strand_create(r->rt, &s->s), 0);
    assert_int_equal(weft_post(s->s, slow_fn, s), 0);
    assert_int_equal(weft_post(s->s, after_fn, s), 0);
  }
  assert_int_equal(weft_rt_wait(r->rt, RUN), -ETIMEDOUT);
  for (unsigned i = 0; i < nslow; i++) {
    struct slow *s = &r->sl[i];
    assert_int_equal(s->r, 0);
    assert_true(s->ended - s->began >= ns);
    assert_true(s->strand_kept);
    assert_true(s->after_at >= s->ended); /* the strand's order kept */
  }
}

static void run_end(struct run *r, weft_stats *st, uint64_t *hash) {
  assert_int_equal(weft_rt_stats(r->rt, st), 0);
  assert_int_equal(st->total.stalls, r->stalls); /* each reported once */
  weft_sim_info si;
  assert_int_equal(weft_rt_sim_info(r->rt, &si), 0);
  if (hash)
    *hash = si.log_hash;
  for (unsigned i = 0; i < TICKERS; i++) {
    weft_timer_destroy(r->tk[i].t);
    weft_strand_release(r->tk[i].s);
  }
  for (unsigned i = 0; i < r->nslow; i++)
    weft_strand_release(r->sl[i].s);
  assert_int_equal(weft_rt_destroy(r->rt), 0);
}

static void sim_config(weft_config *cfg, uint64_t seed, unsigned workers) {
  weft_config_init(cfg);
  cfg->sim_seed = seed;
  cfg->workers = workers;
}

/* One handler blocks for 8 thresholds: the monitor notices it between 1
 * and 1.5 thresholds in, reports it once and hands its shard to a spare;
 * every ticker, those whose timers live on that shard included, keeps
 * its pace meanwhile; the slow strand's next handler runs after it. */
static void test_one_stall_handed_off(void **state) {
  (void)state;
  struct run r;
  unsigned seeds = (unsigned)TU_SCALED(100, 10);
  for (unsigned i = 0; i < seeds; i++) {
    weft_config cfg;
    sim_config(&cfg, 100 + i, 2);
    run_one(&r, &cfg, 1, SLOW);
    assert_int_equal(r.stalls, 1);
    assert_int_equal(r.handed, 1);
    assert_ptr_equal(r.seen[0].handler, (void *)slow_fn);
    assert_ptr_equal(r.seen[0].strand, r.sl[0].s);
    assert_true(r.seen[0].running_ns >= TH);
    assert_true(r.seen[0].running_ns <= TH + TH / 2 + TH / 10);
    assert_null(r.seen[0].frames);
    for (unsigned k = 0; k < TICKERS; k++) {
      assert_true(r.tk[k].n >= RUN / PERIOD / 2);
      assert_true(r.tk[k].max_gap < PERIOD + 2 * TH);
    }
    weft_stats st;
    run_end(&r, &st, NULL);
    assert_int_equal(st.total.stalls, 1);
    assert_int_equal(st.total.handoffs, 1);
    assert_true(st.handlers_run_after_handoff >= 1);
  }
  printf("# one stall of 8 thresholds: %u seeds, reported and handed off "
         "once each, every ticker kept its pace\n",
         seeds);
}

/* A handler that stalls several times is one stall to the monitor,
 * timed from the handler's start: four stalls of 0.9 thresholds are
 * noticed as one of 3.6, two of 8 are reported and handed off once, and
 * the shutdown then finishes (a second handoff of the same shard would
 * leave a count behind, and the shutdown would never end). */
static void test_stalls_in_one_handler(void **state) {
  (void)state;
  unsigned seeds = (unsigned)TU_SCALED(50, 10);
  for (unsigned i = 0; i < 2 * seeds; i++) {
    struct run r;
    memset(&r, 0, sizeof(r));
    weft_config cfg;
    sim_config(&cfg, 150 + i, 2);
    cfg.on_stall = on_stall;
    cfg.on_stall_ctx = &r;
    assert_int_equal(weft_rt_create(&r.rt, &cfg), 0);
    struct slow *s = &r.sl[0];
    s->ns = i < seeds ? TH * 9 / 10 : SLOW;
    assert_int_equal(weft_strand_create(r.rt, &s->s), 0);
    assert_int_equal(weft_post(s->s, pieces_fn, s), 0);
    assert_int_equal(weft_post(s->s, after_fn, s), 0);
    assert_int_equal(weft_rt_shutdown(r.rt, 0), 0);
    assert_int_equal(s->r, 0);
    assert_true(s->after_at >= s->ended);
    assert_int_equal(r.stalls, 1);
    assert_int_equal(r.handed, 1);
    assert_true(r.seen[0].running_ns >= TH);
    weft_stats st;
    assert_int_equal(weft_rt_stats(r.rt, &st), 0);
    assert_int_equal(st.total.stalls, 1);
    assert_int_equal(st.total.handoffs, 1);
    weft_strand_release(s->s);
    assert_int_equal(weft_rt_destroy(r.rt), 0);
  }
}

/* Every worker stuck at once: both shards go to spares and the tickers
 * keep their pace. Without spares (max_threads = workers) both stalls are
 * reported unhanded, once they have run 4 thresholds, and their strands'
 * order is kept all the same. */
static void test_every_worker_stuck(void **state) {
  (void)state;
  struct run r;
  unsigned seeds = (unsigned)TU_SCALED(100, 10);
  for (unsigned i = 0; i < seeds; i++) {
    weft_config cfg;
    sim_config(&cfg, 200 + i, 2);
    run_one(&r, &cfg, 2, SLOW);
    assert_int_equal(r.stalls, 2);
    assert_int_equal(r.handed, 2);
    for (unsigned k = 0; k < TICKERS; k++)
      assert_true(r.tk[k].max_gap < PERIOD + 2 * TH);
    weft_stats st;
    run_end(&r, &st, NULL);
    assert_int_equal(st.total.handoffs, 2);

    sim_config(&cfg, 200 + i, 2);
    cfg.max_threads = 2;
    run_one(&r, &cfg, 2, SLOW);
    assert_int_equal(r.stalls, 2);
    assert_int_equal(r.handed, 0);
    for (unsigned k = 0; k < 2; k++)
      assert_true(r.seen[k].running_ns >= 4 * TH);
    run_end(&r, &st, NULL);
    assert_int_equal(st.total.stalls, 2);
    assert_int_equal(st.total.handoffs, 0);
  }
}

/* A stall shorter than the threshold is never reported; with the monitor
 * off (WEFT_CONFIG_NO_MONITOR) a long one is not either, and the shard
 * stays with its thread. */
static void test_unnoticed(void **state) {
  (void)state;
  struct run r;
  weft_stats st;
  for (unsigned i = 0; i < 20; i++) {
    weft_config cfg;
    sim_config(&cfg, 300 + i, 2);
    run_one(&r, &cfg, 1, TH / 2);
    assert_int_equal(r.stalls, 0);
    run_end(&r, &st, NULL);
    assert_int_equal(st.total.handoffs, 0);

    sim_config(&cfg, 300 + i, 2);
    cfg.flags |= WEFT_CONFIG_NO_MONITOR;
    run_one(&r, &cfg, 1, SLOW);
    assert_int_equal(r.stalls, 0);
    run_end(&r, &st, NULL);
    assert_int_equal(st.total.stalls + st.total.handoffs, 0);
  }
}

/* Stalls replay with the seed, monitor and handoffs included; other
 * seeds interleave them otherwise. */
static void test_replay(void **state) {
  (void)state;
  struct run r;
  weft_stats st;
  uint64_t h[4];
  for (unsigned i = 0; i < 4; i++) {
    weft_config cfg;
    sim_config(&cfg, i < 2 ? 7 : 8 + i, 2);
    run_one(&r, &cfg, 2, SLOW);
    run_end(&r, &st, &h[i]);
  }
  assert_int_equal(h[0], h[1]);
  assert_int_not_equal(h[0], h[2]);
  assert_int_not_equal(h[2], h[3]);
}

/* Drawn stalls (WEFT_SIM_FAULT_STALL), nested and overlapping: every
 * ticker fires on, the reports and the counts agree, some shards are
 * handed on, and each run ends cleanly. */
static void test_drawn_stalls(void **state) {
  (void)state;
  struct run r;
  weft_stats st;
  uint64_t stalls = 0, handoffs = 0;
  unsigned seeds = (unsigned)TU_SCALED(1000, 50);
  for (unsigned i = 0; i < seeds; i++) {
    weft_config cfg;
    sim_config(&cfg, 400 + i, 1 + i % 4);
    cfg.sim_faults = WEFT_SIM_FAULT_STALL;
    cfg.sim_fault_odds = 8;
    run_one(&r, &cfg, 0, 0);
    for (unsigned k = 0; k < TICKERS; k++)
      assert_true(r.tk[k].n > 0);
    stalls += r.stalls; /* before the shutdown's, which may stall too */
    run_end(&r, &st, NULL);
    handoffs += st.total.handoffs;
  }
  printf("# drawn stalls: %u seeds, %" PRIu64 " reported, %" PRIu64
         " handed off\n",
         seeds, stalls, handoffs);
  assert_true(handoffs > 0);
}

static long job_stall(void *arg) {
  (void)arg;
  return weft_sim_stall(MS);
}

static long g_job;
static void job_done(void *arg, long result) {
  (void)arg;
  g_job = result;
}

static int g_real_rc = 1;
static void real_handler(void *arg) {
  (void)arg;
  g_real_rc = weft_sim_stall(MS);
}

/* Only a handler on a shard can block: main and a blocking job get
 * -EPERM; with no simulation alive, -ENOTSUP, in a real runtime's
 * handler too. */
static void test_refused(void **state) {
  (void)state;
  assert_int_equal(weft_sim_stall(MS), -ENOTSUP);
  weft_rt *real;
  weft_config rc;
  weft_config_init(&rc);
  rc.workers = 1;
  assert_int_equal(weft_rt_create(&real, &rc), 0);
  assert_int_equal(weft_post_rt(real, real_handler, NULL), 0);
  assert_int_equal(weft_rt_shutdown(real, 0), 0);
  assert_int_equal(weft_rt_destroy(real), 0);
  assert_int_equal(g_real_rc, -ENOTSUP);
  weft_config cfg;
  sim_config(&cfg, 5, 2);
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  assert_int_equal(weft_sim_stall(MS), -EPERM);
  assert_int_equal(weft_sim_stall(0), -EPERM);
  g_job = 1;
  assert_int_equal(weft_blocking(rt, job_stall, NULL, NULL, job_done, NULL), 0);
  assert_int_equal(weft_rt_shutdown(rt, 0), 0);
  assert_int_equal(g_job, -EPERM);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(weft_sim_stall(MS), -ENOTSUP);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_stall_handed_off),
      cmocka_unit_test(test_stalls_in_one_handler),
      cmocka_unit_test(test_every_worker_stuck),
      cmocka_unit_test(test_unnoticed),
      cmocka_unit_test(test_replay),
      cmocka_unit_test(test_drawn_stalls),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
