/*
 * test_shutdown: weft_rt_shutdown and weft_rt_destroy keep the promise that
 * every accepted handler runs exactly once, or its cancel function runs
 * exactly once instead; either way a handler that did not run is counted in
 * stats.handlers_cancelled.
 *
 *  - 10^4 handlers pending behind gates (one gate handler per worker, each on
 *    its own strand, so every worker is held), posted from a foreign thread
 *    to the gated strands, to other strands and with weft_post_rt, some with
 *    cancel functions, some without; then weft_rt_shutdown from a foreign
 *    thread:
 *      DRAIN:  every one ran exactly once, no cancel function ran;
 *      CANCEL: each ran or was cancelled, exactly once; those queued behind a
 *              gate had provably not started, so they were all cancelled;
 *              those not run (cancel function or none) equal
 *              stats.handlers_cancelled.
 *    While the shutdown waits: posts fail with -ESHUTDOWN (also from
 *    handlers), a second shutdown fails with -EALREADY, and the first does
 *    not return while handlers are still running.
 *  - From a handler: shutdown without NOWAIT -> -EDEADLK, destroy ->
 *    -EDEADLK, and neither started anything; with NOWAIT it works and
 *    weft_rt_destroy from the main thread then completes.
 *  - weft_rt_destroy without a shutdown cancels what is pending.
 *  - weft_rt_destroy while other threads are inside weft_rt_shutdown
 *    (DRAIN) and weft_rt_wait, asleep there (and made SCHED_IDLE, so that
 *    they wake late): it returns only after they have, each with 0 (ASan:
 *    a waiter touching the freed runtime is a use after free).
 *  - From a blocking job: shutdown without NOWAIT, wait and destroy give
 *    -EDEADLK (the job counts as work the shutdown waits for).
 */
#include <sched.h>
#include <sys/syscall.h>
#include "testutil.h"

#define NWORKERS 4
#define NPLAIN 8

/* ------------------------------------------------------------ bookkeeping */

enum kind { K_GATED, K_PLAIN, K_RT, K_KINDS };

typedef struct item {
  unsigned idx;
  enum kind kind;
  bool has_cancel;
  bool posts; /* tries a post from inside the handler */
  atomic_uint ran;
  atomic_uint cancelled;
  atomic_int post_rc;
} item;

static weft_rt *g_rt;
static item *g_items;
static unsigned g_nitems;

/* posts that were accepted by accident (before the shutdown) still count */
static tu_count g_extra_accepted, g_extra_ran, g_extra_cancelled;

static void extra_run(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_extra_ran, 1);
}

static void extra_cancel(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_extra_cancelled, 1);
}

static void item_run(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  if (it->posts) {
    int rc = weft_post_rt_ex(g_rt, extra_run, extra_cancel, NULL);
    if (rc == 0)
      atomic_fetch_add(&g_extra_accepted, 1);
    atomic_store(&it->post_rc, rc);
  }
}

static void item_cancel(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->cancelled, 1);
}

static void items_alloc(unsigned n) {
  g_nitems = n;
  g_items = calloc(n, sizeof *g_items);
  assert_non_null(g_items);
  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    it->idx = i;
    atomic_init(&it->ran, 0);
    atomic_init(&it->cancelled, 0);
    atomic_init(&it->post_rc, 1); /* 1: never set */
  }
  atomic_store(&g_extra_accepted, 0);
  atomic_store(&g_extra_ran, 0);
  atomic_store(&g_extra_cancelled, 0);
}

/* ------------------------------------------- pending handlers at shutdown */

typedef struct pending_ctx {
  weft_strand *gated[NWORKERS];
  weft_strand *plain[NPLAIN];
  int mode;
  /* shutdown thread */
  atomic_int shutdown_rc;
  atomic_bool shutdown_returned;
} pending_ctx;

static void *poster_main(void *arg) {
  pending_ctx *c = arg;
  for (unsigned i = 0; i < g_nitems; i++) {
    item *it = &g_items[i];
    int rc;
    switch (it->kind) {
    case K_GATED:
    case K_PLAIN: {
      weft_strand *s =
          it->kind == K_GATED ? c->gated[i % NWORKERS] : c->plain[i % NPLAIN];
      if (it->has_cancel)
        rc = weft_post_ex(s, item_run, item_cancel, it);
      else if (i % 2)
        rc = weft_post(s, item_run, it);
      else
        rc = weft_post_ex(s, item_run, NULL, it);
      break;
    }
    default:
      if (it->has_cancel)
        rc = weft_post_rt_ex(g_rt, item_run, item_cancel, it);
      else if (i % 2)
        rc = weft_post_rt(g_rt, item_run, it);
      else
        rc = weft_post_rt_ex(g_rt, item_run, NULL, it);
      break;
    }
    if (rc != 0) {
      TU_CHECKF(false, "posting item %u failed: %d (%s)", i, rc,
                weft_strerror(rc));
      return NULL;
    }
  }
  return NULL;
}

static void *shutdown_main(void *arg) {
  pending_ctx *c = arg;
  int rc = weft_rt_shutdown(g_rt, c->mode);
  atomic_store(&c->shutdown_rc, rc);
  atomic_store(&c->shutdown_returned, true);
  return NULL;
}

static void noop(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a handler whose post was refused ran");
}

static void run_pending(int mode) {
  tu_reset_async_errors();
  tu_phase(mode == WEFT_SHUTDOWN_DRAIN ? "pending/DRAIN setup"
                                       : "pending/CANCEL setup");
  static pending_ctx ctx;
  pending_ctx *c = &ctx;
  memset(c, 0, sizeof *c);
  c->mode = mode;
  atomic_init(&c->shutdown_rc, 1);
  atomic_init(&c->shutdown_returned, false);

  tu_rt_create(&g_rt, NWORKERS, 0);
  for (unsigned i = 0; i < NWORKERS; i++)
    tu_strand_create(g_rt, &c->gated[i]);
  for (unsigned i = 0; i < NPLAIN; i++)
    tu_strand_create(g_rt, &c->plain[i]);

  /* Hold every worker: one gate handler per worker, each on its own strand
   * (a held worker cannot take a second one, so all NWORKERS get taken). */
  tu_gate gate;
  tu_gate_init(&gate);
  for (unsigned i = 0; i < NWORKERS; i++)
    assert_int_equal(weft_post(c->gated[i], tu_gate_handler, &gate), 0);
  tu_phase("waiting for every worker to enter its gate");
  tu_wait_count(&gate.entered, NWORKERS, "gate handlers to start");

  /* 10^4 handlers, posted from a foreign thread. */
  unsigned n = 10000;
  items_alloc(n);
  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    it->kind = (enum kind)(i % K_KINDS);
    it->has_cancel = (i % 3) != 0;
    it->posts = (i % 10) == 0;
  }
  tu_phase("posting the pending handlers");
  pthread_t th;
  tu_thread_start(&th, poster_main, c);
  tu_thread_join(th, "poster");
  TU_ASSERT_NO_ASYNC_ERRORS();

  /* Shut down from a foreign thread. It cannot finish: the gate handlers
   * run until we open the gate, and running handlers are never interrupted. */
  tu_phase("starting the shutdown");
  tu_thread_start(&th, shutdown_main, c);

  /* Wait until it has started: from then on every post fails. Posts
   * accepted before that are extra work and are counted. */
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    int rc = weft_post_rt_ex(g_rt, extra_run, extra_cancel, NULL);
    if (rc == -ESHUTDOWN)
      break;
    if (rc != 0)
      fail_msg("weft_post_rt_ex during shutdown returned %d (%s), expected "
               "0 or -ESHUTDOWN",
               rc, weft_strerror(rc));
    atomic_fetch_add(&g_extra_accepted, 1);
    if (tu_now_ns() > deadline)
      fail_msg("posts still accepted %d s after weft_rt_shutdown was called",
               TU_WAIT_S);
    tu_sleep_ms(1);
  }

  /* Shutdown started: every post fails, a second shutdown fails. */
  tu_assert_rc(weft_post(c->gated[0], noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post(c->plain[0], noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_ex(c->plain[1], noop, noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_rt(g_rt, noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_rt_ex(g_rt, noop, noop, NULL), -ESHUTDOWN);
  weft_strand *s = NULL;
  tu_assert_rc(weft_strand_create(g_rt, &s), -ESHUTDOWN);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), -EALREADY);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_CANCEL), -EALREADY);
  tu_assert_rc(
      weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_CANCEL | WEFT_SHUTDOWN_NOWAIT),
      -EALREADY);
  /* The gate handlers still run: the shutdown cannot have returned. */
  if (atomic_load(&c->shutdown_returned))
    fail_msg("weft_rt_shutdown (no NOWAIT) returned %d while handlers were "
             "still running",
             atomic_load(&c->shutdown_rc));

  tu_phase("opening the gates; waiting for the shutdown");
  tu_gate_open(&gate);
  tu_thread_join(th, "shutdown");
  tu_assert_rc(atomic_load(&c->shutdown_rc), 0);
  assert_int_equal(atomic_load(&gate.passed), NWORKERS);

  /* Count. */
  uint64_t ran = 0, cancel_fns = 0, dropped = 0;
  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    unsigned r = atomic_load(&it->ran), x = atomic_load(&it->cancelled);
    if (r > 1 || x > 1 || r + x > 1)
      fail_msg("item %u (kind %d, cancel fn %d): ran %u times, cancel fn "
               "ran %u times",
               i, (int)it->kind, (int)it->has_cancel, r, x);
    if (!it->has_cancel && x != 0)
      fail_msg("item %u: a cancel function ran but none was given", i);
    if (mode == WEFT_SHUTDOWN_DRAIN) {
      if (r != 1)
        fail_msg("DRAIN: item %u (kind %d) ran %u times, cancelled %u", i,
                 (int)it->kind, r, x);
    } else {
      if (it->has_cancel && r + x != 1)
        fail_msg("CANCEL: item %u (kind %d): neither ran nor cancelled", i,
                 (int)it->kind);
      /* Queued behind a gate that was still shut when the shutdown began:
       * it had not started, so it must not run. */
      if (it->kind == K_GATED && r != 0)
        fail_msg("CANCEL: item %u was queued behind a running handler when "
                 "the shutdown began, yet it ran instead of being cancelled",
                 i);
    }
    if (it->posts && r == 1) {
      int prc = atomic_load(&it->post_rc);
      /* Gated items started after the shutdown began. */
      if (it->kind == K_GATED && prc != -ESHUTDOWN)
        fail_msg("a handler running after weft_rt_shutdown posted and got "
                 "%d (%s), expected -ESHUTDOWN",
                 prc, weft_strerror(prc));
      if (prc != 0 && prc != -ESHUTDOWN)
        fail_msg("post from a handler returned %d (%s)", prc,
                 weft_strerror(prc));
    }
    ran += r;
    cancel_fns += x;
    if (!it->has_cancel && r == 0)
      dropped++;
  }
  uint64_t ea = atomic_load(&g_extra_accepted);
  uint64_t er = atomic_load(&g_extra_ran), ec = atomic_load(&g_extra_cancelled);
  if (er + ec != ea)
    fail_msg("posts accepted before the shutdown: %" PRIu64 ", ran %" PRIu64
             ", cancelled %" PRIu64,
             ea, er, ec);
  if (mode == WEFT_SHUTDOWN_DRAIN) {
    assert_int_equal(ran, n);
    assert_int_equal(cancel_fns, 0);
    assert_int_equal(ec, 0);
  } else {
    assert_int_equal(ran + cancel_fns + dropped, n);
  }

  /* After the shutdown: still refused, still -EALREADY. */
  tu_assert_rc(weft_post(c->plain[0], noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_post_rt(g_rt, noop, NULL), -ESHUTDOWN);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), -EALREADY);

  /* Read the stats now, check them once the runtime is gone (a failed
   * check then leaves no threads behind). */
  weft_stats st;
  tu_stats(g_rt, &st);
  tu_phase("destroy");
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  tu_gate_destroy(&gate);
  free(g_items);
  TU_ASSERT_NO_ASYNC_ERRORS();

  /* weft.h: handlers_run counts handlers that ran; handlers_cancelled
   * counts those that did not run at a CANCEL shutdown, whether their
   * cancel function ran or they had none. First the sum (every accepted
   * handler is counted once), then the split. */
  uint64_t want_run = NWORKERS + ran + er;
  uint64_t want_cancelled = cancel_fns + dropped + ec;
  if (st.total.handlers_run + st.total.handlers_cancelled !=
      want_run + want_cancelled)
    fail_msg("stats: handlers_run %" PRIu64 " + handlers_cancelled %" PRIu64
             " != %" PRIu64 " handlers accepted",
             st.total.handlers_run, st.total.handlers_cancelled,
             want_run + want_cancelled);
  if (st.total.handlers_run != want_run ||
      st.total.handlers_cancelled != want_cancelled)
    fail_msg("stats: handlers_run %" PRIu64 ", handlers_cancelled %" PRIu64
             "; expected %" PRIu64 " run and %" PRIu64 " cancelled (%" PRIu64
             " by their cancel function, %" PRIu64 " without one)",
             st.total.handlers_run, st.total.handlers_cancelled, want_run,
             want_cancelled, cancel_fns + ec, dropped);
}

static void test_pending_drain(void **state) {
  (void)state;
  run_pending(WEFT_SHUTDOWN_DRAIN);
}

static void test_pending_cancel(void **state) {
  (void)state;
  run_pending(WEFT_SHUTDOWN_CANCEL);
}

/* ------------------------------------------------- shutdown from a handler */

typedef struct from_handler {
  int nowait_mode; /* WEFT_SHUTDOWN_DRAIN or _CANCEL, with NOWAIT */
  weft_strand *s;
  item *late; /* posted by the handler before its shutdown */
  tu_count done;
} from_handler;

static void shutting_handler(void *arg) {
  from_handler *f = arg;
  TU_CHECK(weft_rt_current() == g_rt);
  /* Waiting for itself: refused, and nothing was started by the refusal. */
  int rc = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN);
  TU_CHECKF(rc == -EDEADLK, "shutdown(DRAIN) from a handler: %d (%s)", rc,
            weft_strerror(rc));
  rc = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_CANCEL);
  TU_CHECKF(rc == -EDEADLK, "shutdown(CANCEL) from a handler: %d (%s)", rc,
            weft_strerror(rc));
  rc = weft_rt_destroy(g_rt);
  TU_CHECKF(rc == -EDEADLK, "weft_rt_destroy from a handler: %d (%s)", rc,
            weft_strerror(rc));
  /* Still accepting work after those refusals. */
  rc = weft_post_ex(f->s, item_run, item_cancel, f->late);
  TU_CHECKF(rc == 0, "post after a refused shutdown: %d (%s)", rc,
            weft_strerror(rc));
  /* NOWAIT from a handler is allowed. */
  rc = weft_rt_shutdown(g_rt, f->nowait_mode | WEFT_SHUTDOWN_NOWAIT);
  TU_CHECKF(rc == 0, "shutdown(NOWAIT) from a handler: %d (%s)", rc,
            weft_strerror(rc));
  rc = weft_rt_shutdown(g_rt, f->nowait_mode | WEFT_SHUTDOWN_NOWAIT);
  TU_CHECKF(rc == -EALREADY, "second shutdown from a handler: %d (%s)", rc,
            weft_strerror(rc));
  /* From now on every post fails, from handlers too. */
  rc = weft_post(f->s, noop, NULL);
  TU_CHECKF(rc == -ESHUTDOWN, "post from a handler after shutdown: %d (%s)", rc,
            weft_strerror(rc));
  rc = weft_post_rt(g_rt, noop, NULL);
  TU_CHECKF(rc == -ESHUTDOWN,
            "post_rt from a handler after shutdown: %d "
            "(%s)",
            rc, weft_strerror(rc));
  weft_strand *ns = NULL;
  rc = weft_strand_create(g_rt, &ns);
  TU_CHECKF(rc == -ESHUTDOWN,
            "strand_create from a handler after "
            "shutdown: %d (%s)",
            rc, weft_strerror(rc));
  atomic_fetch_add(&f->done, 1);
}

static void run_from_handler(int mode) {
  tu_reset_async_errors();
  tu_phase("shutdown from a handler");
  static from_handler f;
  memset(&f, 0, sizeof f);
  f.nowait_mode = mode;
  atomic_init(&f.done, 0);

  tu_rt_create(&g_rt, 2, 0);
  tu_strand_create(g_rt, &f.s);
  weft_strand *other;
  tu_strand_create(g_rt, &other);

  /* The shutting handler, then n handlers queued behind it on its strand,
   * held back by a gate in front so they are surely pending. */
  unsigned n = 1000;
  items_alloc(n + 1);
  f.late = &g_items[n];
  f.late->has_cancel = true;
  tu_gate gate;
  tu_gate_init(&gate);
  assert_int_equal(weft_post(f.s, tu_gate_handler, &gate), 0);
  assert_int_equal(weft_post(f.s, shutting_handler, &f), 0);
  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    it->has_cancel = (i % 2) == 0;
    it->kind = (i % 4 == 3) ? K_PLAIN : K_GATED;
    weft_strand *s = it->kind == K_GATED ? f.s : other;
    assert_int_equal(it->has_cancel ? weft_post_ex(s, item_run, item_cancel, it)
                                    : weft_post(s, item_run, it),
                     0);
  }
  tu_gate_open(&gate);
  tu_wait_count(&f.done, 1, "the handler that shuts down");
  TU_ASSERT_NO_ASYNC_ERRORS();

  /* Destroy from the main thread completes, waiting for the NOWAIT
   * shutdown if it is still in progress. */
  tu_phase("destroy after a NOWAIT shutdown from a handler");
  assert_int_equal(weft_rt_destroy(g_rt), 0);

  for (unsigned i = 0; i <= n; i++) {
    item *it = &g_items[i];
    unsigned r = atomic_load(&it->ran), x = atomic_load(&it->cancelled);
    if (mode == WEFT_SHUTDOWN_DRAIN) {
      if (r != 1 || x != 0)
        fail_msg("DRAIN from a handler: item %u ran %u, cancelled %u", i, r, x);
    } else {
      if (r + x > 1 || (it->has_cancel && r + x != 1))
        fail_msg("CANCEL from a handler: item %u ran %u, cancelled %u", i, r,
                 x);
      /* Behind the shutting handler on its strand: had not started. */
      if (it->kind == K_GATED && r != 0)
        fail_msg("CANCEL from a handler: item %u, queued behind the "
                 "shutting handler, ran instead of being cancelled",
                 i);
    }
  }
  tu_gate_destroy(&gate);
  free(g_items);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_from_handler_drain(void **state) {
  (void)state;
  run_from_handler(WEFT_SHUTDOWN_DRAIN);
}

static void test_from_handler_cancel(void **state) {
  (void)state;
  run_from_handler(WEFT_SHUTDOWN_CANCEL);
}

/* ------------------------------------------- destroy without a shutdown */

static tu_count g_head_entered;

/* Holds its strand until the shutdown that weft_rt_destroy starts is
 * visible (posts fail), so everything behind it is surely pending then. */
static void head_handler(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_head_entered, 1);
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    int rc = weft_post_rt_ex(g_rt, extra_run, extra_cancel, NULL);
    if (rc == -ESHUTDOWN)
      return;
    if (rc != 0) {
      TU_CHECKF(false, "post while waiting for destroy: %d (%s)", rc,
                weft_strerror(rc));
      return;
    }
    atomic_fetch_add(&g_extra_accepted, 1);
    if (tu_now_ns() > deadline) {
      TU_CHECKF(false,
                "weft_rt_destroy did not start a shutdown within %d "
                "s",
                TU_WAIT_S);
      return;
    }
    tu_sleep_ms(1);
  }
}

static void test_destroy_without_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("destroy without shutdown");
  atomic_store(&g_head_entered, 0);
  tu_rt_create(&g_rt, 2, 0);
  weft_strand *s;
  tu_strand_create(g_rt, &s);
  unsigned n = 2000;
  items_alloc(n);
  assert_int_equal(weft_post(s, head_handler, NULL), 0);
  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    it->kind = K_GATED;
    it->has_cancel = (i % 2) == 0;
    assert_int_equal(it->has_cancel ? weft_post_ex(s, item_run, item_cancel, it)
                                    : weft_post(s, item_run, it),
                     0);
  }
  /* Released strands with pending work are cancelled and freed too. */
  weft_strand_release(s);
  tu_wait_count(&g_head_entered, 1, "the head handler to start");

  assert_int_equal(weft_rt_destroy(g_rt), 0);

  for (unsigned i = 0; i < n; i++) {
    item *it = &g_items[i];
    unsigned r = atomic_load(&it->ran), x = atomic_load(&it->cancelled);
    if (r != 0)
      fail_msg("destroy without shutdown: item %u, pending behind a running "
               "handler, ran %u times instead of being cancelled",
               i, r);
    if (x != (it->has_cancel ? 1u : 0u))
      fail_msg("destroy without shutdown: item %u (cancel fn %d): cancel "
               "ran %u times",
               i, (int)it->has_cancel, x);
  }
  uint64_t ea = atomic_load(&g_extra_accepted);
  uint64_t er = atomic_load(&g_extra_ran), ec = atomic_load(&g_extra_cancelled);
  if (er + ec != ea)
    fail_msg("accepted %" PRIu64 " extra posts, ran %" PRIu64
             ", cancelled %" PRIu64,
             ea, er, ec);
  free(g_items);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

#define NWAITERS 6

static atomic_int g_waiter_tid[NWAITERS];
static int g_waiter_rc[NWAITERS];

static void *waiter_main(void *arg) {
  unsigned i = (unsigned)(uintptr_t)arg;
  atomic_store(&g_waiter_tid[i], (int)syscall(SYS_gettid));
  g_waiter_rc[i] = i == 0 ? weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN)
                          : weft_rt_wait(g_rt, UINT64_MAX);
  return NULL;
}

/* Whether thread tid of this process is asleep ('S' in its stat). */
static bool asleep(int tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && p[2] == 'S';
}

static void hold_100ms(void *arg) {
  (void)arg;
  tu_sleep_ms(100);
}

static void test_destroy_while_waiting(void **state) {
  (void)state;
  tu_reset_async_errors();
  for (int round = 0; round < 4; round++) {
    tu_rt_create(&g_rt, 2, 0);
    tu_assert_rc(weft_post_rt(g_rt, hold_100ms, NULL), 0);
    pthread_t th[NWAITERS];
    for (unsigned i = 0; i < NWAITERS; i++) {
      atomic_store(&g_waiter_tid[i], 0);
      g_waiter_rc[i] = 1;
      assert_int_equal(
          pthread_create(&th[i], NULL, waiter_main, (void *)(uintptr_t)i), 0);
    }
    /* Each asleep in its call (the handler holds the runtime 100 ms; a
     * thread asleep elsewhere would only make this round weaker). */
    for (unsigned i = 0; i < NWAITERS; i++) {
      for (int k = 0; k < 2000 && !(atomic_load(&g_waiter_tid[i]) &&
                                    asleep(atomic_load(&g_waiter_tid[i])));
           k++)
        tu_sleep_ms(1);
      struct sched_param sp = {0};
      pthread_setschedparam(th[i], SCHED_IDLE, &sp);
    }
    tu_assert_rc(weft_rt_destroy(g_rt), 0);
    for (unsigned i = 0; i < NWAITERS; i++) {
      assert_int_equal(pthread_join(th[i], NULL), 0);
      tu_assert_rc(g_waiter_rc[i], 0);
    }
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static int g_job_rc[3];

static long job_waits(void *arg) {
  (void)arg;
  g_job_rc[0] = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN);
  g_job_rc[1] = weft_rt_wait(g_rt, 1000000);
  g_job_rc[2] = weft_rt_destroy(g_rt);
  return 0;
}

static void job_done(void *arg, long result) {
  (void)result;
  atomic_fetch_add((tu_count *)arg, 1);
}

static void test_from_blocking_job(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_rt_create(&g_rt, 2, 0);
  tu_count done = 0;
  tu_assert_rc(weft_blocking(g_rt, job_waits, &done, NULL, job_done, NULL), 0);
  tu_wait_count(&done, 1, "the job's done");
  for (int i = 0; i < 3; i++)
    tu_assert_rc(g_job_rc[i], -EDEADLK);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(g_rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A runtime that never got any work: destroy (and shutdown) still work. */
static void test_idle_lifecycle(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("idle lifecycle");
  weft_rt *rt;
  tu_rt_create(&rt, 3, 0);
  assert_int_equal(weft_rt_destroy(rt), 0);

  tu_rt_create(&rt, 1, 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), -EALREADY);
  tu_assert_rc(weft_post_rt(rt, noop, NULL), -ESHUTDOWN);
  assert_int_equal(weft_rt_destroy(rt), 0);

  /* NOWAIT from a foreign thread, then destroy. */
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  g_rt = rt;
  items_alloc(100);
  for (unsigned i = 0; i < 100; i++)
    assert_int_equal(weft_post(s, item_run, &g_items[i]), 0);
  assert_int_equal(
      weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT), 0);
  tu_assert_rc(weft_post(s, noop, NULL), -ESHUTDOWN);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < 100; i++)
    assert_int_equal(atomic_load(&g_items[i].ran), 1);
  free(g_items);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Many threads, all parked when the shutdown is declared: the declaring
 * thread and every thread it wakes share the wakeups (park.c). A thread
 * left asleep hangs destroy's join, which the watchdog reports. */
static atomic_uint g_many_ran;

static void count_many(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_many_ran, 1);
}

static void test_many_threads_lifecycle(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("many threads lifecycle");
  unsigned cycles = (unsigned)TU_SCALED(40, 6);
  for (unsigned c = 0; c < cycles; c++) {
    weft_rt *rt;
    tu_rt_create(&rt, 32, 0);
    atomic_store(&g_many_ran, 0);
    unsigned posts = 1 + c % 64;
    for (unsigned i = 0; i < posts; i++)
      assert_int_equal(weft_post_rt(rt, count_many, NULL), 0);
    /* Even cycles shut down first, alternately DRAIN and CANCEL; odd ones
     * leave it to destroy (CANCEL). */
    bool drain = c % 4 == 2;
    if (c % 2 == 0)
      assert_int_equal(weft_rt_shutdown(rt, drain ? WEFT_SHUTDOWN_DRAIN
                                                  : WEFT_SHUTDOWN_CANCEL),
                       0);
    assert_int_equal(weft_rt_destroy(rt), 0);
    if (drain && atomic_load(&g_many_ran) != posts)
      fail_msg("cycle %u: %u of %u handlers ran after a drain", c,
               atomic_load(&g_many_ran), posts);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pending_drain),
      cmocka_unit_test(test_pending_cancel),
      cmocka_unit_test(test_from_handler_drain),
      cmocka_unit_test(test_from_handler_cancel),
      cmocka_unit_test(test_destroy_without_shutdown),
      cmocka_unit_test(test_destroy_while_waiting),
      cmocka_unit_test(test_from_blocking_job),
      cmocka_unit_test(test_idle_lifecycle),
      cmocka_unit_test(test_many_threads_lifecycle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
