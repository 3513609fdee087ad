/*
 * test_timer_churn: creating, arming, cancelling and destroying many timers.
 *
 *  - 10^6 (scaled) timers in batches of 10^4 live: created on strands or
 *    the runtime, started with a far deadline (about an hour), then per batch
 *    one of: cancel (returns 0 every time) then destroy; destroy while armed;
 *    re-arm then cancel (0, then -EALREADY) then destroy. Half of the
 *    batches from a foreign thread, half from a handler, so timers are made
 *    and freed through both the shards' caches and the shared depot. No
 *    handler ever runs. Memory: the heap in use after the churn is not more
 *    than a few MB above what it was after the first batches (10^6 leaked
 *    timers would be 64 MB); ASan/LSan check the rest at exit.
 *  - Destroy of an armed timer never fires it: a handler on strand S arms a
 *    timer on S with a deadline of 0-50 us, lingers 0-30 us and destroys it.
 *    If it fired meanwhile, the firing is queued behind that handler (S is
 *    busy), so it had not started and must be dropped. Likewise for firings
 *    queued behind a gate on a strand, destroyed from a foreign thread.
 *  - Destroy from within its own handler: a one-shot timer, and a periodic
 *    one (no firing after it), on strands and on the runtime, many times.
 */
#include "testutil.h"

#include <malloc.h>
#include <sched.h>

#define LIVE 10000u
#define NSTRANDS 4
#define HOUR_NS 3600000000000ull

static weft_rt *g_rt;
static weft_strand *g_strands[NSTRANDS];
static tu_count g_never_calls;

static void never_handler(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECKF(false,
            "a timer that was cancelled or destroyed while armed was "
            "called (status %d)",
            status);
  atomic_fetch_add(&g_never_calls, 1);
}

static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* ------------------------------------------------------------- the churn */

typedef struct churn_batch {
  weft_timer **t;
  unsigned n;
  unsigned mode; /* 0: cancel+destroy, 1: destroy armed, 2: re-arm+cancel */
  uint64_t rng;
  unsigned errors;
  tu_count done;
} churn_batch;

static void churn_once(churn_batch *b) {
  for (unsigned i = 0; i < b->n; i++) {
    uint64_t r = tu_rand(&b->rng);
    weft_strand *s =
        (r % (NSTRANDS + 1)) < NSTRANDS ? g_strands[r % (NSTRANDS + 1)] : NULL;
    int rc = weft_timer_create(g_rt, s, &b->t[i]);
    if (rc != 0) {
      TU_CHECKF(false, "weft_timer_create: %d (%s)", rc, weft_strerror(rc));
      b->errors++;
      b->n = i;
      break;
    }
  }
  for (unsigned i = 0; i < b->n; i++) {
    uint64_t r = tu_rand(&b->rng);
    int rc = weft_timer_start(b->t[i], HOUR_NS + (r >> 20) % HOUR_NS, 0,
                              never_handler, NULL);
    if (rc != 0) {
      TU_CHECKF(false, "weft_timer_start: %d (%s)", rc, weft_strerror(rc));
      b->errors++;
    }
  }
  if (b->mode == 2) {
    for (unsigned i = 0; i < b->n; i++) {
      int rc = weft_timer_start(b->t[i], 2 * HOUR_NS, 0, never_handler, NULL);
      if (rc != 0) {
        TU_CHECKF(false, "re-arm: %d (%s)", rc, weft_strerror(rc));
        b->errors++;
      }
    }
  }
  for (unsigned i = 0; i < b->n; i++) {
    if (b->mode != 1) {
      int rc = weft_timer_cancel(b->t[i]);
      if (rc != 0) {
        if (b->errors++ < 5)
          TU_CHECKF(false,
                    "cancel of an armed timer (mode %u) returned %d "
                    "(%s), expected 0",
                    b->mode, rc, weft_strerror(rc));
      }
      rc = weft_timer_cancel(b->t[i]);
      if (rc != -EALREADY) {
        if (b->errors++ < 5)
          TU_CHECKF(false,
                    "second cancel returned %d (%s), expected "
                    "-EALREADY",
                    rc, weft_strerror(rc));
      }
    }
    weft_timer_destroy(b->t[i]);
  }
}

static void churn_handler(void *arg) {
  churn_batch *b = arg;
  churn_once(b);
  atomic_fetch_add(&b->done, 1);
}

static void test_churn(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("churn");
  const uint64_t total = TU_SCALED(1000000, 4 * LIVE);
  const uint64_t batches = (total + LIVE - 1) / LIVE;
  tu_rt_create(&g_rt, 2, 0);
  for (unsigned i = 0; i < NSTRANDS; i++)
    tu_strand_create(g_rt, &g_strands[i]);
  weft_strand *runner;
  tu_strand_create(g_rt, &runner);
  atomic_store(&g_never_calls, 0);
  churn_batch b;
  memset(&b, 0, sizeof b);
  b.t = calloc(LIVE, sizeof *b.t);
  assert_non_null(b.t);
  b.rng = 0xC4u;
  size_t heap_base = 0;
  uint64_t made = 0;
  for (uint64_t k = 0; k < batches; k++) {
    b.n = (unsigned)(total - made < LIVE ? total - made : LIVE);
    b.mode = (unsigned)(k % 3);
    if (k % 2) {
      churn_once(&b); /* foreign thread */
    } else {
      atomic_store(&b.done, 0);
      tu_assert_rc(weft_post(runner, churn_handler, &b), 0);
      tu_wait_count(&b.done, 1, "a churn batch in a handler");
    }
    if (b.errors)
      fail_msg("batch %" PRIu64 " (mode %u): %u errors", k, b.mode, b.errors);
    made += b.n;
    if (k == 3)
      heap_base = heap_in_use(); /* caches and pools have warmed up */
  }
  assert_int_equal(made, total);
  size_t heap_end = heap_in_use();
  print_message("[ INFO     ] %" PRIu64 " timers; heap in use %zu KB after "
                "4 batches, %zu KB at the end\n",
                made, heap_base / 1024, heap_end / 1024);
  /* 10^4 live timers are 640 KB; leaking would grow by 64 B per timer. */
  if (heap_base && heap_end > heap_base + 8u * 1024 * 1024)
    fail_msg("heap grew from %zu KB to %zu KB over %" PRIu64
             " timers: timers are not reused",
             heap_base / 1024, heap_end / 1024, made);
  weft_strand_release(runner);
  for (unsigned i = 0; i < NSTRANDS; i++)
    weft_strand_release(g_strands[i]);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  assert_int_equal(atomic_load(&g_never_calls), 0);
  free(b.t);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------- destroy armed: never fires it */

typedef struct destroy_job {
  weft_strand *self;
  uint64_t n, rng;
  tu_count done;
} destroy_job;

static void destroy_armed_handler(void *arg) {
  destroy_job *j = arg;
  for (uint64_t i = 0; i < j->n; i++) {
    weft_timer *t;
    /* on our own strand: a firing is queued behind this handler */
    int rc = weft_timer_create(g_rt, j->self, &t);
    if (rc != 0) {
      TU_CHECKF(false, "create: %d", rc);
      break;
    }
    uint64_t r = tu_rand(&j->rng);
    rc = weft_timer_start(t, r % 50001, (r >> 40) % 2 ? 1000000 : 0,
                          never_handler, NULL);
    TU_CHECKF(rc == 0, "start: %d", rc);
    uint64_t until = weft_now_ns() + (r >> 20) % 30001;
    while (weft_now_ns() < until) {
    }
    weft_timer_destroy(t);
  }
  atomic_fetch_add(&j->done, 1);
}

static void test_destroy_armed_never_fires(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("destroy armed timers");
  atomic_store(&g_never_calls, 0);
  tu_rt_create(&g_rt, 2, 0);
  /* from handlers: two strands at once */
  destroy_job j[2];
  for (unsigned k = 0; k < 2; k++) {
    memset(&j[k], 0, sizeof j[k]);
    tu_strand_create(g_rt, &j[k].self);
    j[k].n = TU_SCALED(10000, 1000);
    j[k].rng = 0xDE57u + k;
    tu_assert_rc(weft_post(j[k].self, destroy_armed_handler, &j[k]), 0);
  }
  for (unsigned k = 0; k < 2; k++)
    tu_wait_count(&j[k].done, 1, "the destroying handler");

  /* from a foreign thread: firings queued behind a gate are dropped */
  weft_strand *gated;
  tu_strand_create(g_rt, &gated);
  tu_gate gate;
  tu_gate_init(&gate);
  tu_assert_rc(weft_post(gated, tu_gate_handler, &gate), 0);
  tu_wait_count(&gate.entered, 1, "the gate handler");
  enum { NQ = 200 };
  weft_timer *q[NQ];
  for (unsigned i = 0; i < NQ; i++) {
    tu_assert_rc(weft_timer_create(g_rt, gated, &q[i]), 0);
    /* a past deadline fires at once: queued behind the gate */
    tu_assert_rc(weft_timer_start_at(q[i], 1, (i % 2) ? 1000000 : 0,
                                     never_handler, NULL),
                 0);
    if (i % 4 < 2) /* fired, its handler not started: cancel drops it */
      tu_assert_rc(weft_timer_cancel(q[i]), 0);
  }
  for (unsigned i = 0; i < NQ; i++)
    weft_timer_destroy(q[i]);
  tu_gate_open(&gate);
  tu_wait_count(&gate.passed, 1, "the gate handler to finish");

  for (unsigned k = 0; k < 2; k++)
    weft_strand_release(j[k].self);
  weft_strand_release(gated);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  tu_gate_destroy(&gate);
  assert_int_equal(atomic_load(&g_never_calls), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* --------------------------------------- destroy from its own handler */

#define SELF_FIRINGS 3

typedef struct self_ctx {
  weft_timer *t;
  weft_strand *strand;
  bool periodic;
  unsigned calls; /* only its own handler touches it */
  tu_count *finished;
  tu_count *bad;
} self_ctx;

static void self_destroying(void *arg, int status, uint64_t missed) {
  (void)missed;
  self_ctx *c = arg;
  if (status != 0 || weft_strand_current() != c->strand) {
    TU_CHECKF(false, "status %d, strand %p (expected %p)", status,
              (void *)weft_strand_current(), (void *)c->strand);
    atomic_fetch_add(c->bad, 1);
    return;
  }
  c->calls++;
  if (c->calls > (c->periodic ? SELF_FIRINGS : 1u)) {
    TU_CHECKF(false, "called %u times, after it destroyed itself", c->calls);
    atomic_fetch_add(c->bad, 1);
    return;
  }
  if (!c->periodic || c->calls == SELF_FIRINGS) {
    weft_timer_destroy(c->t);
    atomic_fetch_add(c->finished, 1);
  }
}

static void test_destroy_in_own_handler(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("destroy from its own handler");
  tu_rt_create(&g_rt, 2, 0);
  weft_strand *s[2];
  for (unsigned i = 0; i < 2; i++)
    tu_strand_create(g_rt, &s[i]);
  const unsigned rounds = (unsigned)TU_SCALED(200, 20);
  enum { PER_ROUND = 64 };
  self_ctx *c = calloc(PER_ROUND, sizeof *c);
  assert_non_null(c);
  tu_count finished, bad;
  atomic_init(&bad, 0);
  size_t heap_base = 0;
  for (unsigned r = 0; r < rounds; r++) {
    atomic_init(&finished, 0);
    for (unsigned i = 0; i < PER_ROUND; i++) {
      self_ctx *x = &c[i];
      x->strand = (i % 3) < 2 ? s[i % 3] : NULL;
      x->periodic = (i % 2) != 0;
      x->calls = 0;
      x->finished = &finished;
      x->bad = &bad;
      tu_assert_rc(weft_timer_create(g_rt, x->strand, &x->t), 0);
      tu_assert_rc(weft_timer_start(x->t, (i % 4) * 100000,
                                    x->periodic ? 200000 : 0, self_destroying,
                                    x),
                   0);
    }
    tu_wait_count(&finished, PER_ROUND, "the timers to destroy themselves");
    if (r == 2)
      heap_base = heap_in_use();
  }
  /* Give destroyed periodic timers a few periods to (wrongly) fire again;
   * the handler checks. */
  tu_sleep_ms(5);
  size_t heap_end = heap_in_use();
  if (heap_base && heap_end > heap_base + 4u * 1024 * 1024)
    fail_msg("heap grew from %zu KB to %zu KB", heap_base / 1024,
             heap_end / 1024);
  for (unsigned i = 0; i < 2; i++)
    weft_strand_release(s[i]);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  assert_int_equal(atomic_load(&bad), 0);
  for (unsigned i = 0; i < PER_ROUND; i++)
    assert_int_equal(c[i].calls, c[i].periodic ? SELF_FIRINGS : 1);
  free(c);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_churn),
      cmocka_unit_test(test_destroy_armed_never_fires),
      cmocka_unit_test(test_destroy_in_own_handler),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
