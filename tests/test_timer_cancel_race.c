/*
 * test_timer_cancel_race: weft_timer_cancel racing the firing.
 *
 * weft.h: "Exactly one of "called" and "cancelled" happens to each arming,
 * and the return value says which: 0 when its handler will not be called
 * [...]; -EALREADY when its handler has started".
 *
 * 10^5 (scaled) armings with deadlines 0-50 us, each cancelled a random
 * 0-150 us later, so firing and cancelling really race. Four drivers arm and
 * cancel at once, each with its own ring of timers (many armed at a time):
 * two foreign threads and two handlers of driver strands (which re-post
 * themselves). The timers fire on eight other strands or on the runtime
 * (strand NULL): each ring timer is created for a random one of these nine
 * targets (a timer is bound to its strand at creation), and each batch arms
 * a random run of the ring. For each arming exactly one outcome:
 *   cancel returned 0        and the handler never ran for it, or
 *   cancel returned -EALREADY and the handler ran exactly once (status 0,
 *                             missed 0, never early, on its strand).
 * The two counts add up to the number of armings, and both occur.
 *
 * A timer is re-armed only once its previous arming is settled (cancelled,
 * or its handler has run), so every handler call can be attributed to one
 * arming through its arg. The final check runs after a DRAIN shutdown and
 * weft_rt_destroy: any firing still queued has run by then.
 *
 * Also: a firing of an earlier arming that is queued when the timer is
 * started again, cancelled or destroyed never runs (test_rearm_while_queued).
 */
#include "testutil.h"

#include <sched.h>

#define NWORKERS 4
#define NTARGETS 8
#define NDRIVERS 4 /* 0, 1: foreign threads; 2, 3: driver strands */
#define RING 64
#define BATCH 32
#define MAX_AFTER_NS 50000u
#define MAX_SPIN_NS 150000u
#define STRAND_BATCHES_PER_TURN 4

typedef struct arming {
  atomic_uint calls;
  int cancel_rc; /* written by its driver after cancel */
  uint64_t deadline;
  weft_strand *strand;
} arming;

typedef struct driver {
  unsigned id;
  weft_timer *t[RING];
  weft_strand *target[RING]; /* the strand t[i] was created for, or NULL */
  arming *last[RING];        /* previous arming of each ring timer */
  arming *arm;               /* this driver's records */
  uint64_t quota, used;
  uint64_t n_cancelled, n_already;
  uint64_t rng;
  weft_strand *self; /* driver strands only */
  uint64_t deadline_ns;
  bool failed;
} driver;

static weft_rt *g_rt;
static weft_strand *g_targets[NTARGETS];
static driver g_drv[NDRIVERS];
static tu_count g_calls;        /* handler calls, all armings */
static tu_count g_drivers_done; /* drivers that used their quota */

static void timer_handler(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  arming *a = arg;
  TU_CHECKF(status == 0, "status %d (%s), expected 0", status,
            weft_strerror(status));
  TU_CHECKF(missed == 0, "one-shot: missed %" PRIu64, missed);
  TU_CHECKF(now >= a->deadline, "fired %" PRIu64 " ns before its deadline",
            a->deadline - now);
  TU_CHECKF(weft_strand_current() == a->strand,
            "ran on strand %p, armed for %p", (void *)weft_strand_current(),
            (void *)a->strand);
  unsigned c = atomic_fetch_add(&a->calls, 1);
  TU_CHECKF(c == 0, "handler ran %u times for one arming", c + 1);
  atomic_fetch_add(&g_calls, 1);
}

/* Whether ring timer i may be armed again: its previous arming was
 * cancelled, or its handler has run. */
static bool slot_free(driver *d, unsigned i) {
  arming *a = d->last[i];
  return !a || a->cancel_rc == 0 || atomic_load(&a->calls) >= 1;
}

/* Arms up to BATCH free ring timers, waits 0-150 us, cancels them in a random
 * order. Returns how many were armed (0: none free now). */
static unsigned drive_batch(driver *d) {
  unsigned idx[BATCH];
  unsigned n = 0;
  unsigned start = (unsigned)(tu_rand(&d->rng) % RING);
  for (unsigned k = 0; k < RING && n < BATCH && d->used + n < d->quota; k++) {
    unsigned i = (start + k) % RING;
    if (slot_free(d, i))
      idx[n++] = i;
  }
  for (unsigned k = 0; k < n; k++) {
    unsigned i = idx[k];
    arming *a = &d->arm[d->used + k];
    uint64_t r = tu_rand(&d->rng);
    a->strand = d->target[i];
    a->cancel_rc = 1; /* not yet cancelled */
    a->deadline = weft_now_ns() + (r >> 16) % (MAX_AFTER_NS + 1);
    d->last[i] = a;
    int rc = weft_timer_start_at(d->t[i], a->deadline, 0, timer_handler, a);
    if (rc != 0) {
      TU_CHECKF(false, "driver %u: weft_timer_start_at: %d (%s)", d->id, rc,
                weft_strerror(rc));
      d->failed = true;
      return 0;
    }
  }
  uint64_t spin_until = weft_now_ns() + tu_rand(&d->rng) % (MAX_SPIN_NS + 1);
  while (weft_now_ns() < spin_until) {
  }
  /* cancel in a random order */
  for (unsigned k = n; k > 1; k--) {
    unsigned j = (unsigned)(tu_rand(&d->rng) % k);
    unsigned x = idx[k - 1];
    idx[k - 1] = idx[j];
    idx[j] = x;
  }
  for (unsigned k = 0; k < n; k++) {
    unsigned i = idx[k];
    arming *a = d->last[i];
    int rc = weft_timer_cancel(d->t[i]);
    if (rc == 0) {
      d->n_cancelled++;
    } else if (rc == -EALREADY) {
      d->n_already++;
    } else {
      TU_CHECKF(false, "driver %u: weft_timer_cancel: %d (%s)", d->id, rc,
                weft_strerror(rc));
      d->failed = true;
    }
    a->cancel_rc = rc;
  }
  d->used += n;
  return n;
}

static void *foreign_driver(void *arg) {
  driver *d = arg;
  while (d->used < d->quota && !d->failed) {
    if (drive_batch(d) == 0 && !d->failed) {
      if (tu_now_ns() > d->deadline_ns) {
        TU_CHECKF(false,
                  "driver %u: handlers of fired timers did not run "
                  "within %d s",
                  d->id, TU_WAIT_S);
        break;
      }
      sched_yield();
    }
  }
  atomic_fetch_add(&g_drivers_done, 1);
  return NULL;
}

static void strand_driver(void *arg) {
  driver *d = arg;
  for (unsigned b = 0;
       b < STRAND_BATCHES_PER_TURN && d->used < d->quota && !d->failed; b++)
    if (drive_batch(d) == 0)
      break; /* nothing free: let the handlers run, come back later */
  if (d->used < d->quota && !d->failed) {
    if (tu_now_ns() > d->deadline_ns) {
      TU_CHECKF(false, "driver %u: did not finish within %d s", d->id,
                TU_WAIT_S);
    } else {
      int rc = weft_post(d->self, strand_driver, d);
      if (rc == 0)
        return;
      TU_CHECKF(false, "driver %u: re-post failed: %d (%s)", d->id, rc,
                weft_strerror(rc));
    }
  }
  atomic_fetch_add(&g_drivers_done, 1);
}

static void test_cancel_race(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("cancel race: setup");
  const uint64_t total = TU_SCALED(100000, 4000);
  tu_rt_create(&g_rt, NWORKERS, 0);
  for (unsigned i = 0; i < NTARGETS; i++)
    tu_strand_create(g_rt, &g_targets[i]);
  arming *arms = calloc(total, sizeof *arms);
  assert_non_null(arms);
  for (uint64_t i = 0; i < total; i++)
    atomic_init(&arms[i].calls, 0);
  atomic_store(&g_calls, 0);
  atomic_store(&g_drivers_done, 0);

  uint64_t off = 0;
  for (unsigned k = 0; k < NDRIVERS; k++) {
    driver *d = &g_drv[k];
    memset(d, 0, sizeof *d);
    d->id = k;
    d->quota = total / NDRIVERS + (k < total % NDRIVERS ? 1 : 0);
    d->arm = &arms[off];
    off += d->quota;
    d->rng = 0xC0FFEEull + k;
    d->deadline_ns = tu_deadline_ns(TU_WAIT_S);
    for (unsigned i = 0; i < RING; i++) {
      unsigned target = (unsigned)(tu_rand(&d->rng) % (NTARGETS + 1));
      d->target[i] = target < NTARGETS ? g_targets[target] : NULL;
      tu_assert_rc(weft_timer_create(g_rt, d->target[i], &d->t[i]), 0);
    }
  }
  assert_int_equal(off, total);

  tu_phase("cancel race: arming and cancelling");
  pthread_t th[2];
  for (unsigned k = 2; k < NDRIVERS; k++) {
    tu_strand_create(g_rt, &g_drv[k].self);
    tu_assert_rc(weft_post(g_drv[k].self, strand_driver, &g_drv[k]), 0);
  }
  for (unsigned k = 0; k < 2; k++)
    tu_thread_start(&th[k], foreign_driver, &g_drv[k]);
  for (unsigned k = 0; k < 2; k++)
    tu_thread_join(th[k], "foreign driver");
  tu_wait_count(&g_drivers_done, NDRIVERS, "every driver to finish");

  uint64_t cancelled = 0, already = 0;
  for (unsigned k = 0; k < NDRIVERS; k++) {
    assert_false(g_drv[k].failed);
    assert_int_equal(g_drv[k].used, g_drv[k].quota);
    cancelled += g_drv[k].n_cancelled;
    already += g_drv[k].n_already;
  }
  tu_phase("cancel race: waiting for the fired handlers");
  tu_wait_count(&g_calls, already, "the handlers of the fired armings");

  tu_phase("cancel race: shutdown");
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  for (unsigned k = 0; k < NDRIVERS; k++)
    for (unsigned i = 0; i < RING; i++)
      weft_timer_destroy(g_drv[k].t[i]);
  assert_int_equal(weft_rt_destroy(g_rt), 0);

  uint64_t bad = 0;
  for (uint64_t i = 0; i < total; i++) {
    arming *a = &arms[i];
    unsigned c = atomic_load(&a->calls);
    bool ok =
        (a->cancel_rc == 0 && c == 0) || (a->cancel_rc == -EALREADY && c == 1);
    if (!ok && bad++ < 10)
      print_error("arming %" PRIu64 ": cancel returned %d (%s) and the "
                  "handler ran %u times\n",
                  i, a->cancel_rc, weft_strerror(a->cancel_rc), c);
  }
  print_message("[ INFO     ] %" PRIu64 " armings: %" PRIu64
                " cancelled (0), %" PRIu64 " fired (-EALREADY)\n",
                total, cancelled, already);
  if (bad)
    fail_msg("%" PRIu64 " of %" PRIu64 " armings broke \"exactly one "
             "outcome\"",
             bad, total);
  assert_int_equal(cancelled + already, total);
  assert_int_equal(atomic_load(&g_calls), already);
  /* Deadlines of 0 fire at once and deadlines of 50 us cancelled at once
   * mostly do not fire: both outcomes must have occurred. */
  assert_true(cancelled > 0);
  assert_true(already > 0);
  free(arms);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------ re-arm while a firing is queued */

/* weft.h (weft_timer_start, weft_timer_cancel): a firing of an earlier
 * arming that has not started when the timer is started again, cancelled
 * or destroyed never runs. A firing of arming A is queued behind a gate on
 * strand S (the timer's strand), then, from the main thread:
 *   v0: cancel: returns 0 (it stopped A's handler);
 *   v1: re-armed as B, firing at once: B's firing is queued behind A's;
 *   v2: as v1 with another fn for B;
 *   v3: A periodic (1 ms), re-armed as B an hour away: A's firing does not
 *       run, nor re-arm the timer as A (also after several of its
 *       periods); cancel returns 0 afterwards (B was armed);
 *   v4: destroyed.
 * When the gate opens, A's handler is never called; B's (v1, v2) is called
 * once, through B's fn, on S. */
#define NVARIANTS 5

typedef struct rearm_arg {
  const char *name;
  weft_strand *strand;
  atomic_uint calls;
  atomic_uint wrong_strand;
  weft_timer_fn fn;     /* the fn its arming was started with */
  atomic_uint wrong_fn; /* calls through another fn */
} rearm_arg;

static void rearm_record(rearm_arg *a, weft_timer_fn self, int status) {
  TU_CHECKF(status == 0, "%s: status %d", a->name, status);
  if (self != a->fn)
    atomic_fetch_add(&a->wrong_fn, 1);
  if (weft_strand_current() != a->strand)
    atomic_fetch_add(&a->wrong_strand, 1);
  atomic_fetch_add(&a->calls, 1);
}

/* A's fn (and B's in v1, v3). */
static void rearm_handler(void *arg, int status, uint64_t missed) {
  (void)missed;
  rearm_record(arg, rearm_handler, status);
}

/* B's fn in v2. */
static void rearm_handler_b(void *arg, int status, uint64_t missed) {
  (void)missed;
  rearm_record(arg, rearm_handler_b, status);
}

static void mark_handler(void *arg) { atomic_fetch_add((tu_count *)arg, 1); }

static const char *const rearm_names[NVARIANTS] = {
    "cancelled", "re-armed, firing at once",
    "re-armed, firing at once, another fn", "A periodic, re-armed an hour away",
    "destroyed"};

static void test_rearm_while_queued(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("re-arm while a firing is queued");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  for (unsigned v = 0; v < NVARIANTS; v++) {
    tu_gate gate;
    tu_gate_init(&gate);
    tu_assert_rc(weft_post(s, tu_gate_handler, &gate), 0);
    tu_wait_count(&gate.entered, 1, "the gate handler");
    rearm_arg a = {.name = "A", .strand = s, .fn = rearm_handler};
    rearm_arg b = {.name = "B",
                   .strand = s,
                   .fn = v == 2 ? rearm_handler_b : rearm_handler};
    rearm_arg *x[2] = {&a, &b};
    for (unsigned k = 0; k < 2; k++) {
      atomic_init(&x[k]->calls, 0);
      atomic_init(&x[k]->wrong_strand, 0);
      atomic_init(&x[k]->wrong_fn, 0);
    }
    weft_timer *t;
    tu_assert_rc(weft_timer_create(rt, s, &t), 0);
    /* A: a past deadline fires at once, queued behind the gate */
    tu_assert_rc(
        weft_timer_start_at(t, 1, v == 3 ? 1000000 : 0, rearm_handler, &a), 0);
    unsigned want_b = 0;
    switch (v) {
    case 0:
      tu_assert_rc(weft_timer_cancel(t), 0); /* A's handler had not started */
      tu_assert_rc(weft_timer_cancel(t), -EALREADY);
      break;
    case 1:
      tu_assert_rc(weft_timer_start_at(t, 1, 0, rearm_handler, &b), 0);
      want_b = 1;
      break;
    case 2:
      tu_assert_rc(weft_timer_start_at(t, 1, 0, rearm_handler_b, &b), 0);
      want_b = 1;
      break;
    case 3:
      tu_assert_rc(weft_timer_start(t, 3600000000000ull, 0, rearm_handler, &b),
                   0);
      break;
    default:
      weft_timer_destroy(t);
      t = NULL;
      break;
    }
    tu_gate_open(&gate);
    /* A marker behind everything queued on the strand so far. */
    tu_count marks;
    atomic_init(&marks, 0);
    tu_assert_rc(weft_post(s, mark_handler, &marks), 0);
    tu_wait_count(&marks, 1, "the strand to drain");
    if (v == 3) {
      tu_sleep_ms(5); /* five of A's periods: a chance to re-arm, wrongly */
      tu_assert_rc(weft_timer_cancel(t), 0); /* B was still armed */
      tu_assert_rc(weft_post(s, mark_handler, &marks), 0);
      tu_wait_count(&marks, 2, "the strand to drain");
    }
    unsigned ac = atomic_load(&a.calls), bc = atomic_load(&b.calls);
    unsigned aw = atomic_load(&a.wrong_strand),
             bw = atomic_load(&b.wrong_strand);
    unsigned af = atomic_load(&a.wrong_fn), bf = atomic_load(&b.wrong_fn);
    weft_timer_destroy(t);
    tu_gate_destroy(&gate);
    if (ac != 0 || bc != want_b || aw || bw || af || bf)
      fail_msg("variant %u (%s) while arming A's firing was queued: handler "
               "called %u times with A's arg (expected 0) and %u times "
               "with B's (expected %u); calls through the other arming's "
               "fn: %u (A), %u (B); calls off the strand: %u (A), %u (B)",
               v, rearm_names[v], ac, bc, want_b, af, bf, aw, bw);
  }
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cancel_race),
      cmocka_unit_test(test_rearm_while_queued),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
