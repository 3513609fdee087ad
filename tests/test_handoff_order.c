/*
 * test_handoff_order: strands keep their promises across handoffs.
 *
 * workers=2, 16 strands, stall threshold 50 us. Handlers sleep 100-300 us
 * with some probability (longer than the threshold, so the monitor hands
 * their shard to a spare while they sleep, and they return on a thread that
 * has lost it), and each posts a follow-up message to its own strand or to
 * another one, before or after its sleep (so also from a thread that has
 * lost its shard). Two threads outside the runtime post too. Checked:
 *   - never two handlers of one strand at once (an atomic inside flag; and
 *     the per-strand bookkeeping is plain memory touched only by that
 *     strand's handlers, so ThreadSanitizer checks the serialisation too);
 *   - weft_strand_current() is the strand, before and after the sleep;
 *   - FIFO per (poster, strand): a poster is an outside thread or a strand
 *     (a strand's handlers are serialised, so its posts are ordered), and
 *     each message carries its poster's per-destination sequence number,
 *     which must arrive consecutively;
 *   - every message is handled exactly once, and stats.handlers_run agrees;
 *   - stats.handoffs grew (more than a small number; not an exact count),
 *     and stats.stalls >= stats.handoffs.
 * The number of sleeping handlers is 10^4 divided by WEFT_TEST_SCALE.
 */
#include "testutil.h"

#define NSTRANDS 16
#define NEXT 2 /* outside posters */
#define NPOSTERS (NSTRANDS + NEXT)
#define TTL 3 /* follow-ups per outside message */

typedef struct msg {
  unsigned dest;
  unsigned poster;
  uint64_t seq;
  unsigned ttl;
  atomic_uint ran;
} msg;

/* Touched only by the strand's own handlers: plain memory on purpose. */
typedef struct sstate {
  weft_strand *s;
  atomic_int inside;
  uint64_t last_seq[NPOSTERS]; /* last sequence received from each poster */
  uint64_t out_seq[NSTRANDS];  /* last sequence this strand sent to each */
  uint64_t rng;
  uint64_t handled;
} sstate;

static weft_rt *g_rt;
static sstate g_st[NSTRANDS];
static msg *g_msgs;
static uint64_t g_nmsgs;
static atomic_uint_fast64_t g_next_msg;
static tu_count g_done, g_sleeps, g_reports, g_post_after_sleep;
static uint64_t g_sleep_per_mille = 250;

static void on_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  atomic_fetch_add(&g_reports, 1);
}

/* On the monitor thread, which counts a stall in the stats and then
 * reports it: so at each report the count is the reports so far. (The
 * count the test reads after the shutdown may miss a stall that a scan
 * handed off just before the shutdown ended and counts just after.) */
static void on_stall_counted(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  uint64_t n = atomic_fetch_add(&g_reports, 1) + 1;
  weft_stats s;
  TU_CHECK(weft_rt_stats(g_rt, &s) == 0);
  TU_CHECKF(s.total.stalls == n,
            "report %" PRIu64 " with stats.stalls %" PRIu64, n, s.total.stalls);
}

static void handle(void *arg);

static msg *msg_new(void) {
  uint64_t i = atomic_fetch_add(&g_next_msg, 1);
  if (i >= g_nmsgs) {
    tu_async_fail(__FILE__, __LINE__, "more messages than planned");
    return NULL;
  }
  return &g_msgs[i];
}

/* From a handler of strand `from`: a follow-up to a random strand. */
static void post_follow_up(sstate *me, unsigned from, unsigned ttl) {
  msg *m = msg_new();
  if (!m)
    return;
  unsigned dest = (unsigned)(tu_rand(&me->rng) % NSTRANDS);
  if (tu_rand(&me->rng) % 4 == 0)
    dest = from; /* often its own strand */
  m->dest = dest;
  m->poster = from;
  m->seq = ++me->out_seq[dest];
  m->ttl = ttl;
  int rc = weft_post(g_st[dest].s, handle, m);
  TU_CHECKF(rc == 0, "post from a handler failed: %d (%s)", rc,
            weft_strerror(rc));
}

static void sleep_us(unsigned us) {
  struct timespec ts = {0, (long)us * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void handle(void *arg) {
  msg *m = arg;
  sstate *me = &g_st[m->dest];
  TU_CHECKF(atomic_fetch_add(&me->inside, 1) == 0,
            "strand %u: two handlers at once", m->dest);
  TU_CHECK(weft_strand_current() == me->s);
  TU_CHECKF(m->seq == me->last_seq[m->poster] + 1,
            "strand %u: from poster %u got seq %" PRIu64 " after %" PRIu64,
            m->dest, m->poster, m->seq, me->last_seq[m->poster]);
  me->last_seq[m->poster] = m->seq;
  me->handled++;
  TU_CHECKF(atomic_fetch_add(&m->ran, 1) == 0, "a message ran twice");

  bool sleeps = tu_rand(&me->rng) % 1000 < g_sleep_per_mille;
  bool post_before = tu_rand(&me->rng) % 2 == 0;
  if (m->ttl && (!sleeps || post_before))
    post_follow_up(me, m->dest, m->ttl - 1);
  if (sleeps) {
    atomic_fetch_add(&g_sleeps, 1);
    sleep_us(100 + (unsigned)(tu_rand(&me->rng) % 201));
    /* Most likely on a thread that has lost its shard by now. */
    TU_CHECK(weft_strand_current() == me->s);
    TU_CHECK(weft_rt_current() == g_rt);
    if (m->ttl && !post_before) {
      post_follow_up(me, m->dest, m->ttl - 1);
      atomic_fetch_add(&g_post_after_sleep, 1);
    }
  }
  atomic_fetch_sub(&me->inside, 1);
  atomic_fetch_add(&g_done, 1);
}

typedef struct ext_arg {
  unsigned id; /* poster id: NSTRANDS + i */
  uint64_t n;
  tu_barrier *start;
} ext_arg;

static void *ext_main(void *p) {
  ext_arg *a = p;
  uint64_t seq[NSTRANDS] = {0};
  uint64_t rng = 0x5eed0000u + a->id;
  tu_barrier_wait(a->start);
  for (uint64_t i = 0; i < a->n; i++) {
    msg *m = msg_new();
    if (!m)
      return NULL;
    unsigned dest = (unsigned)(tu_rand(&rng) % NSTRANDS);
    m->dest = dest;
    m->poster = a->id;
    m->seq = ++seq[dest];
    m->ttl = TTL;
    int rc = weft_post(g_st[dest].s, handle, m);
    if (rc != 0) {
      TU_CHECKF(false, "outside post failed: %d (%s)", rc, weft_strerror(rc));
      return NULL;
    }
    if (i % 64 == 63)
      sleep_us(50); /* spread the posts over the run */
  }
  return NULL;
}

static void test_handoff_order(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("handoff_order: setup");
  /* Outside messages; each makes TTL follow-ups: (1 + TTL) handlers, of
   * which about a quarter sleep: about 10^4 sleeping handlers unscaled. */
  uint64_t sleeps_wanted = TU_SCALED(10000, 300);
  uint64_t per_ext =
      sleeps_wanted * 1000 / g_sleep_per_mille / (1 + TTL) / NEXT;
  g_nmsgs = per_ext * NEXT * (1 + TTL);
  g_msgs = calloc(g_nmsgs, sizeof *g_msgs);
  assert_non_null(g_msgs);
  atomic_store(&g_next_msg, 0);
  atomic_store(&g_done, 0);
  atomic_store(&g_sleeps, 0);
  atomic_store(&g_reports, 0);
  atomic_store(&g_post_after_sleep, 0);

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 50000;
  cfg.max_threads = 24; /* room for a spare per sleeping strand */
  cfg.on_stall = on_stall_counted;
  assert_int_equal(weft_rt_create(&g_rt, &cfg), 0);
  memset(g_st, 0, sizeof g_st);
  for (unsigned i = 0; i < NSTRANDS; i++) {
    tu_strand_create(g_rt, &g_st[i].s);
    g_st[i].rng = 0xabcdef00u + i;
  }

  tu_phase("handoff_order: posting and running");
  tu_barrier start;
  tu_barrier_init(&start, NEXT);
  pthread_t th[NEXT];
  ext_arg ea[NEXT];
  for (unsigned i = 0; i < NEXT; i++) {
    ea[i] = (ext_arg){NSTRANDS + i, per_ext, &start};
    tu_thread_start(&th[i], ext_main, &ea[i]);
  }
  for (unsigned i = 0; i < NEXT; i++)
    tu_thread_join(th[i], "outside poster");
  tu_wait_count(&g_done, g_nmsgs, "every message to be handled");

  tu_phase("handoff_order: shutdown");
  assert_int_equal(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(g_rt, &st);

  assert_int_equal(atomic_load(&g_next_msg), g_nmsgs);
  for (uint64_t i = 0; i < g_nmsgs; i++)
    if (atomic_load(&g_msgs[i].ran) != 1)
      fail_msg("message %" PRIu64 " ran %u times", i,
               atomic_load(&g_msgs[i].ran));
  /* Every sequence a poster sent arrived: the last ones match. */
  uint64_t handled = 0;
  for (unsigned d = 0; d < NSTRANDS; d++) {
    handled += g_st[d].handled;
    for (unsigned p = 0; p < NSTRANDS; p++)
      if (g_st[p].out_seq[d] != g_st[d].last_seq[p])
        fail_msg("strand %u sent %" PRIu64 " to strand %u, which got %" PRIu64,
                 p, g_st[p].out_seq[d], d, g_st[d].last_seq[p]);
  }
  assert_int_equal(handled, g_nmsgs);
  if (st.total.handlers_run != g_nmsgs)
    fail_msg("stats.handlers_run %" PRIu64 ", expected %" PRIu64,
             st.total.handlers_run, g_nmsgs);

  uint64_t sleeps = atomic_load(&g_sleeps);
  print_message("handoff_order: %" PRIu64 " handlers, %" PRIu64
                " slept, %" PRIu64 " posted after sleeping; handoffs %" PRIu64
                ", stalls %" PRIu64 ", run after handoff %" PRIu64
                ", threads %u\n",
                g_nmsgs, sleeps, (uint64_t)atomic_load(&g_post_after_sleep),
                st.total.handoffs, st.total.stalls,
                st.handlers_run_after_handoff, st.threads);
  uint64_t min_handoffs = 10;
  if (st.total.handoffs < min_handoffs)
    fail_msg("only %" PRIu64 " handoffs for %" PRIu64
             " handlers that slept past the threshold",
             st.total.handoffs, sleeps);
  if (st.total.stalls < st.total.handoffs)
    fail_msg("stats.stalls %" PRIu64 " < stats.handoffs %" PRIu64,
             st.total.stalls, st.total.handoffs);
  if (st.handlers_run_after_handoff < 1)
    fail_msg("no handler returned on a thread that had lost its shard");
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  if (atomic_load(&g_reports) < st.total.stalls)
    fail_msg("%" PRIu64 " on_stall reports, stats.stalls %" PRIu64,
             (uint64_t)atomic_load(&g_reports), st.total.stalls);
  free(g_msgs);
  tu_barrier_destroy(&start);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------- what counts as "after handoff"
 * A handoff leaves exactly one handler to finish on the thread that lost
 * the shard: the one it was stuck in. weft.h: handlers_run_after_handoff
 * counts "handlers that a thread finished after the monitor had handed its
 * shard to another thread"; handlers that finished before the handoff, even
 * in the same strand turn, belong to the shard's counters. So
 * 1 <= handlers_run_after_handoff <= handoffs here, and the shard's
 * handlers_run plus it is the total. One strand turn: a starter posts 10
 * quick handlers and a gate handler to its own strand; the gate handler is
 * stuck until its shard has been handed off. */
static weft_strand *g_turn_strand;
static tu_gate g_turn_gate;
static tu_count g_quick;

static void quick(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_quick, 1);
}

static void starter(void *arg) {
  (void)arg;
  for (unsigned i = 0; i < 10; i++)
    TU_CHECK(weft_post(g_turn_strand, quick, NULL) == 0);
  TU_CHECK(weft_post(g_turn_strand, tu_gate_handler, &g_turn_gate) == 0);
}

static bool pred_handoff(void *ctx, char *buf, size_t len) {
  weft_stats st;
  if (weft_rt_stats(ctx, &st) != 0)
    return false;
  snprintf(buf, len, "handoffs %" PRIu64, st.total.handoffs);
  return st.total.handoffs >= 1;
}

static void test_after_handoff_counts(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("after_handoff_counts");
  tu_gate_init(&g_turn_gate);
  atomic_store(&g_quick, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = on_stall;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  tu_strand_create(rt, &g_turn_strand);
  assert_int_equal(weft_post(g_turn_strand, starter, NULL), 0);
  tu_wait_count(&g_turn_gate.entered, 1, "the gate handler");
  tu_wait_until(pred_handoff, rt, "the stuck shard to be handed off");
  tu_gate_open(&g_turn_gate);
  tu_wait_count(&g_turn_gate.passed, 1, "the gate handler to return");
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  weft_shard_stats sh;
  tu_stats(rt, &st);
  assert_int_equal(weft_rt_shard_stats(rt, 0, &sh), 0);
  /* Destroyed before the checks, so that a failure leaks no thread. */
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_quick), 10);
  print_message("after_handoff_counts: handlers_run %" PRIu64
                ", after handoff %" PRIu64 ", shard 0 %" PRIu64
                ", handoffs %" PRIu64 "\n",
                st.total.handlers_run, st.handlers_run_after_handoff,
                sh.handlers_run, st.total.handoffs);
  assert_int_equal(st.total.handlers_run, 12);
  assert_int_equal(sh.handlers_run + st.handlers_run_after_handoff, 12);
  assert_true(st.handlers_run_after_handoff >= 1);
  if (st.handlers_run_after_handoff > st.total.handoffs)
    fail_msg("handlers_run_after_handoff %" PRIu64 " > handoffs %" PRIu64
             ": handlers that finished before the handoff were counted as "
             "after it (and are missing from the shard's handlers_run)",
             st.handlers_run_after_handoff, st.total.handoffs);
  tu_gate_destroy(&g_turn_gate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------ release and timers after it
 * Handlers that sleep past the threshold and then, on a thread that has
 * most likely lost its shard, arm a timer on their strand and post a
 * follow-up to it; whichever of the two runs second sleeps past the
 * threshold too and then releases its own strand. Every strand is
 * reclaimed (stats.strands_live back to 0), every follow-up ran once and
 * every timer fired once, on its strand. */
#define NREL 48
typedef struct rel {
  weft_strand *s;
  weft_timer *t;
  atomic_uint first, follow, fired, second;
} rel;

static void rel_maybe_release(rel *r) {
  if (atomic_fetch_add(&r->second, 1) == 1) {
    sleep_us(200);
    weft_timer_destroy(r->t);  /* a strand outlives its timers (weft.h) */
    weft_strand_release(r->s); /* from its own handler */
  }
}
static rel g_rel[NREL];
static tu_count g_rel_done;

static void rel_follow(void *arg) {
  rel *r = arg;
  TU_CHECK(weft_strand_current() == r->s);
  TU_CHECK(atomic_fetch_add(&r->follow, 1) == 0);
  rel_maybe_release(r);
  atomic_fetch_add(&g_rel_done, 1);
}

static void rel_timer(void *arg, int status, uint64_t missed) {
  rel *r = arg;
  (void)missed;
  TU_CHECK(status == 0);
  TU_CHECK(weft_strand_current() == r->s);
  TU_CHECK(atomic_fetch_add(&r->fired, 1) == 0);
  rel_maybe_release(r);
  atomic_fetch_add(&g_rel_done, 1);
}

static void rel_first(void *arg) {
  rel *r = arg;
  TU_CHECK(atomic_fetch_add(&r->first, 1) == 0);
  sleep_us(200);
  /* A timer on this strand (100 us) and a follow-up. */
  TU_CHECK(weft_timer_start(r->t, 100000, 0, rel_timer, r) == 0);
  TU_CHECK(weft_post(r->s, rel_follow, r) == 0);
}

static bool pred_live0(void *ctx, char *buf, size_t len) {
  weft_stats st;
  if (weft_rt_stats(ctx, &st) != 0)
    return false;
  snprintf(buf, len, "strands_live %" PRIu64, st.strands_live);
  return st.strands_live == 0;
}

static void test_release_after_handoff(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("release_after_handoff");
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = on_stall;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  memset(g_rel, 0, sizeof g_rel);
  atomic_store(&g_rel_done, 0);
  for (unsigned i = 0; i < NREL; i++) {
    tu_strand_create(rt, &g_rel[i].s);
    assert_int_equal(weft_timer_create(rt, g_rel[i].s, &g_rel[i].t), 0);
  }
  for (unsigned i = 0; i < NREL; i++)
    assert_int_equal(weft_post(g_rel[i].s, rel_first, &g_rel[i]), 0);
  tu_wait_count(&g_rel_done, 2 * NREL, "follow-ups and timers");
  tu_wait_until(pred_live0, rt, "every strand to be reclaimed");
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NREL; i++) {
    assert_int_equal(atomic_load(&g_rel[i].first), 1);
    assert_int_equal(atomic_load(&g_rel[i].follow), 1);
    assert_int_equal(atomic_load(&g_rel[i].fired), 1);
  }
  assert_int_equal(st.total.handlers_run, 3 * NREL);
  assert_int_equal(st.strands_live, 0);
  print_message("release_after_handoff: handoffs %" PRIu64 "\n",
                st.total.handoffs);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handoff_order),
      cmocka_unit_test(test_after_handoff_counts),
      cmocka_unit_test(test_release_after_handoff),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
