/*
 * test_strand_serial: a strand runs its handlers one at a time, in posting
 * order per poster, each exactly once.
 *
 * 64 strands on 8 workers. 4 foreign threads post (weft_post and weft_post_ex,
 * to random strands, and some weft_post_rt); a third of the strand handlers
 * post one more handler to another strand (or their own) from inside. About
 * 10^6 handlers in all (divided by WEFT_TEST_SCALE).
 *
 *  - never two handlers of one strand at once: a per-strand "inside" flag,
 *    set with atomic_exchange on entry (must have been 0), cleared on exit;
 *  - FIFO per poster: each poster (a foreign thread, or a strand posting from
 *    its handlers, which are serial) stamps a sequence number per target
 *    strand; the handler checks it is the last one seen + 1. The last-seen
 *    table is plain memory touched only by that strand's handlers, so the
 *    strand's own happens-before edges are checked too (under TSan);
 *  - exactly once: every message is counted and flagged;
 *  - weft_strand_current() / weft_rt_current(): the strand and runtime inside
 *    strand handlers; NULL strand and the runtime in weft_post_rt handlers;
 *    NULL for both outside handlers.
 */
#include "testutil.h"

#define NSTRANDS 64
#define NWORKERS 8
#define NPOSTERS 4
/* posters: the foreign threads, then one per strand (its handlers) */
#define NSOURCES (NPOSTERS + NSTRANDS)

typedef struct msg {
  uint32_t poster; /* source index */
  uint32_t strand; /* target strand index */
  uint64_t seq;    /* per (poster, strand), from 1 */
  bool spawn;      /* post one more from inside the handler */
  bool heap;       /* malloc'ed by a handler: free after running */
  atomic_uchar ran;
} msg;

typedef struct sstate {
  weft_strand *s;
  atomic_int inside;
  /* Touched only by this strand's handlers (serial by contract). */
  uint64_t last_seen[NSOURCES];
  uint64_t out_seq[NSTRANDS];
  uint64_t spawned;
} sstate;

typedef struct poster {
  unsigned id;
  msg *msgs;
  uint64_t n;   /* strand messages */
  uint64_t nrt; /* weft_post_rt messages */
  uint64_t seq[NSTRANDS];
  pthread_t th;
} poster;

static weft_rt *g_rt;
static sstate g_st[NSTRANDS];
static poster g_posters[NPOSTERS];
static tu_barrier g_start;
static tu_count g_done;    /* handlers finished */
static tu_count g_rt_done; /* weft_post_rt handlers finished */
static tu_count g_spawn_fail;

static void never_cancel(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a cancel function ran without a CANCEL shutdown");
}

static void on_msg(void *arg) {
  msg *m = arg;
  sstate *st = &g_st[m->strand];

  int was = atomic_exchange(&st->inside, 1);
  TU_CHECKF(was == 0, "two handlers of strand %u ran at once", m->strand);
  TU_CHECKF(weft_strand_current() == st->s,
            "weft_strand_current() is %p inside a handler of strand %u (%p)",
            (void *)weft_strand_current(), m->strand, (void *)st->s);
  TU_CHECK(weft_rt_current() == g_rt);

  unsigned ran = atomic_fetch_add(&m->ran, 1);
  TU_CHECKF(ran == 0,
            "message (poster %u, strand %u, seq %" PRIu64 ") ran twice",
            m->poster, m->strand, m->seq);
  TU_CHECKF(m->seq == st->last_seen[m->poster] + 1,
            "strand %u: from poster %u got seq %" PRIu64 " after %" PRIu64
            " (FIFO per poster broken)",
            m->strand, m->poster, m->seq, st->last_seen[m->poster]);
  st->last_seen[m->poster] = m->seq;

  if (m->spawn) {
    unsigned src = m->strand;
    unsigned t = (unsigned)((src * 7u + st->spawned * 13u) % NSTRANDS);
    st->spawned++;
    msg *n = calloc(1, sizeof *n);
    TU_CHECK(n != NULL);
    if (n) {
      n->poster = NPOSTERS + src;
      n->strand = t;
      n->seq = ++st->out_seq[t];
      n->heap = true;
      int rc = weft_post(g_st[t].s, on_msg, n);
      TU_CHECKF(rc == 0, "weft_post from a handler failed: %d", rc);
      if (rc != 0) {
        --st->out_seq[t];
        free(n);
        atomic_fetch_add(&g_spawn_fail, 1);
      }
    }
  }

  /* Still inside: nobody else may have entered meanwhile. */
  was = atomic_exchange(&st->inside, 0);
  TU_CHECKF(was == 1,
            "strand %u: inside flag changed under a running "
            "handler",
            m->strand);
  bool heap = m->heap;
  if (heap)
    free(m);
  atomic_fetch_add(&g_done, 1);
}

static void on_rt_msg(void *arg) {
  (void)arg;
  TU_CHECKF(weft_strand_current() == NULL,
            "weft_strand_current() not NULL in a weft_post_rt handler");
  TU_CHECK(weft_rt_current() == g_rt);
  atomic_fetch_add(&g_rt_done, 1);
  atomic_fetch_add(&g_done, 1);
}

static void *poster_main(void *arg) {
  poster *p = arg;
  TU_CHECK(weft_strand_current() == NULL);
  TU_CHECK(weft_rt_current() == NULL);
  tu_barrier_wait(&g_start);
  uint64_t every_rt = p->n / (p->nrt ? p->nrt : 1);
  if (every_rt == 0)
    every_rt = 1;
  uint64_t rt_posted = 0;
  for (uint64_t i = 0; i < p->n; i++) {
    msg *m = &p->msgs[i];
    int rc;
    if (i % 5 == 4)
      rc = weft_post_ex(g_st[m->strand].s, on_msg, never_cancel, m);
    else
      rc = weft_post(g_st[m->strand].s, on_msg, m);
    if (rc != 0) {
      TU_CHECKF(false, "poster %u: weft_post failed: %d (%s)", p->id, rc,
                weft_strerror(rc));
      return NULL;
    }
    if (rt_posted < p->nrt && i % every_rt == 0) {
      rc = weft_post_rt(g_rt, on_rt_msg, NULL);
      TU_CHECKF(rc == 0, "weft_post_rt failed: %d", rc);
      if (rc != 0)
        return NULL;
      rt_posted++;
    }
  }
  while (rt_posted < p->nrt) {
    int rc = weft_post_rt(g_rt, on_rt_msg, NULL);
    TU_CHECKF(rc == 0, "weft_post_rt failed: %d", rc);
    if (rc != 0)
      return NULL;
    rt_posted++;
  }
  return NULL;
}

static void test_strand_serial(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("setup");
  uint64_t total = TU_SCALED(1000000, 20000);
  uint64_t per_poster = total * 3 / 4 / NPOSTERS;
  uint64_t rt_per_poster = per_poster / 64 + 1;
  uint64_t expected = 0, expected_rt = 0;

  assert_null(weft_strand_current());
  assert_null(weft_rt_current());

  tu_rt_create(&g_rt, NWORKERS, 0);
  assert_int_equal(weft_rt_workers(g_rt), NWORKERS);
  for (unsigned i = 0; i < NSTRANDS; i++) {
    memset(&g_st[i], 0, sizeof g_st[i]);
    atomic_init(&g_st[i].inside, 0);
    tu_strand_create(g_rt, &g_st[i].s);
  }

  uint64_t rng = 12345;
  for (unsigned p = 0; p < NPOSTERS; p++) {
    poster *po = &g_posters[p];
    memset(po, 0, sizeof *po);
    po->id = p;
    po->n = per_poster;
    po->nrt = rt_per_poster;
    po->msgs = calloc(per_poster, sizeof *po->msgs);
    assert_non_null(po->msgs);
    for (uint64_t i = 0; i < per_poster; i++) {
      msg *m = &po->msgs[i];
      m->poster = p;
      m->strand = (uint32_t)(tu_rand(&rng) % NSTRANDS);
      m->seq = ++po->seq[m->strand];
      m->spawn = (i % 3) == 1;
      atomic_init(&m->ran, 0);
      expected += 1 + (m->spawn ? 1 : 0);
    }
    expected += rt_per_poster;
    expected_rt += rt_per_poster;
  }

  tu_phase("posting");
  tu_barrier_init(&g_start, NPOSTERS);
  for (unsigned p = 0; p < NPOSTERS; p++)
    tu_thread_start(&g_posters[p].th, poster_main, &g_posters[p]);
  for (unsigned p = 0; p < NPOSTERS; p++)
    tu_thread_join(g_posters[p].th, "poster");

  tu_phase("waiting for every handler");
  tu_wait_count(&g_done, expected, "handlers to run");
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(atomic_load(&g_spawn_fail), 0);

  /* The runtime counts its own handler runs exactly; its counter may be
   * bumped just after the handler returns, so wait for it, then compare. */
  tu_stat_wait w = {g_rt, expected};
  tu_wait_until(tu_pred_handlers_run_ge, &w, "stats.handlers_run");
  weft_stats st;
  tu_stats(g_rt, &st);
  assert_int_equal(st.total.handlers_run, expected);
  assert_int_equal(st.total.handlers_cancelled, 0);
  assert_int_equal(st.shards, NWORKERS);
  assert_int_equal(st.strands_live, NSTRANDS);
  assert_int_equal(atomic_load(&g_done), expected);
  assert_int_equal(atomic_load(&g_rt_done), expected_rt);

  /* Every foreign message ran exactly once, and every strand saw the full
   * sequence of every foreign poster. */
  for (unsigned p = 0; p < NPOSTERS; p++) {
    poster *po = &g_posters[p];
    for (uint64_t i = 0; i < po->n; i++) {
      if (atomic_load(&po->msgs[i].ran) != 1)
        fail_msg("poster %u message %" PRIu64 " ran %u times", p, i,
                 (unsigned)atomic_load(&po->msgs[i].ran));
    }
    for (unsigned s = 0; s < NSTRANDS; s++)
      assert_int_equal(g_st[s].last_seen[p], po->seq[s]);
  }
  /* ... and every handler-poster's sequence. */
  for (unsigned src = 0; src < NSTRANDS; src++)
    for (unsigned s = 0; s < NSTRANDS; s++)
      assert_int_equal(g_st[s].last_seen[NPOSTERS + src], g_st[src].out_seq[s]);
  for (unsigned s = 0; s < NSTRANDS; s++)
    assert_int_equal(atomic_load(&g_st[s].inside), 0);

  assert_null(weft_strand_current());
  assert_null(weft_rt_current());

  tu_phase("teardown");
  for (unsigned s = 0; s < NSTRANDS; s++)
    weft_strand_release(g_st[s].s);
  assert_int_equal(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  for (unsigned p = 0; p < NPOSTERS; p++)
    free(g_posters[p].msgs);
  tu_barrier_destroy(&g_start);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_strand_serial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
