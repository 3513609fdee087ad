/*
 * test_timer_order: when one-shot timers fire, and in which order.
 *
 *  - Never early: every handler runs at weft_now_ns() >= its deadline (the
 *    API guarantees it), with status 0 and missed 0, exactly once, on the
 *    strand it was created for (or on no strand for strand NULL).
 *  - On a strand, timers with increasing deadlines (N timers, deadlines
 *    base + i * 50 us, started in shuffled order) run in deadline order;
 *    timers with equal deadlines run in start order (weft.h,
 *    weft_timer_create: "Timers of one strand fire in deadline order, and
 *    those with equal deadlines in the order they were started"). With
 *    workers = 1 and workers = 4: with 4 workers any of the threads may
 *    serve the strand's wheel and run the handlers, and the order must
 *    still hold.
 *  - On the runtime (strand NULL) no order is promised: each timer fires
 *    exactly once and never early.
 *  - A deadline in the past (weft_timer_start_at with 0, or now - 1 s, and
 *    weft_timer_start with after_ns 0) fires at once: status 0, exactly once.
 *  - weft_shard_stats.timers_fired counts every firing, those that happen
 *    inside weft_timer_start (past deadlines, from a foreign thread) too.
 *
 * Precondition of the order checks: every timer was started before the
 * first deadline (a timer cannot fire before it is started, so a late start
 * would reorder legitimately). If starting took longer than the margin on a
 * loaded machine, the round is redone with a larger margin; nothing here
 * bounds lateness.
 */
#include "testutil.h"

#define NTIMERS 200
#define SPACING_NS 50000u /* 50 us between increasing deadlines */

typedef struct ord_run ord_run;

typedef struct ord_slot {
  ord_run *run;
  unsigned idx;
  uint64_t deadline;
  atomic_uint calls;
} ord_slot;

struct ord_run {
  weft_strand *strand; /* where the handlers must run; NULL: no strand */
  ord_slot slot[NTIMERS];
  tu_count claimed;        /* positions in order[] handed out */
  tu_count fired;          /* handlers done */
  unsigned order[NTIMERS]; /* idx of the k-th firing */
};

static void ord_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  ord_slot *sl = arg;
  ord_run *r = sl->run;
  TU_CHECKF(status == 0, "timer %u: status %d (%s), expected 0", sl->idx,
            status, weft_strerror(status));
  TU_CHECKF(missed == 0, "one-shot timer %u: missed %" PRIu64, sl->idx, missed);
  TU_CHECKF(now >= sl->deadline,
            "timer %u fired early: now %" PRIu64 " < deadline %" PRIu64
            " (%" PRIu64 " ns early)",
            sl->idx, now, sl->deadline, sl->deadline - now);
  TU_CHECKF(weft_strand_current() == r->strand,
            "timer %u ran on strand %p, expected %p", sl->idx,
            (void *)weft_strand_current(), (void *)r->strand);
  TU_CHECK(weft_rt_current() != NULL);
  unsigned c = atomic_fetch_add(&sl->calls, 1);
  TU_CHECKF(c == 0, "timer %u fired %u times", sl->idx, c + 1);
  uint64_t pos = atomic_fetch_add(&r->claimed, 1);
  if (pos < NTIMERS)
    r->order[pos] = sl->idx;
  atomic_fetch_add(&r->fired, 1); /* after the write: the test reads it */
}

static void shuffle(unsigned *a, unsigned n, uint64_t *rng) {
  for (unsigned i = n - 1; i > 0; i--) {
    unsigned j = (unsigned)(tu_rand(rng) % (i + 1));
    unsigned x = a[i];
    a[i] = a[j];
    a[j] = x;
  }
}

/* One round: NTIMERS timers on `strand` (may be NULL), deadlines increasing
 * (started shuffled) or equal (started in index order). Returns false if the
 * precondition failed (a start came after the first deadline): redo. */
static bool ord_round(weft_rt *rt, weft_strand *strand, bool equal,
                      bool check_order, uint64_t margin_ns, uint64_t *rng) {
  ord_run *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->strand = strand;
  atomic_init(&r->claimed, 0);
  atomic_init(&r->fired, 0);
  weft_timer *t[NTIMERS];
  unsigned perm[NTIMERS];
  for (unsigned i = 0; i < NTIMERS; i++) {
    tu_assert_rc(weft_timer_create(rt, strand, &t[i]), 0);
    r->slot[i].run = r;
    r->slot[i].idx = i;
    atomic_init(&r->slot[i].calls, 0);
    perm[i] = i;
  }
  if (!equal)
    shuffle(perm, NTIMERS, rng);

  uint64_t base = weft_now_ns() + margin_ns;
  for (unsigned i = 0; i < NTIMERS; i++)
    r->slot[i].deadline = equal ? base : base + (uint64_t)i * SPACING_NS;
  for (unsigned k = 0; k < NTIMERS; k++) {
    unsigned i = perm[k];
    tu_assert_rc(weft_timer_start_at(t[i], r->slot[i].deadline, 0, ord_handler,
                                     &r->slot[i]),
                 0);
  }
  bool in_time = weft_now_ns() < base;

  tu_wait_count(&r->fired, NTIMERS, "every timer to fire");
  for (unsigned i = 0; i < NTIMERS; i++) {
    /* fired: not armed any more */
    tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
    weft_timer_destroy(t[i]);
  }
  for (unsigned i = 0; i < NTIMERS; i++)
    assert_int_equal(atomic_load(&r->slot[i].calls), 1);

  if (in_time && check_order) {
    for (unsigned k = 0; k < NTIMERS; k++) {
      if (r->order[k] != k) {
        char buf[256];
        int len = 0;
        unsigned from = k >= 4 ? k - 4 : 0;
        for (unsigned j = from; j < NTIMERS && j < k + 6 && len < 200; j++)
          len +=
              snprintf(buf + len, sizeof buf - (size_t)len, " %u", r->order[j]);
        fail_msg("%s deadlines on a strand (workers=%u): firing #%u was "
                 "timer %u, expected %u (firings #%u..: %s)",
                 equal ? "equal" : "increasing", weft_rt_workers(rt), k,
                 r->order[k], k, from, buf);
      }
    }
  }
  free(r);
  return in_time;
}

static void ord_run_rounds(unsigned workers, bool on_strand, bool equal,
                           bool check_order, unsigned rounds) {
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, workers, 0);
  weft_strand *s = NULL;
  if (on_strand)
    tu_strand_create(rt, &s);
  uint64_t rng = 0x7157ull * workers + (equal ? 1 : 0) + (on_strand ? 2 : 0);
  uint64_t margin = 5000000; /* 5 ms */
  unsigned done = 0, redone = 0;
  uint64_t started = 0; /* timers started, all rounds (each fired once) */
  while (done < rounds) {
    started += NTIMERS;
    if (ord_round(rt, s, equal, check_order, margin, &rng)) {
      done++;
    } else {
      /* Starting took longer than the margin: not a failure, redo. */
      if (++redone > 8)
        fail_msg("could not start %u timers within %" PRIu64
                 " ms, %u times: cannot check the order",
                 NTIMERS, margin / 1000000, redone);
      margin *= 2;
    }
  }
  weft_stats st;
  tu_stats(rt, &st);
  if (st.total.timers_fired != started)
    fail_msg("timers_fired is %" PRIu64 " after %" PRIu64 " timers fired "
             "once each",
             st.total.timers_fired, started);
  if (s)
    weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_increasing_on_strand_w1(void **state) {
  (void)state;
  tu_phase("increasing deadlines on a strand, workers=1");
  ord_run_rounds(1, true, false, true, 5);
}

static void test_equal_on_strand_w1(void **state) {
  (void)state;
  tu_phase("equal deadlines on a strand, workers=1");
  ord_run_rounds(1, true, true, true, 5);
}

static void test_increasing_on_strand_w4(void **state) {
  (void)state;
  tu_phase("increasing deadlines on a strand, workers=4");
  ord_run_rounds(4, true, false, true, 5);
}

static void test_equal_on_strand_w4(void **state) {
  (void)state;
  tu_phase("equal deadlines on a strand, workers=4");
  ord_run_rounds(4, true, true, true, 5);
}

/* strand NULL: no order promised; exactly once, never early, no strand. */
static void test_runtime_never_early(void **state) {
  (void)state;
  tu_phase("timers on the runtime");
  ord_run_rounds(1, false, false, false, 3);
  ord_run_rounds(1, false, true, false, 3);
  ord_run_rounds(4, false, false, false, 3);
  ord_run_rounds(4, false, true, false, 3);
}

/* ------------------------------------------------------- past deadlines */

typedef struct past_slot {
  weft_strand *strand;
  tu_count calls;
  atomic_int status;
  atomic_ullong missed;
} past_slot;

static void past_handler(void *arg, int status, uint64_t missed) {
  past_slot *p = arg;
  TU_CHECKF(weft_strand_current() == p->strand,
            "past-deadline timer ran on strand %p, expected %p",
            (void *)weft_strand_current(), (void *)p->strand);
  atomic_store(&p->status, status);
  atomic_store(&p->missed, missed);
  atomic_fetch_add(&p->calls, 1);
}

static void test_past_deadline(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("past deadlines");
  for (unsigned workers = 1; workers <= 2; workers++) {
    weft_rt *rt;
    tu_rt_create(&rt, workers, 0);
    weft_strand *s;
    tu_strand_create(rt, &s);
    enum { KINDS = 3, NS = 2 };
    past_slot p[KINDS * NS];
    weft_timer *t[KINDS * NS];
    for (unsigned i = 0; i < KINDS * NS; i++) {
      p[i].strand = (i % NS) ? s : NULL;
      atomic_init(&p[i].calls, 0);
      atomic_init(&p[i].status, 1);
      atomic_init(&p[i].missed, 0);
      tu_assert_rc(weft_timer_create(rt, p[i].strand, &t[i]), 0);
    }
    uint64_t now = weft_now_ns();
    for (unsigned i = 0; i < KINDS * NS; i++) {
      switch (i / NS) {
      case 0: /* absolute 0 */
        tu_assert_rc(weft_timer_start_at(t[i], 0, 0, past_handler, &p[i]), 0);
        break;
      case 1: /* absolute, a second ago */
        tu_assert_rc(
            weft_timer_start_at(t[i], now > 1000000000u ? now - 1000000000u : 1,
                                0, past_handler, &p[i]),
            0);
        break;
      default: /* relative 0 */
        tu_assert_rc(weft_timer_start(t[i], 0, 0, past_handler, &p[i]), 0);
        break;
      }
    }
    for (unsigned i = 0; i < KINDS * NS; i++)
      tu_wait_count(&p[i].calls, 1, "a past-deadline timer to fire");
    /* Fired, so not armed: a cancel finds nothing to cancel. */
    for (unsigned i = 0; i < KINDS * NS; i++)
      tu_assert_rc(weft_timer_cancel(t[i]), -EALREADY);
    /* They fired inside weft_timer_start, on this (foreign) thread: the
     * firings are counted all the same. */
    weft_stats st;
    tu_stats(rt, &st);
    if (st.total.timers_fired != KINDS * NS)
      fail_msg("workers=%u: timers_fired is %" PRIu64 " after %u timers "
               "with past deadlines fired at their start",
               workers, st.total.timers_fired, KINDS * NS);
    /* A strand must stay unreleased until its timers are destroyed. */
    for (unsigned i = 0; i < KINDS * NS; i++)
      weft_timer_destroy(t[i]);
    weft_strand_release(s);
    assert_int_equal(weft_rt_destroy(rt), 0);
    for (unsigned i = 0; i < KINDS * NS; i++) {
      if (atomic_load(&p[i].calls) != 1)
        fail_msg("past-deadline timer %u (kind %u) ran %" PRIu64 " times", i,
                 i / NS, (uint64_t)atomic_load(&p[i].calls));
      if (atomic_load(&p[i].status) != 0)
        fail_msg("past-deadline timer %u (kind %u): status %d (%s)", i, i / NS,
                 atomic_load(&p[i].status),
                 weft_strerror(atomic_load(&p[i].status)));
      assert_int_equal(atomic_load(&p[i].missed), 0);
    }
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_increasing_on_strand_w1),
      cmocka_unit_test(test_equal_on_strand_w1),
      cmocka_unit_test(test_increasing_on_strand_w4),
      cmocka_unit_test(test_equal_on_strand_w4),
      cmocka_unit_test(test_runtime_never_early),
      cmocka_unit_test(test_past_deadline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
