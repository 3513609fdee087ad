/*
 * test_timer_stale: on a timer's own strand, no handler call of an earlier
 * arming runs once weft_timer_start or weft_timer_cancel has returned.
 *
 * weft.h (weft_timer_cancel): "on the timer's own strand, once cancel (or
 * start) returns, no handler of an earlier arming runs".
 *
 * Four strands, each with a timer on it and a driver handler that re-posts
 * itself. Each driver turn makes a few random operations on its timer and
 * spins 0-10 us between them, so firings are queued behind the driver
 * while it re-arms and cancels: start one-shot (a past deadline: its firing
 * is queued at once, behind this handler), start one-shot 0-20 us away,
 * start periodic (2-20 us), cancel. Each arming has a number, passed as the
 * handler's arg; the strand keeps the number of the arming whose handler
 * may be called (none once a one-shot has been called, or after a cancel
 * or a re-start). A call with any other number is stale. Checked:
 *   - zero stale calls, 10^5 operations (scaled);
 *   - cancel right after a past-deadline start returns 0 (the firing is
 *     queued and cannot have started: this handler holds the strand);
 *   - cancel returns -EALREADY only when no call was due, 0 only when one
 *     was;
 *   - handlers were called at all (the timers did fire in between).
 */
#include "testutil.h"

#define NSTRANDS 4
#define OPS_PER_TURN 8

typedef struct drv {
  weft_strand *s;
  weft_timer *t;
  uint64_t rng;
  uint64_t seq;    /* last arming number given */
  uint64_t expect; /* arming whose handler may be called, 0: none */
  bool periodic;   /* expect's arming is periodic */
  uint64_t ops, quota;
  uint64_t calls, stale, queued_cancels;
  uint64_t deadline_ns;
} drv;

static drv g_d[NSTRANDS];
static tu_count g_done;

static void on_fire(void *arg, int status, uint64_t missed) {
  (void)missed;
  drv *d = NULL;
  for (unsigned i = 0; i < NSTRANDS; i++)
    if (weft_strand_current() == g_d[i].s)
      d = &g_d[i];
  TU_CHECKF(d != NULL, "timer handler off its strand");
  if (!d)
    return;
  TU_CHECKF(status == 0, "status %d (%s)", status, weft_strerror(status));
  uint64_t id = (uint64_t)(uintptr_t)arg;
  d->calls++;
  if (id != d->expect || id == 0) {
    if (d->stale++ < 5)
      TU_CHECKF(false, "stale call: arming %" PRIu64 ", current %" PRIu64, id,
                d->expect);
    return;
  }
  if (!d->periodic)
    d->expect = 0;
}

static void arm(drv *d, uint64_t deadline, uint64_t period) {
  uint64_t id = ++d->seq;
  int rc = weft_timer_start_at(d->t, deadline, period, on_fire,
                               (void *)(uintptr_t)id);
  TU_CHECKF(rc == 0, "start: %d (%s)", rc, weft_strerror(rc));
  d->expect = rc == 0 ? id : 0;
  d->periodic = period != 0;
}

static void cancel(drv *d) {
  int rc = weft_timer_cancel(d->t);
  /* A periodic arming that has fired and been settled is re-armed: 0. */
  if (!d->periodic) {
    TU_CHECKF(rc == (d->expect ? 0 : -EALREADY),
              "cancel returned %d with %s due", rc,
              d->expect ? "a call" : "no call");
  } else {
    TU_CHECKF(rc == 0 || rc == -EALREADY, "cancel: %d", rc);
  }
  d->expect = 0;
  d->periodic = false;
}

static void spin(drv *d) {
  uint64_t until = weft_now_ns() + tu_rand(&d->rng) % 10001;
  while (weft_now_ns() < until) {
  }
}

static void driver(void *arg) {
  drv *d = arg;
  for (unsigned k = 0; k < OPS_PER_TURN && d->ops < d->quota; k++, d->ops++) {
    uint64_t r = tu_rand(&d->rng);
    switch (r % 5) {
    case 0: /* queued at once, then cancelled while queued */
      arm(d, 1, 0);
      int rc = weft_timer_cancel(d->t);
      TU_CHECKF(rc == 0, "cancel of a queued firing: %d", rc);
      d->expect = 0;
      d->queued_cancels++;
      break;
    case 1:
      arm(d, 1, 0);
      break;
    case 2:
      arm(d, weft_now_ns() + (r >> 8) % 20001, 0);
      break;
    case 3:
      arm(d, weft_now_ns() + 2000, 2000 + (r >> 8) % 18001);
      break;
    default:
      cancel(d);
      break;
    }
    spin(d);
  }
  if (d->ops < d->quota && tu_now_ns() < d->deadline_ns) {
    int rc = weft_post(d->s, driver, d);
    TU_CHECKF(rc == 0, "re-post: %d", rc);
    if (rc == 0)
      return;
  }
  cancel(d);
  atomic_fetch_add(&g_done, 1);
}

static void test_no_stale_on_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("stale: setup");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  const uint64_t total = TU_SCALED(100000, 4000);
  atomic_store(&g_done, 0);
  for (unsigned i = 0; i < NSTRANDS; i++) {
    drv *d = &g_d[i];
    memset(d, 0, sizeof(*d));
    d->rng = 0x5EED0000ull + i;
    d->quota = total / NSTRANDS;
    d->deadline_ns = tu_deadline_ns(TU_WAIT_S);
    tu_strand_create(rt, &d->s);
    tu_assert_rc(weft_timer_create(rt, d->s, &d->t), 0);
  }
  tu_phase("stale: racing");
  for (unsigned i = 0; i < NSTRANDS; i++)
    tu_assert_rc(weft_post(g_d[i].s, driver, &g_d[i]), 0);
  tu_wait_count(&g_done, NSTRANDS, "every driver to finish");
  /* Whatever is still queued behind the drivers runs before the drain
   * ends; it must be stale-free too. */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  uint64_t ops = 0, calls = 0, stale = 0, qc = 0;
  for (unsigned i = 0; i < NSTRANDS; i++) {
    ops += g_d[i].ops;
    calls += g_d[i].calls;
    stale += g_d[i].stale;
    qc += g_d[i].queued_cancels;
    weft_timer_destroy(g_d[i].t);
    weft_strand_release(g_d[i].s);
  }
  assert_int_equal(weft_rt_destroy(rt), 0);
  print_message("[ INFO     ] %" PRIu64 " operations, %" PRIu64
                " handler calls, %" PRIu64
                " cancels of a queued firing, %" PRIu64 " stale calls\n",
                ops, calls, qc, stale);
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(ops, total / NSTRANDS * NSTRANDS);
  assert_int_equal(stale, 0);
  assert_true(calls > 0);
  assert_true(qc > 0);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_stale_on_strand),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
