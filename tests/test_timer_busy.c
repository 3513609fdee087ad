/*
 * test_timer_busy: timers fire when the workers are busy or one is stuck.
 *
 * weft.h: "unrelated work never waits on unrelated work. A handler that
 * runs long delays only its own strand." Each timer is homed on one shard's
 * wheel; these tests check that it fires even when that shard's thread is
 * busy or stuck.
 *
 *  - Busy: workers = 2, two strands each running a handler that re-posts
 *    itself without end, so both workers always have work. 100 timers at
 *    1 ms (on the runtime, on the busy strands, on an idle strand) all fire,
 *    exactly once, never early.
 *  - Stuck: workers = 2, one worker held in a handler (it sleeps until the
 *    test lets it go). Timers homed anywhere still fire while it is held:
 *    100 timers at 1 ms at once, then 16 timers one at a time (each the
 *    only timer armed, so nothing else wakes an idle worker; 16 distinct
 *    timers are homed on both shards but with probability 2^-16). An
 *    atomic flag set when the held handler returns shows it was still held
 *    when the counts completed. The held handler lets itself go after
 *    STUCK_MAX_S seconds, so a failure is reported, not a hang.
 */
#include "testutil.h"

#define NTIMERS 100
#define AFTER_NS 1000000u /* 1 ms */
#define NSINGLE 16
#define STUCK_MAX_S 10

typedef struct tslot {
  uint64_t deadline;
  weft_strand *strand;
  atomic_uint calls;
  tu_count *fired;
} tslot;

static void slot_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  tslot *sl = arg;
  TU_CHECKF(status == 0, "status %d (%s)", status, weft_strerror(status));
  TU_CHECKF(missed == 0, "missed %" PRIu64, missed);
  TU_CHECKF(now >= sl->deadline, "fired %" PRIu64 " ns early",
            sl->deadline - now);
  TU_CHECKF(weft_strand_current() == sl->strand, "ran on strand %p, not %p",
            (void *)weft_strand_current(), (void *)sl->strand);
  unsigned c = atomic_fetch_add(&sl->calls, 1);
  TU_CHECKF(c == 0, "fired %u times", c + 1);
  atomic_fetch_add(sl->fired, 1);
}

/* Arms timers t[0..n) at now + AFTER_NS on strands[i % nstrands] (NULL
 * entries: the runtime). */
static void arm_all(weft_timer **t, tslot *sl, unsigned n,
                    weft_strand **strands, unsigned nstrands, tu_count *fired) {
  for (unsigned i = 0; i < n; i++) {
    sl[i].strand = strands[i % nstrands];
    sl[i].fired = fired;
    atomic_init(&sl[i].calls, 0);
    sl[i].deadline = weft_now_ns() + AFTER_NS;
    /* start_at with the recorded deadline: "never early" is then exact */
    tu_assert_rc(weft_timer_start_at(t[i], sl[i].strand, sl[i].deadline, 0,
                                     slot_handler, &sl[i]),
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
  tslot *sl = calloc(NTIMERS, sizeof *sl);
  assert_non_null(sl);
  tu_count fired;
  atomic_init(&fired, 0);
  for (unsigned round = 0; round < 3; round++) {
    atomic_store(&fired, 0);
    for (unsigned i = 0; i < NTIMERS; i++)
      tu_assert_rc(weft_timer_create(rt, &t[i]), 0);
    arm_all(t, sl, NTIMERS, where, 4, &fired);
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

typedef struct stuck {
  atomic_bool release;
  atomic_bool entered;
  atomic_bool returned;
} stuck;

static void stuck_handler(void *arg) {
  stuck *st = arg;
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

static void test_stuck_worker(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timers with a stuck worker");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *held, *other;
  tu_strand_create(rt, &held);
  tu_strand_create(rt, &other);
  stuck st;
  atomic_init(&st.release, false);
  atomic_init(&st.entered, false);
  atomic_init(&st.returned, false);
  tu_assert_rc(weft_post(held, stuck_handler, &st), 0);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&st.entered)) {
    if (tu_now_ns() > dl)
      fail_msg("the stuck handler did not start");
    tu_sleep_ms(1);
  }
  tu_sleep_ms(2); /* let the other worker go idle */

  weft_strand *where[2] = {NULL, other};
  tslot *sl = calloc(NTIMERS + NSINGLE, sizeof *sl);
  assert_non_null(sl);
  weft_timer *t[NTIMERS + NSINGLE];
  for (unsigned i = 0; i < NTIMERS + NSINGLE; i++)
    tu_assert_rc(weft_timer_create(rt, &t[i]), 0);
  tu_count fired;
  atomic_init(&fired, 0);

  /* all at once */
  arm_all(t, sl, NTIMERS, where, 2, &fired);
  bool ok = wait_while_stuck(&fired, NTIMERS, &st);
  if (!ok)
    fail_msg("with one worker stuck in a handler, only %" PRIu64 " of %u "
             "timers fired before it returned (after %d s)",
             (uint64_t)atomic_load(&fired), NTIMERS, STUCK_MAX_S);

  /* one at a time: each is the only timer armed */
  for (unsigned k = 0; k < NSINGLE; k++) {
    arm_all(&t[NTIMERS + k], &sl[NTIMERS + k], 1, &where[k % 2], 1, &fired);
    ok = wait_while_stuck(&fired, NTIMERS + k + 1, &st);
    if (!ok)
      fail_msg("with one worker stuck in a handler, a lone timer (#%u, on "
               "%s) did not fire before the handler returned (after %d s): "
               "a timer homed on the stuck worker's shard waits for it",
               k, (k % 2) ? "a strand" : "the runtime", STUCK_MAX_S);
  }
  assert_false(atomic_load(&st.returned)); /* still held: the point */
  atomic_store(&st.release, true);
  dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&st.returned)) {
    if (tu_now_ns() > dl)
      fail_msg("the stuck handler did not return");
    tu_sleep_ms(1);
  }
  for (unsigned i = 0; i < NTIMERS + NSINGLE; i++)
    weft_timer_destroy(t[i]);
  weft_strand_release(held);
  weft_strand_release(other);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NTIMERS + NSINGLE; i++)
    assert_int_equal(atomic_load(&sl[i].calls), 1);
  free(sl);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_busy_workers),
      cmocka_unit_test(test_stuck_worker),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
