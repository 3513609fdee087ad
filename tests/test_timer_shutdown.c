/*
 * test_timer_shutdown: timers at weft_rt_shutdown.
 *
 * weft.h: status -ECANCELED: "the runtime is shutting down and the timer was
 * armed, or a firing was queued at a CANCEL shutdown; missed is 0. It is the
 * timer's last call." And for every handler accepted: it runs exactly once,
 * or (CANCEL) is cancelled exactly once.
 *
 * One runtime per mode (DRAIN, CANCEL), shut down from a foreign thread,
 * with:
 *  - 10^4 armed one-shot and periodic timers, far deadlines, on strands and
 *    on the runtime: each handler is called exactly once, with -ECANCELED
 *    and missed 0, on its strand;
 *  - periodic timers firing every 50-200 us (they have fired several times
 *    before the shutdown): any number of status-0 calls, then exactly one
 *    -ECANCELED call, the last;
 *  - firings queued behind a gate handler on a strand (one-shot and
 *    periodic, started with a past deadline so they fire at once), the gate
 *    opened once the shutdown has begun: CANCEL: exactly one call, with
 *    -ECANCELED (not 0); DRAIN: the queued firing runs (status 0), and a
 *    periodic one then gets its -ECANCELED as last call;
 *  - during the shutdown, weft_timer_start from the -ECANCELED handlers
 *    returns -ESHUTDOWN; the counts are complete when weft_rt_shutdown
 *    returns; afterwards weft_timer_start -> -ESHUTDOWN, weft_timer_create
 *    -> -ESHUTDOWN, weft_timer_cancel -> -EALREADY (nothing is armed).
 * A periodic timer without strand restarted while its firing is queued,
 * then a DRAIN shutdown: -ECANCELED once, though the stale firing settles
 * after the shutdown's cancel firing.
 * Then: timers started by a foreign thread while another thread shuts the
 * runtime down: each start that returned 0 gets exactly one call (status 0
 * or -ECANCELED), each that failed (-ESHUTDOWN) none. Half of these timers
 * run on the runtime, half on a strand; half start with a past deadline
 * (fire at once), half 100 us ahead (armed).
 */
#include "testutil.h"

#include <sched.h>

#define NWORKERS 4
#define NSTRANDS 4
#define NARMED 10000u
#define NREPEAT 16
#define NQUEUED 64
#define HOUR_NS 3600000000000ull

enum kind { K_ARMED, K_REPEAT, K_QUEUED };

typedef struct trec {
  weft_timer *t;
  weft_strand *strand;
  enum kind kind;
  bool periodic;
  atomic_uint ok;         /* status 0 calls */
  atomic_uint cancelled;  /* status -ECANCELED calls */
  atomic_uint after_last; /* calls after the -ECANCELED one */
  atomic_int start_rc;    /* weft_timer_start from the -ECANCELED call */
} trec;

static weft_rt *g_rt;

static void trec_handler(void *arg, int status, uint64_t missed) {
  trec *r = arg;
  TU_CHECKF(weft_strand_current() == r->strand,
            "kind %d: ran on strand %p, expected %p", (int)r->kind,
            (void *)weft_strand_current(), (void *)r->strand);
  if (atomic_load(&r->cancelled) != 0)
    atomic_fetch_add(&r->after_last, 1);
  if (status == 0) {
    atomic_fetch_add(&r->ok, 1);
  } else if (status == -ECANCELED) {
    TU_CHECKF(missed == 0, "-ECANCELED with missed %" PRIu64, missed);
    atomic_store(&r->start_rc,
                 weft_timer_start(r->t, HOUR_NS, 0, trec_handler, r));
    atomic_fetch_add(&r->cancelled, 1);
  } else {
    TU_CHECKF(false, "unexpected status %d (%s)", status,
              weft_strerror(status));
  }
}

static void trec_init(trec *r, weft_strand *s, enum kind k, bool periodic) {
  r->strand = s;
  r->kind = k;
  r->periodic = periodic;
  atomic_init(&r->ok, 0);
  atomic_init(&r->cancelled, 0);
  atomic_init(&r->after_last, 0);
  atomic_init(&r->start_rc, 1);
  tu_assert_rc(weft_timer_create(g_rt, s, &r->t), 0);
}

typedef struct shut_ctx {
  int how;
  atomic_int rc;
  atomic_bool returned;
} shut_ctx;

static void *shutdown_main(void *arg) {
  shut_ctx *c = arg;
  atomic_store(&c->rc, weft_rt_shutdown(g_rt, c->how));
  atomic_store(&c->returned, true);
  return NULL;
}

static void noop(void *arg) { (void)arg; }

static void noop_timer(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)status;
  (void)missed;
  TU_CHECKF(false, "a timer whose start failed was called");
}

static bool pred_shutting_down(void *ctx, char *buf, size_t len) {
  (void)ctx;
  int rc = weft_post_rt(g_rt, noop, NULL);
  snprintf(buf, len, "weft_post_rt returned %d", rc);
  return rc == -ESHUTDOWN;
}

static void check_rec(const trec *r, unsigned i, int how) {
  unsigned ok = atomic_load(&r->ok), x = atomic_load(&r->cancelled);
  unsigned after = atomic_load(&r->after_last);
  const char *mode = how == WEFT_SHUTDOWN_CANCEL ? "CANCEL" : "DRAIN";
  static const char *kinds[] = {"armed", "repeating", "queued"};
  /* A one-shot firing queued at a DRAIN shutdown is not armed: it just
   * runs. Every other timer here gets exactly one -ECANCELED call. */
  unsigned want_x =
      (r->kind == K_QUEUED && !r->periodic && how == WEFT_SHUTDOWN_DRAIN) ? 0
                                                                          : 1;
  if (x != want_x)
    fail_msg("%s: %s %s timer %u got %u -ECANCELED calls (and %u status 0), "
             "expected %u",
             mode, kinds[r->kind], r->periodic ? "periodic" : "one-shot", i, x,
             ok, want_x);
  if (after != 0)
    fail_msg("%s: %s timer %u was called %u times after its -ECANCELED call",
             mode, kinds[r->kind], i, after);
  if (want_x && atomic_load(&r->start_rc) != -ESHUTDOWN)
    fail_msg("%s: weft_timer_start from a -ECANCELED handler returned %d (%s),"
             " expected -ESHUTDOWN",
             mode, atomic_load(&r->start_rc),
             weft_strerror(atomic_load(&r->start_rc)));
  switch (r->kind) {
  case K_ARMED:
    if (ok != 0)
      fail_msg("%s: armed timer %u (far deadline) fired %u times", mode, i, ok);
    break;
  case K_REPEAT:
    if (ok < 3)
      fail_msg("%s: repeating timer %u: %u firings before the shutdown", mode,
               i, ok);
    break;
  case K_QUEUED:
    if (how == WEFT_SHUTDOWN_CANCEL && ok != 0)
      fail_msg("CANCEL: firing %u queued behind a gate ran with status 0 "
               "(%u times) instead of reporting -ECANCELED",
               i, ok);
    if (how == WEFT_SHUTDOWN_DRAIN && ok != 1)
      fail_msg("DRAIN: firing %u queued behind a gate ran %u times with "
               "status 0, expected once",
               i, ok);
    break;
  }
}

static void run_shutdown(int how) {
  tu_reset_async_errors();
  tu_rt_create(&g_rt, NWORKERS, 0);
  weft_strand *s[NSTRANDS];
  for (unsigned i = 0; i < NSTRANDS; i++)
    tu_strand_create(g_rt, &s[i]);
  const unsigned n = NARMED + NREPEAT + NQUEUED;
  trec *r = calloc(n, sizeof *r);
  assert_non_null(r);

  /* repeating periodic timers, on strands and on the runtime */
  tu_phase("shutdown: repeating timers");
  for (unsigned i = 0; i < NREPEAT; i++) {
    trec *x = &r[NARMED + i];
    trec_init(x, (i % 2) ? s[i % NSTRANDS] : NULL, K_REPEAT, true);
    tu_assert_rc(weft_timer_start(x->t, 0, 50000 + 10000 * i, trec_handler, x),
                 0);
  }
  for (unsigned i = 0; i < NREPEAT; i++) {
    trec *x = &r[NARMED + i];
    uint64_t dl = tu_deadline_ns(TU_WAIT_S);
    while (atomic_load(&x->ok) < 3) {
      if (tu_now_ns() > dl)
        fail_msg("repeating timer %u fired only %u times in %d s", i,
                 atomic_load(&x->ok), TU_WAIT_S);
      tu_sleep_ms(1);
    }
  }

  /* armed, far deadlines */
  tu_phase("shutdown: arming");
  for (unsigned i = 0; i < NARMED; i++) {
    trec *x = &r[i];
    weft_strand *st =
        (i % (NSTRANDS + 1)) < NSTRANDS ? s[i % (NSTRANDS + 1)] : NULL;
    trec_init(x, st, K_ARMED, (i % 7) == 0);
    tu_assert_rc(weft_timer_start(x->t, HOUR_NS + i * 1000ull,
                                  x->periodic ? HOUR_NS : 0, trec_handler, x),
                 0);
  }

  /* queued behind a gate */
  tu_phase("shutdown: queueing behind a gate");
  weft_strand *gated;
  tu_strand_create(g_rt, &gated);
  tu_gate gate;
  tu_gate_init(&gate);
  tu_assert_rc(weft_post(gated, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler to start");
  for (unsigned i = 0; i < NQUEUED; i++) {
    trec *x = &r[NARMED + NREPEAT + i];
    trec_init(x, gated, K_QUEUED, (i % 2) != 0);
    /* a past deadline fires at once: the firing is queued behind the gate */
    tu_assert_rc(weft_timer_start_at(x->t, 1, x->periodic ? HOUR_NS : 0,
                                     trec_handler, x),
                 0);
  }

  tu_phase("shutdown: shutting down");
  shut_ctx sc;
  sc.how = how;
  atomic_init(&sc.rc, 1);
  atomic_init(&sc.returned, false);
  pthread_t th;
  tu_thread_start(&th, shutdown_main, &sc);
  /* Posts fail once the shutdown has begun; then let the gate go. */
  tu_wait_until(pred_shutting_down, NULL, "the shutdown to begin");
  assert_false(atomic_load(&sc.returned)); /* the gate still holds it */
  tu_gate_open(&gate);
  tu_thread_join(th, "shutdown");
  tu_assert_rc(atomic_load(&sc.rc), 0);

  /* Complete when weft_rt_shutdown returned. */
  for (unsigned i = 0; i < n; i++)
    check_rec(&r[i], i, how);

  tu_phase("shutdown: after");
  weft_timer *fresh;
  tu_assert_rc(weft_timer_create(g_rt, NULL, &fresh), -ESHUTDOWN);
  tu_assert_rc(weft_timer_create(g_rt, s[0], &fresh), -ESHUTDOWN);
  for (unsigned i = 0; i < n; i++) {
    tu_assert_rc(weft_timer_cancel(r[i].t), -EALREADY);
    tu_assert_rc(weft_timer_start(r[i].t, 0, 0, noop_timer, NULL), -ESHUTDOWN);
    tu_assert_rc(weft_timer_start_at(r[i].t, 1, 1000, noop_timer, NULL),
                 -ESHUTDOWN);
  }
  for (unsigned i = 0; i < n; i++)
    weft_timer_destroy(r[i].t);
  for (unsigned i = 0; i < NSTRANDS; i++)
    weft_strand_release(s[i]);
  weft_strand_release(gated);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  for (unsigned i = 0; i < n; i++)
    check_rec(&r[i], i, how); /* nothing more came */
  tu_gate_destroy(&gate);
  free(r);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_shutdown_drain(void **state) {
  (void)state;
  run_shutdown(WEFT_SHUTDOWN_DRAIN);
}

static void test_shutdown_cancel(void **state) {
  (void)state;
  run_shutdown(WEFT_SHUTDOWN_CANCEL);
}

/* ------------------------- a stale firing settling after the last call */

/* A periodic timer without strand fires at once (its firing queued on the
 * runtime), is restarted far ahead (that firing now stale, still queued
 * behind the busy handler), and the runtime is shut down (DRAIN): the
 * shutdown's cancel firing may run before the stale one, on the other
 * worker. Its handler gets -ECANCELED exactly once, the stale firing's
 * settle adding no second "last call". The other worker, still searching
 * after the post woke it, may take the firing before the restart: its
 * call then started before the restart and goes on (weft_timer_start), so
 * that round shows nothing stale; it is run again on a new runtime, up to
 * 5 rounds, and at least one must have the firing go stale. */
static weft_timer *g_late_t;
static atomic_int g_late_ok, g_late_early, g_late_cancel, g_late_ready;

static void late_fn(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  if (status == -ECANCELED)
    atomic_fetch_add(&g_late_cancel, 1);
  else /* a call before the restart returned, or a stale one */
    atomic_fetch_add(atomic_load(&g_late_ready) ? &g_late_ok : &g_late_early,
                     1);
}

static void late_restart(void *arg) {
  (void)arg;
  TU_CHECK_RC(weft_timer_start_at(g_late_t, 1, 1000000000, late_fn, NULL), 0);
  TU_CHECK_RC(
      weft_timer_start(g_late_t, 10000000000ull, 1000000000, late_fn, NULL), 0);
  atomic_store(&g_late_ready, 1);
  /* Busy until the cancel firing has run and settled. */
  uint64_t end = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&g_late_cancel) && tu_now_ns() < end) {
  }
  end = tu_now_ns() + 20000000;
  while (tu_now_ns() < end) {
  }
}

/* One round; whether its firing went stale (was not taken before). */
static bool stale_round(void) {
  atomic_store(&g_late_ok, 0);
  atomic_store(&g_late_early, 0);
  atomic_store(&g_late_cancel, 0);
  atomic_store(&g_late_ready, 0);
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  c.flags = WEFT_CONFIG_NO_MONITOR;
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, &c), 0);
  tu_assert_rc(weft_timer_create(rt, NULL, &g_late_t), 0);
  tu_assert_rc(weft_post_rt(rt, late_restart, NULL), 0);
  while (!atomic_load(&g_late_ready))
    tu_sleep_ms(1);
  tu_sleep_ms(1);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(atomic_load(&g_late_cancel), 1);
  assert_int_equal(atomic_load(&g_late_ok), 0);
  assert_in_range(atomic_load(&g_late_early), 0, 1);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  return !atomic_load(&g_late_early);
}

static void test_stale_after_last_call(void **state) {
  (void)state;
  tu_reset_async_errors();
  int round = 1;
  while (!stale_round() && round < 5)
    round++;
  print_message("the firing went stale in round %d\n", round);
  assert_int_equal(atomic_load(&g_late_early), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------- starts racing the shutdown */

#define RACE_THREADS 4
#define RACE_PER_THREAD 128
#define RACE_TIMERS (RACE_THREADS * RACE_PER_THREAD)

typedef struct race {
  weft_timer *t[RACE_TIMERS];
  int rc[RACE_TIMERS];
  atomic_uint calls[RACE_TIMERS];
  tu_count started; /* starts attempted so far, all threads */
  atomic_bool go;
} race;

typedef struct race_arg {
  race *x;
  unsigned first;
} race_arg;

static void race_handler(void *arg, int status, uint64_t missed) {
  (void)missed;
  TU_CHECKF(status == 0 || status == -ECANCELED, "status %d", status);
  atomic_fetch_add((atomic_uint *)arg, 1);
}

static void *race_starter(void *arg) {
  race_arg *a = arg;
  race *x = a->x;
  while (!atomic_load(&x->go))
    sched_yield();
  for (unsigned i = a->first; i < a->first + RACE_PER_THREAD; i++) {
    /* past deadlines fire at once, the others are armed */
    x->rc[i] =
        (i % 2)
            ? weft_timer_start_at(x->t[i], 1, 0, race_handler, &x->calls[i])
            : weft_timer_start(x->t[i], 100000, 0, race_handler, &x->calls[i]);
    atomic_fetch_add(&x->started, 1);
  }
  return NULL;
}

static void test_start_racing_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("starts racing the shutdown");
  const unsigned rounds = (unsigned)TU_SCALED(1000, 100);
  race *x = calloc(1, sizeof *x);
  assert_non_null(x);
  uint64_t rng = 0x5157u, lost = 0, extra = 0, accepted = 0, refused = 0;
  uint64_t lost_past = 0; /* of lost: started with a past deadline */
  unsigned bad_rounds = 0;
  for (unsigned round = 0; round < rounds; round++) {
    tu_rt_create(&g_rt, 2, 0);
    weft_strand *rs;
    tu_strand_create(g_rt, &rs);
    for (unsigned i = 0; i < RACE_TIMERS; i++) {
      /* i % 4: 0, 1 on the runtime; 2, 3 on the strand */
      tu_assert_rc(weft_timer_create(g_rt, (i % 4) >= 2 ? rs : NULL, &x->t[i]),
                   0);
      atomic_init(&x->calls[i], 0);
      x->rc[i] = 1;
    }
    atomic_store(&x->started, 0);
    atomic_store(&x->go, false);
    pthread_t th[RACE_THREADS];
    race_arg ra[RACE_THREADS];
    for (unsigned k = 0; k < RACE_THREADS; k++) {
      ra[k].x = x;
      ra[k].first = k * RACE_PER_THREAD;
      tu_thread_start(&th[k], race_starter, &ra[k]);
    }
    atomic_store(&x->go, true);
    /* shut down somewhere in the middle of the starts (a spin: the
     * starters are quick) */
    uint64_t when = tu_rand(&rng) % (RACE_TIMERS / 2);
    uint64_t dl = tu_deadline_ns(TU_WAIT_S);
    while (atomic_load(&x->started) < when) {
      if (tu_now_ns() > dl)
        fail_msg("the starters made no progress in %d s", TU_WAIT_S);
      sched_yield();
    }
    tu_assert_rc(weft_rt_shutdown(g_rt, (round % 2) ? WEFT_SHUTDOWN_CANCEL
                                                    : WEFT_SHUTDOWN_DRAIN),
                 0);
    for (unsigned k = 0; k < RACE_THREADS; k++)
      tu_thread_join(th[k], "a starter");
    for (unsigned i = 0; i < RACE_TIMERS; i++)
      weft_timer_destroy(x->t[i]);
    weft_strand_release(rs);
    assert_int_equal(weft_rt_destroy(g_rt), 0);
    uint64_t lost0 = lost, extra0 = extra;
    for (unsigned i = 0; i < RACE_TIMERS; i++) {
      unsigned c = atomic_load(&x->calls[i]);
      if (x->rc[i] == 0) {
        accepted++;
        if (c == 0) {
          lost++;
          lost_past += i % 2;
        } else if (c > 1)
          extra++;
      } else {
        if (x->rc[i] != -ESHUTDOWN)
          fail_msg("weft_timer_start returned %d (%s)", x->rc[i],
                   weft_strerror(x->rc[i]));
        refused++;
        if (c != 0)
          extra++;
      }
    }
    bad_rounds += lost != lost0 || extra != extra0;
  }
  print_message("[ INFO     ] %u rounds: %" PRIu64 " starts accepted, %" PRIu64
                " refused\n",
                rounds, accepted, refused);
  if (lost || extra)
    fail_msg("starts racing a shutdown, in %u of %u rounds: %" PRIu64
             " accepted armings never called their handler (%" PRIu64
             " of them started with a past deadline), %" PRIu64
             " handlers called wrongly",
             bad_rounds, rounds, lost, lost_past, extra);
  free(x);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shutdown_drain),
      cmocka_unit_test(test_shutdown_cancel),
      cmocka_unit_test(test_start_racing_shutdown),
      cmocka_unit_test(test_stale_after_last_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
