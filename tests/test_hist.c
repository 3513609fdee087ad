/*
 * test_hist: the latency histograms (weft_rt_histogram).
 *
 *  - Post-to-run delay: the test posts handlers without strand to a
 *    one-worker runtime, each while the one before holds the worker for a
 *    while, and bounds each delay itself: from just before weft_post_rt
 *    to the handler's first line at most, from just after it to the end
 *    of the probe before at least. The histogram counts
 *    exactly those posts (after a warm-up), and its 10th, 50th, 90th and
 *    99th percentiles lie within one bucket of the range the test's own
 *    bounds give. Those bounds must be narrow at the median for that to
 *    mean something; a loaded machine can widen them, and then the round
 *    is run again, up to 3 rounds.
 *  - Timer lateness: one timer, started at an absolute deadline; the
 *    histogram holds one value, no later than the handler's own lateness.
 *  - Turn time: 32 handlers that run 2 ms each show in the maximum (one
 *    turn in 16 per thread is measured).
 *  - Pool wait: one value per weft_blocking job.
 *  - Per-shard reads add up to the runtime's (shard -1) for shard kinds.
 *  - Buckets: bucket_low is increasing and each bucket is at most an
 *    eighth of its values wide; percentiles of an empty histogram are 0.
 *  - Bad input.
 */
#include "testutil.h"

static unsigned bucket_of(uint64_t v) {
  unsigned i = 0;
  while (i + 1 < WEFT_HISTOGRAM_BUCKETS &&
         weft_histogram_bucket_low(i + 1) <= v)
    i++;
  return i;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The histogram's rule for the rank of its q-quantile among n values:
 * ceil(q * n), at least 1. */
static size_t rank_of(size_t n, double q) {
  size_t rank = (size_t)(q * (double)n + 0.999999);
  return rank ? rank : 1;
}

typedef struct probe {
  uint64_t posted, returned, ran, ended, spin_ns;
  atomic_bool started, queued;
  struct probe *next; /* posted while this one runs; NULL: the last */
} probe;

/* Holds the worker until the next probe is queued, and spin_ns more: the
 * next probe waits at least that long, whatever held the test's thread up
 * (a busy machine) before or while it posted. */
static void probe_run(void *arg) {
  probe *p = arg;
  p->ran = tu_now_ns();
  atomic_store(&p->started, true);
  if (!p->next)
    return;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&p->next->queued) && tu_now_ns() < deadline)
    ;
  uint64_t from = tu_now_ns();
  while (tu_now_ns() - from < p->spin_ns)
    ;
  p->ended = tu_now_ns();
}

static void count_run(void *arg) { atomic_fetch_add((tu_count *)arg, 1); }

/* One round of n + 1 probes, each posted from this thread while the one
 * before holds the worker: lo and hi get the test's own bounds on the n
 * delays after the first (sorted), *h the histogram of these n + 1
 * alone. */
static void sched_round(weft_rt *rt, probe *p, size_t n, uint64_t *lo,
                        uint64_t *hi, weft_histogram *h) {
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_SCHED_DELAY, -1, h), 0);
  uint64_t before = h->count;
  /* Each probe waits behind the one before, 50 to 400 us: delays far
   * longer than what the two clocks' starts differ by (a post's own work,
   * more under sanitizers), spread over many buckets. */
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (size_t i = 0; i <= n; i++) {
    p[i].spin_ns = 50000 + (uint64_t)(i * 7919 % 351) * 1000;
    p[i].next = i < n ? &p[i + 1] : NULL;
    p[i].posted = tu_now_ns();
    assert_int_equal(weft_post_rt(rt, probe_run, &p[i]), 0);
    p[i].returned = tu_now_ns();
    atomic_store(&p[i].queued, true);
    while (!atomic_load(&p[i].started) && tu_now_ns() < deadline)
      ;
    assert_true(atomic_load(&p[i].started));
  }
  /* The histogram's clock starts inside weft_post_rt and stops when the
   * worker takes the probe, after the probe before it has ended and
   * before the probe's handler starts. So each delay is at most ran -
   * posted (hi) and at least the previous probe's end - returned (lo),
   * whatever held either thread up, and its quantiles lie between
   * theirs. p[0] found the worker idle: its delay, a wakeup's, is left
   * out. */
  for (size_t i = 0; i < n; i++) {
    const probe *q = &p[i + 1];
    hi[i] = q->ran - q->posted;
    lo[i] = p[i].ended > q->returned ? p[i].ended - q->returned : 0;
  }
  qsort(hi, n, sizeof(*hi), cmp_u64);
  qsort(lo, n, sizeof(*lo), cmp_u64);
  weft_histogram all;
  do /* the last probe's turn may still be running */
    assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_SCHED_DELAY, -1, &all), 0);
  while (all.count < before + n + 1 && tu_now_ns() < deadline);
  assert_int_equal(all.count, before + n + 1);
  /* Ours only: what came before is subtracted. */
  for (unsigned i = 0; i < WEFT_HISTOGRAM_BUCKETS; i++)
    h->buckets[i] = all.buckets[i] - h->buckets[i];
  h->count = n + 1;
  h->max_ns = all.max_ns;
}

/* The test's own bounds on the probes' value of the rank the histogram
 * gives quantile q among the n + 1: p[0]'s stays in, so that value is
 * the probes' of rank r - 1 or r, whichever side of it p[0]'s fell. On a
 * loaded machine the tail's neighbouring ranks lie buckets apart, so
 * both count. */
static void bounds_of(size_t n, double q, const uint64_t *lo,
                      const uint64_t *hi, uint64_t *a, uint64_t *b) {
  size_t r = rank_of(n + 1, q);
  *a = lo[(r > 1 ? r - 1 : 1) - 1];
  *b = hi[(r < n ? r : n) - 1];
}

#define SCHED_ROUNDS 3

static void test_sched_delay_agrees(void **state) {
  (void)state;
  /* One worker, and no handoff to a spare: a probe held up past the
   * stall threshold (a loaded machine) must still hold the next one. */
  weft_config c;
  weft_config_init(&c);
  c.workers = 1;
  c.stall_threshold_ns = 60ull * 1000000000u;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  size_t n = (size_t)TU_SCALED(1000, 300);
  /* A round's probes each: the last one's handler may still be running
   * when its round ends. */
  probe *p = calloc(SCHED_ROUNDS * (n + 1), sizeof(*p));
  uint64_t *lo = calloc(n, sizeof(*lo)), *hi = calloc(n, sizeof(*hi));
  assert_non_null(p);
  assert_true(lo && hi);
  tu_count done = 0;
  /* The test's clock starts before weft_post_rt, the histogram's when the
   * post has its node: a thread outside the runtime takes nodes from the
   * pool's depot, and until the worker has freed enough there, every 32nd
   * post carves fresh memory (page faults, tens of microseconds) that
   * only the test would count. Warm the depot first. */
  size_t warm = (size_t)TU_SCALED(20000, 2000);
  for (size_t i = 0; i < warm; i++)
    assert_int_equal(weft_post_rt(rt, count_run, &done), 0);
  tu_wait_count(&done, warm, "the warm-up");
  /* The checks mean something only while the test's own bounds at the
   * median are narrow, within two buckets. A loaded machine can widen
   * them (this thread held up between its clock and the post, or the
   * worker's spin preempted): then the round is run again, up to
   * SCHED_ROUNDS. */
  weft_histogram h;
  uint64_t a, b;
  for (int round = 0;; round++) {
    sched_round(rt, p + (size_t)round * (n + 1), n, lo, hi, &h);
    bounds_of(n, 0.5, lo, hi, &a, &b);
    if (bucket_of(b) <= bucket_of(a) + 2)
      break;
    if (round + 1 == SCHED_ROUNDS)
      fail_msg("the test's own bounds at the median stayed wide in %d "
               "rounds: %" PRIu64 " to %" PRIu64 " ns (buckets %u to %u)",
               SCHED_ROUNDS, a, b, bucket_of(a), bucket_of(b));
    print_message("[ INFO     ] round %d: the test's bounds at the median "
                  "are %u buckets apart; again\n",
                  round + 1, bucket_of(b) - bucket_of(a));
  }
  const double qs[] = {0.1, 0.5, 0.9, 0.99};
  for (int i = 0; i < 4; i++) {
    bounds_of(n, qs[i], lo, hi, &a, &b);
    uint64_t v = weft_histogram_percentile(&h, qs[i]);
    unsigned its = bucket_of(v);
    if (its + 1 < bucket_of(a) || its > bucket_of(b) + 1)
      fail_msg("p%g: the test measured %" PRIu64 " to %" PRIu64
               " ns (buckets %u to %u), the histogram says %" PRIu64
               " ns (bucket %u)",
               qs[i] * 100, a, b, bucket_of(a), bucket_of(b), v, its);
  }
  weft_histogram all, one;
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_SCHED_DELAY, -1, &all), 0);
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_SCHED_DELAY, 0, &one), 0);
  assert_int_equal(one.count, all.count); /* one shard: all of it */
  weft_rt_destroy(rt);
  free(p);
  free(lo);
  free(hi);
}

static tu_count g_fired;
static uint64_t g_deadline, g_late;

static void timer_run(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  assert_int_equal(status, 0);
  g_late = tu_now_ns() - g_deadline;
  atomic_fetch_add(&g_fired, 1);
}

static void spin_2ms(void *arg) {
  tu_count *c = arg;
  /* 2.1 ms: the tick scale may be off by a part in a thousand */
  uint64_t until = tu_now_ns() + 2100000;
  while (tu_now_ns() < until)
    ;
  atomic_fetch_add(c, 1);
}

static long job_work(void *arg) {
  (void)arg;
  return 0;
}

static void job_done(void *arg, long result) {
  (void)result;
  atomic_fetch_add((tu_count *)arg, 1);
}

static void test_timer_turn_pool(void **state) {
  (void)state;
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  c.stall_threshold_ns = 1000000000; /* the 2 ms handler is no stall */
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  weft_timer *t;
  assert_int_equal(weft_timer_create(rt, NULL, &t), 0);
  g_deadline = weft_now_ns() + 5000000;
  assert_int_equal(weft_timer_start_at(t, g_deadline, 0, timer_run, NULL), 0);
  tu_wait_count(&g_fired, 1, "the timer");
  weft_histogram h;
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_TIMER_LATE, -1, &h), 0);
  assert_int_equal(h.count, 1);
  assert_true(h.max_ns <= g_late);
  weft_timer_destroy(t);

  /* One turn in 16 per thread is measured: 32 turns, of which a thread
   * runs 16 or more, so that at least one is. */
  tu_count spun = 0, jobs = 0;
  for (int i = 0; i < 32; i++)
    assert_int_equal(weft_post_rt(rt, spin_2ms, &spun), 0);
  tu_wait_count(&spun, 32, "the 2 ms handlers");
  /* The turn is counted once the handler has returned. */
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  do
    assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_TURN, -1, &h), 0);
  while (h.max_ns < 2000000 && tu_now_ns() < deadline);
  assert_true(h.max_ns >= 2000000);
  assert_true(weft_histogram_percentile(&h, 1.0) >= 2000000);
  weft_histogram sum = {0}, one;
  for (int s = 0; s < 2; s++) {
    assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_TURN, s, &one), 0);
    sum.count += one.count;
  }
  assert_int_equal(sum.count, h.count); /* nothing ran outside a shard */

  const int njobs = 20;
  for (int i = 0; i < njobs; i++)
    assert_int_equal(weft_blocking(rt, job_work, &jobs, NULL, job_done, NULL),
                     0);
  tu_wait_count(&jobs, njobs, "the jobs");
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_POOL_WAIT, -1, &h), 0);
  assert_int_equal(h.count, njobs);
  weft_rt_destroy(rt);
}

static void test_buckets(void **state) {
  (void)state;
  for (unsigned i = 1; i < WEFT_HISTOGRAM_BUCKETS; i++) {
    uint64_t lo = weft_histogram_bucket_low(i - 1);
    uint64_t hi = weft_histogram_bucket_low(i);
    assert_true(hi > lo);
    assert_true((hi - lo) * 8 <= (lo > 16 ? lo : 16));
    assert_int_equal(bucket_of(lo), i - 1);
  }
  assert_true(weft_histogram_bucket_low(WEFT_HISTOGRAM_BUCKETS) == UINT64_MAX);
  weft_histogram h = {0};
  assert_true(weft_histogram_percentile(&h, 0.5) == 0);
  assert_true(weft_histogram_percentile(NULL, 0.5) == 0);
  h.count = 3;
  h.max_ns = 1000;
  h.buckets[bucket_of(100)] = 2;
  h.buckets[bucket_of(1000)] = 1;
  assert_int_equal(bucket_of(weft_histogram_percentile(&h, 0.5)),
                   bucket_of(100));
  assert_true(weft_histogram_percentile(&h, 1.0) == 1000);
}

static void test_bad_input(void **state) {
  (void)state;
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_histogram h;
  assert_int_equal(weft_rt_histogram(NULL, 0, -1, &h), -EINVAL);
  assert_int_equal(weft_rt_histogram(rt, -1, -1, &h), -EINVAL);
  assert_int_equal(weft_rt_histogram(rt, WEFT_HIST_KINDS, -1, &h), -EINVAL);
  assert_int_equal(weft_rt_histogram(rt, 0, 1, &h), -EINVAL);
  assert_int_equal(weft_rt_histogram(rt, 0, -2, &h), -EINVAL);
  assert_int_equal(weft_rt_histogram(rt, 0, -1, NULL), -EINVAL);
  assert_int_equal(weft_rt_histogram_sized(rt, 0, -1, &h, 8), -EINVAL);
  weft_rt_destroy(rt);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sched_delay_agrees),
      cmocka_unit_test(test_timer_turn_pool),
      cmocka_unit_test(test_buckets),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
