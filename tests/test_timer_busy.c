/*
 * test_timer_busy: timers fire when the workers are busy or one is stuck.
 *
 * weft.h: "unrelated work never waits on unrelated work. A handler that
 * runs long delays only its own strand." All timers of a strand live in one
 * shard's wheel (weft.h, timers); these tests check that they fire even
 * when that shard's thread is busy, or when another thread is stuck.
 *
 *  - Busy: workers = 2, two strands each running a handler that re-posts
 *    itself without end, so both workers always have work. 100 timers at
 *    1 ms (on the runtime, on the busy strands, on an idle strand) all fire,
 *    exactly once, never early.
 *  - Stuck: workers = 2, one worker held in a handler (it sleeps until the
 *    test lets it go). See the comment above test_stuck_worker for what is
 *    checked in this tree (before the stall monitor) and what is not yet.
 *  - Stuck and busy, no monitor: one worker held, the other never idle.
 *    Timers on 16 strands (homed on both shards) all fire while the worker
 *    is held: the busy one serves the held shard's overdue timers.
 *    The held handler lets itself go after STUCK_MAX_S seconds, so a
 *    failure is reported, not a hang.
 *  - Late on both shards, no monitor: both workers held while timers homed
 *    on both shards, deadlines 100 us apart and alternating between the
 *    shards, all come due; one worker is let go. It fires both wheels'
 *    overdue timers in one catch-up, in deadline order across the wheels
 *    (shard.c, serve_late), so the handlers run in deadline order, not one
 *    wheel's timers and then the other's.
 */
#include "testutil.h"

#include "shard.h" /* which shard a handler runs on, a timer's home */

#define NTIMERS 100
#define AFTER_NS 1000000u /* 1 ms */
#define NSINGLE 16
#define STUCK_MAX_S 10

/* Creates timers t[0..n) on strands[i % nstrands] (NULL entries: the
 * runtime) and records the strand in sl[i]. */
static void create_all(weft_rt *rt, weft_timer **t, tu_tslot *sl, unsigned n,
                       weft_strand *const *strands, unsigned nstrands) {
  for (unsigned i = 0; i < n; i++) {
    sl[i].strand = strands[i % nstrands];
    tu_assert_rc(weft_timer_create(rt, sl[i].strand, &t[i]), 0);
  }
}

/* Arms timers t[0..n) (made by create_all) at now + AFTER_NS. */
static void arm_all(weft_timer **t, tu_tslot *sl, unsigned n, tu_count *fired) {
  for (unsigned i = 0; i < n; i++) {
    sl[i].fired = fired;
    atomic_init(&sl[i].calls, 0);
    sl[i].deadline = weft_now_ns() + AFTER_NS;
    /* start_at with the recorded deadline: "never early" is then exact */
    tu_assert_rc(
        weft_timer_start_at(t[i], sl[i].deadline, 0, tu_tslot_handler, &sl[i]),
        0);
  }
}

/* ------------------------------------------------------------------ busy */

typedef struct looper {
  weft_strand *s;
  atomic_bool stop;
  tu_count turns;
  tu_count stopped;
} looper;

static void loop_handler(void *arg) {
  looper *l = arg;
  atomic_fetch_add(&l->turns, 1);
  if (atomic_load(&l->stop)) {
    atomic_fetch_add(&l->stopped, 1);
    return;
  }
  int rc = weft_post(l->s, loop_handler, l);
  if (rc != 0) {
    TU_CHECKF(false, "re-post failed: %d (%s)", rc, weft_strerror(rc));
    atomic_fetch_add(&l->stopped, 1);
  }
}

static void test_busy_workers(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timers with busy workers");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  looper l[2];
  for (unsigned k = 0; k < 2; k++) {
    tu_strand_create(rt, &l[k].s);
    atomic_init(&l[k].stop, false);
    atomic_init(&l[k].turns, 0);
    atomic_init(&l[k].stopped, 0);
    tu_assert_rc(weft_post(l[k].s, loop_handler, &l[k]), 0);
  }
  for (unsigned k = 0; k < 2; k++)
    tu_wait_count(&l[k].turns, 1000, "the loops to spin");
  weft_strand *idle;
  tu_strand_create(rt, &idle);
  weft_strand *where[4] = {NULL, l[0].s, l[1].s, idle};
  weft_timer *t[NTIMERS];
  tu_tslot *sl = calloc(NTIMERS, sizeof *sl);
  assert_non_null(sl);
  tu_count fired;
  atomic_init(&fired, 0);
  for (unsigned round = 0; round < 3; round++) {
    atomic_store(&fired, 0);
    create_all(rt, t, sl, NTIMERS, where, 4);
    arm_all(t, sl, NTIMERS, &fired);
    tu_wait_count(&fired, NTIMERS, "timers while both workers are busy");
    for (unsigned i = 0; i < NTIMERS; i++)
      weft_timer_destroy(t[i]);
  }
  /* the loops were running all along */
  for (unsigned k = 0; k < 2; k++)
    assert_int_equal(atomic_load(&l[k].stopped), 0);
  for (unsigned k = 0; k < 2; k++)
    atomic_store(&l[k].stop, true);
  for (unsigned k = 0; k < 2; k++)
    tu_wait_count(&l[k].stopped, 1, "the loops to stop");
  for (unsigned k = 0; k < 2; k++)
    weft_strand_release(l[k].s);
  weft_strand_release(idle);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NTIMERS; i++)
    assert_int_equal(atomic_load(&sl[i].calls), 1);
  free(sl);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------------------- stuck */

/*
 * What this tree can promise, and what it cannot yet.
 *
 * A timer lives in the wheel of its home shard: for a timer on a strand,
 * the shard that the strand's address picks (all timers of a strand share
 * it); for a timer on the runtime, the one its own address picks. While a
 * shard's thread is stuck in a handler, nothing wakes another thread for
 * that shard's deadlines: a timer homed there fires only when something
 * else happens to wake an idle thread (which then serves every due wheel),
 * when the stuck handler returns, or, once the stall monitor is merged,
 * when the monitor hands the stuck shard to another thread. So, here:
 *
 *  - classify: strands are probed one at a time with a lone timer (the only
 *    one armed, so nothing else wakes the free worker). A probe that fires
 *    while the worker is held shows that strand's timers are homed on the
 *    free shard ("free strands"); one that does not fire within PROBE_MS
 *    is cancelled (0: it never fired) and its strand is taken as homed on
 *    the held worker's shard ("held strands"). Strands are 64-byte pool
 *    objects whose addresses pick shards alternately, so NPROBE strands
 *    give free strands but with a negligible chance; at least one is
 *    required.
 *  - checked while the worker is held: on free strands only, 100 timers at
 *    1 ms at once, then NSINGLE lone timers one at a time (each the only
 *    one armed): all fire exactly once, never early, on their strand,
 *    before the held handler returns (the timers of a strand keep to their
 *    home: a probe that fired predicts them all).
 *  - checked after the worker is let go: a timer on each held strand, armed
 *    while it was held, fires exactly once, never early. Whether it fired
 *    before or after the release is not checked here.
 *
 * That timers homed on a held worker's shard fire while it is still held
 * (the monitor hands the shard to a spare thread) is tested with every
 * worker held in test_stall_all_blocked.
 */
#define NPROBE 8
#define PROBE_MS 200u

typedef struct stuck {
  atomic_bool release;
  atomic_bool entered;
  atomic_bool returned;
  atomic_uint shard; /* the held worker's shard */
} stuck;

static void stuck_handler(void *arg) {
  stuck *st = arg;
  atomic_store(&st->shard, weft__self()->shard->idx);
  atomic_store(&st->entered, true);
  uint64_t cap = tu_deadline_ns(STUCK_MAX_S);
  while (!atomic_load(&st->release) && tu_now_ns() < cap)
    tu_sleep_ms(1);
  atomic_store(&st->returned, true);
}

/* Waits until *fired >= n or the stuck handler returned; true if the timers
 * fired while it was still held. */
static bool wait_while_stuck(tu_count *fired, uint64_t n, stuck *st) {
  for (;;) {
    /* count first, flag second: a flag still false after the count was
     * seen complete proves the count completed while the handler was held
     * (it returns only when released, or after STUCK_MAX_S) */
    if (atomic_load(fired) >= n)
      return !atomic_load(&st->returned);
    if (atomic_load(&st->returned))
      return false;
    tu_sleep_ms(1);
  }
}

/* Posts stuck_handler on held and waits until it runs. */
static void hold_worker(weft_strand *held, stuck *st) {
  atomic_init(&st->release, false);
  atomic_init(&st->entered, false);
  atomic_init(&st->returned, false);
  atomic_init(&st->shard, 0);
  tu_assert_rc(weft_post(held, stuck_handler, st), 0);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&st->entered)) {
    if (tu_now_ns() > dl)
      fail_msg("the stuck handler did not start");
    tu_sleep_ms(1);
  }
}

static void test_stuck_worker(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timers with a stuck worker");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *held;
  tu_strand_create(rt, &held);
  weft_strand *cand[NPROBE];
  for (unsigned i = 0; i < NPROBE; i++)
    tu_strand_create(rt, &cand[i]);
  stuck st;
  hold_worker(held, &st);
  tu_sleep_ms(2); /* let the other worker go idle */

  /* classify the candidate strands, one lone probe at a time */
  tu_phase("stuck worker: probing strands");
  weft_strand *frees[NPROBE], *helds[NPROBE];
  unsigned nfree = 0, nheld = 0;
  for (unsigned i = 0; i < NPROBE; i++) {
    tu_tslot probe;
    weft_timer *pt;
    tu_count pfired;
    atomic_init(&pfired, 0);
    create_all(rt, &pt, &probe, 1, &cand[i], 1);
    arm_all(&pt, &probe, 1, &pfired);
    uint64_t until = tu_now_ns() + (uint64_t)PROBE_MS * 1000000u;
    while (atomic_load(&pfired) == 0 && tu_now_ns() < until &&
           !atomic_load(&st.returned))
      tu_sleep_ms(1);
    if (atomic_load(&st.returned))
      fail_msg("the held handler returned after %d s while probing strand "
               "%u (the machine is too slow for this test?)",
               STUCK_MAX_S, i);
    if (atomic_load(&pfired) != 0) {
      frees[nfree++] = cand[i];
    } else {
      int rc = weft_timer_cancel(pt);
      if (rc == 0) {
        helds[nheld++] = cand[i];
      } else {
        /* it fired just now: classify it as neither */
        tu_assert_rc(rc, -EALREADY);
        tu_wait_count(&pfired, 1, "a probe that fired late");
      }
    }
    weft_timer_destroy(pt);
  }
  print_message("[ INFO     ] %u of %u strands homed on the free shard, %u on "
                "the held worker's\n",
                nfree, NPROBE, nheld);
  if (nfree == 0)
    fail_msg("with one of 2 workers held, none of %u strands had a lone "
             "1 ms timer fire within %u ms: no strand's timers are served "
             "by the free worker",
             NPROBE, PROBE_MS);

  tu_tslot *sl = calloc(NTIMERS + NSINGLE, sizeof *sl);
  assert_non_null(sl);
  weft_timer *t[NTIMERS + NSINGLE];
  create_all(rt, t, sl, NTIMERS, frees, nfree);
  for (unsigned k = 0; k < NSINGLE; k++)
    create_all(rt, &t[NTIMERS + k], &sl[NTIMERS + k], 1, &frees[k % nfree], 1);
  tu_count fired;
  atomic_init(&fired, 0);

  /* all at once, on free strands */
  tu_phase("stuck worker: timers at once");
  arm_all(t, sl, NTIMERS, &fired);
  bool ok = wait_while_stuck(&fired, NTIMERS, &st);
  if (!ok)
    fail_msg("with one worker stuck in a handler, only %" PRIu64 " of %u "
             "timers on strands homed on the free shard fired before it "
             "returned (after %d s)",
             (uint64_t)atomic_load(&fired), NTIMERS, STUCK_MAX_S);

  /* one at a time: each is the only timer armed */
  tu_phase("stuck worker: lone timers");
  for (unsigned k = 0; k < NSINGLE; k++) {
    arm_all(&t[NTIMERS + k], &sl[NTIMERS + k], 1, &fired);
    ok = wait_while_stuck(&fired, NTIMERS + k + 1, &st);
    if (!ok)
      fail_msg("with one worker stuck in a handler, a lone timer (#%u) on a "
               "strand whose probe timer had fired did not fire before the "
               "handler returned (after %d s): the timers of one strand are "
               "not all served by the same (free) shard",
               k, STUCK_MAX_S);
  }
  assert_false(atomic_load(&st.returned)); /* still held: the point */

  /* held strands: armed now, they fire once the worker is let go (this
   * tree does not promise earlier; see above) */
  tu_phase("stuck worker: timers of held strands");
  weft_timer *ht[NPROBE];
  tu_tslot hsl[NPROBE];
  tu_count hfired;
  atomic_init(&hfired, 0);
  create_all(rt, ht, hsl, nheld, helds, nheld ? nheld : 1);
  arm_all(ht, hsl, nheld, &hfired);
  atomic_store(&st.release, true);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&st.returned)) {
    if (tu_now_ns() > dl)
      fail_msg("the stuck handler did not return");
    tu_sleep_ms(1);
  }
  tu_wait_count(&hfired, nheld, "timers of held strands after the release");
  for (unsigned i = 0; i < NTIMERS + NSINGLE; i++)
    weft_timer_destroy(t[i]);
  for (unsigned i = 0; i < nheld; i++)
    weft_timer_destroy(ht[i]);
  weft_strand_release(held);
  for (unsigned i = 0; i < NPROBE; i++)
    weft_strand_release(cand[i]);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NTIMERS + NSINGLE; i++)
    assert_int_equal(atomic_load(&sl[i].calls), 1);
  for (unsigned i = 0; i < nheld; i++)
    assert_int_equal(atomic_load(&hsl[i].calls), 1);
  free(sl);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* No monitor, one worker held, the other running a loop that never lets
 * it go idle (so it never searches): the held shard's timers are fired
 * only because a running thread looks at one other shard's deadline every
 * few items and serves it once overdue (shard.c, serve_one_overdue). At
 * least one of the timers must be homed on the held shard (checked with
 * the runtime's own hash), or the test would prove nothing. The loop and
 * the held handler are static and let go before any failure is reported,
 * so that a failure leaves nothing running on this test's stack. */
#define NSTUCKBUSY 16

/* Two workers and no monitor: a held worker keeps its shard. */
static weft_rt *rt_two_no_monitor(void) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.flags = WEFT_CONFIG_NO_MONITOR;
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

static stuck g_sb_stuck;
static looper g_sb_loop;

static void test_stuck_and_busy(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timers with a stuck worker and a busy one, no monitor");
  weft_rt *rt = rt_two_no_monitor();
  weft_strand *held;
  tu_strand_create(rt, &held);
  stuck *st = &g_sb_stuck;
  hold_worker(held, st);
  looper *l = &g_sb_loop;
  tu_strand_create(rt, &l->s);
  atomic_init(&l->stop, false);
  atomic_init(&l->turns, 0);
  atomic_init(&l->stopped, 0);
  tu_assert_rc(weft_post(l->s, loop_handler, l), 0);
  tu_wait_count(&l->turns, 1000, "the loop to spin");

  weft_strand *s[NSTUCKBUSY];
  weft_timer *t[NSTUCKBUSY];
  tu_tslot sl[NSTUCKBUSY];
  for (unsigned i = 0; i < NSTUCKBUSY; i++)
    tu_strand_create(rt, &s[i]);
  create_all(rt, t, sl, NSTUCKBUSY, s, NSTUCKBUSY);
  unsigned on_held = 0, held_idx = atomic_load(&st->shard);
  for (unsigned i = 0; i < NSTUCKBUSY; i++)
    on_held += weft__timer_home(t[i])->idx == held_idx;
  tu_count fired;
  atomic_init(&fired, 0);
  arm_all(t, sl, NSTUCKBUSY, &fired);
  bool ok = on_held > 0 && wait_while_stuck(&fired, NSTUCKBUSY, st);
  uint64_t got = atomic_load(&fired);
  bool stopped_early = atomic_load(&l->stopped) != 0;
  atomic_store(&st->release, true);
  atomic_store(&l->stop, true);
  tu_wait_count(&l->stopped, 1, "the loop to stop");
  if (on_held == 0)
    fail_msg("none of %u timers is homed on the held shard %u", NSTUCKBUSY,
             held_idx);
  if (!ok)
    fail_msg("with one worker stuck and the other busy, %" PRIu64 " of %u "
             "timers (%u homed on the stuck shard) fired before the stuck "
             "handler returned (after %d s): its overdue timers were not "
             "served",
             got, NSTUCKBUSY, on_held, STUCK_MAX_S);
  assert_false(stopped_early); /* busy all along */
  for (unsigned i = 0; i < NSTUCKBUSY; i++) {
    weft_timer_destroy(t[i]);
    weft_strand_release(s[i]);
  }
  weft_strand_release(l->s);
  weft_strand_release(held);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NSTUCKBUSY; i++)
    assert_int_equal(atomic_load(&sl[i].calls), 1);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Both workers held; timers on strands homed on both shards come due; one
 * worker (y) is let go and runs every handler alone, in the order it
 * queued them. NLATE timers, deadlines LATE_SPACING_NS apart, alternating
 * between the shards; y is let go 2 ms after the last deadline, when its
 * own and the other shard's are all overdue by far more than OVERDUE_NS. */
#define NLATE 64
#define NLATE_CAND 256
#define LATE_SPACING_NS 100000u

static stuck g_late_x, g_late_y;

typedef struct late_slot {
  uint64_t deadline;
  atomic_uint calls;
  tu_count *seq;
  unsigned order;
} late_slot;

static void late_handler(void *arg, int status, uint64_t missed) {
  late_slot *sl = arg;
  (void)missed;
  TU_CHECKF(status == 0, "status %d (%s)", status, weft_strerror(status));
  TU_CHECKF(weft_now_ns() >= sl->deadline, "fired early");
  sl->order = (unsigned)atomic_fetch_add(sl->seq, 1);
  atomic_fetch_add(&sl->calls, 1);
}

/* Picks NLATE of the candidate timers, alternating between the shards x
 * and y (their homes); false if either shard has too few. */
static bool pick_alternating(weft_timer **cand, unsigned x, unsigned y,
                             weft_timer **out) {
  unsigned nx = 0, ny = 0;
  for (unsigned i = 0; i < NLATE_CAND && (nx < NLATE / 2 || ny < NLATE / 2);
       i++) {
    unsigned h = weft__timer_home(cand[i])->idx;
    if (h == x && nx < NLATE / 2)
      out[2 * nx++] = cand[i];
    else if (h == y && ny < NLATE / 2)
      out[2 * ny++ + 1] = cand[i];
  }
  return nx == NLATE / 2 && ny == NLATE / 2;
}

/* One round: holds both workers, arms the timers, lets y go once all are
 * overdue, then x. Returns whether they were all armed before the first
 * deadline (else the round proves nothing); *bad is the first timer that
 * ran out of deadline order, NLATE if none. */
static bool late_round(weft_strand *hx, weft_strand *hy, weft_timer **cand,
                       weft_timer **t, late_slot *sl, unsigned margin_ms,
                       unsigned *bad) {
  stuck *x = &g_late_x, *y = &g_late_y;
  hold_worker(hx, x);
  hold_worker(hy, y);
  if (!pick_alternating(cand, atomic_load(&x->shard), atomic_load(&y->shard),
                        t)) {
    atomic_store(&x->release, true);
    atomic_store(&y->release, true);
    fail_msg("fewer than %u of %u strands homed on each shard", NLATE / 2,
             NLATE_CAND);
  }
  tu_count seq;
  atomic_init(&seq, 0);
  uint64_t base = weft_now_ns() + (uint64_t)margin_ms * 1000000u;
  for (unsigned k = 0; k < NLATE; k++) {
    sl[k].deadline = base + (uint64_t)k * LATE_SPACING_NS;
    atomic_init(&sl[k].calls, 0);
    sl[k].seq = &seq;
    tu_assert_rc(
        weft_timer_start_at(t[k], sl[k].deadline, 0, late_handler, &sl[k]), 0);
  }
  bool in_time = weft_now_ns() < base;
  while (weft_now_ns() < sl[NLATE - 1].deadline + 2000000u)
    tu_sleep_ms(1);
  atomic_store(&y->release, true);
  tu_wait_count(&seq, NLATE, "the overdue timers, one worker let go");
  atomic_store(&x->release, true);
  while (!atomic_load(&x->returned) || !atomic_load(&y->returned))
    tu_sleep_ms(1);
  *bad = NLATE;
  for (unsigned k = 0; k < NLATE; k++) {
    assert_int_equal(atomic_load(&sl[k].calls), 1);
    if (sl[k].order != k && *bad == NLATE)
      *bad = k;
  }
  return in_time;
}

static void test_late_catchup_order(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timers of both shards overdue at once, no monitor");
  weft_rt *rt = rt_two_no_monitor();
  weft_strand *hx, *hy;
  tu_strand_create(rt, &hx);
  tu_strand_create(rt, &hy);
  weft_strand **s = calloc(NLATE_CAND, sizeof *s);
  weft_timer **cand = calloc(NLATE_CAND, sizeof *cand);
  assert_true(s && cand);
  for (unsigned i = 0; i < NLATE_CAND; i++) {
    tu_strand_create(rt, &s[i]);
    tu_assert_rc(weft_timer_create(rt, s[i], &cand[i]), 0);
  }
  late_slot sl[NLATE];
  weft_timer *t[NLATE];
  unsigned bad = NLATE, round = 0;
  /* A round whose timers were not all armed before the first deadline (a
   * slow moment) is redone with more margin. */
  while (!late_round(hx, hy, cand, t, sl, 2u << round, &bad))
    if (++round == 4)
      fail_msg("arming %u timers took more than %u ms, 4 times", NLATE,
               2u << (round - 1));
  if (bad < NLATE)
    fail_msg("timer %u of %u (homed on shard %u) ran as number %u: the "
             "overdue timers of the two shards did not run in deadline "
             "order",
             bad, NLATE, weft__timer_home(t[bad])->idx, sl[bad].order);
  for (unsigned i = 0; i < NLATE_CAND; i++) {
    weft_timer_destroy(cand[i]);
    weft_strand_release(s[i]);
  }
  weft_strand_release(hx);
  weft_strand_release(hy);
  assert_int_equal(weft_rt_destroy(rt), 0);
  free(s);
  free(cand);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_busy_workers),
      cmocka_unit_test(test_stuck_worker),
      cmocka_unit_test(test_stuck_and_busy),
      cmocka_unit_test(test_late_catchup_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
