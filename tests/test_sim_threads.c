/*
 * test_sim_threads - a simulated runtime (sim.h) and the application's
 * other threads, as weft.h allows them (linked with the weft_sim library):
 *
 *  - test_two_waiters: two threads wait on one simulation at once; one
 *    drives at a time, so a strand's handlers still run one at a time and
 *    every one runs, and both waits return 0 once the run is done.
 *  - test_shutdown_from_other_thread: main waits while another thread
 *    calls weft_rt_shutdown without NOWAIT: the same, where every post
 *    accepted runs once and the chains' later posts are refused.
 *  - test_timeout_while_another_drives: a thread's wait with a timeout
 *    returns -ETIMEDOUT once the virtual clock passes it, while main
 *    drives on (or drives on after it, if that thread drove first).
 *  - test_posts_from_other_thread: with every draw a fault (ENOMEM at odds
 *    1), another thread's posts during a wait still succeed and run: the
 *    simulation draws faults on its driver's thread only. That thread
 *    reads weft_rt_sim_info meanwhile (a race under TSan before): its
 *    counts never go back.
 *  - test_nested_wait_keeps_faults: a blocking job (which a simulation
 *    runs on the driver's thread) waits too: -EDEADLK, as in a real
 *    runtime, and the outer wait's faults still strike after it.
 */
#include "testutil.h"

#define MS 1000000ull
#define SEC 1000000000ull

/* ---- strand serialisation under two waits ------------------------------ */

static weft_rt *g_rt;
static atomic_int g_inside;
static atomic_long g_overlaps, g_ran, g_accepted;
static long g_expected;

static void serial(void *arg) {
  if (atomic_exchange(&g_inside, 1))
    atomic_fetch_add(&g_overlaps, 1);
  if (atomic_fetch_add(&g_ran, 1) + 1 == g_expected) {
    int r = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_NOWAIT);
    TU_CHECK(r == 0 || r == -EALREADY);
  }
  for (volatile int i = 0; i < 200; i++) {
  }
  atomic_store(&g_inside, 0);
  uintptr_t n = (uintptr_t)arg;
  if (n > 0) {
    int r = weft_post(weft_strand_current(), serial, (void *)(n - 1));
    TU_CHECKF(r == 0 || r == -ESHUTDOWN, "post: %d", r);
    if (r == 0)
      atomic_fetch_add(&g_accepted, 1);
  }
}

struct waiter {
  pthread_t th;
  pthread_barrier_t *go;
  uint64_t timeout;
  bool shutdown; /* weft_rt_shutdown(rt, 0) instead of a wait */
  atomic_int result, returned;
};

static void *waiter_main(void *arg) {
  struct waiter *w = arg;
  if (w->go)
    pthread_barrier_wait(w->go);
  int r =
      w->shutdown ? weft_rt_shutdown(g_rt, 0) : weft_rt_wait(g_rt, w->timeout);
  atomic_store(&w->result, r);
  atomic_store(&w->returned, 1);
  return NULL;
}

static weft_strand *serial_setup(uint64_t seed, unsigned chains, unsigned len) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  assert_int_equal(weft_rt_create(&g_rt, &cfg), 0);
  weft_strand *s;
  assert_int_equal(weft_strand_create(g_rt, &s), 0);
  atomic_store(&g_ran, 0);
  atomic_store(&g_overlaps, 0);
  atomic_store(&g_accepted, chains);
  g_expected = (long)chains * (len + 1);
  for (unsigned i = 0; i < chains; i++)
    assert_int_equal(weft_post(s, serial, (void *)(uintptr_t)len), 0);
  return s;
}

static void two_waits(bool shutdown) {
  unsigned chains = (unsigned)TU_SCALED(200, 40);
  weft_strand *s = serial_setup(7, chains, 200);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, 2);
  struct waiter w = {.go = &go, .timeout = UINT64_MAX, .shutdown = shutdown};
  assert_int_equal(pthread_create(&w.th, NULL, waiter_main, &w), 0);
  pthread_barrier_wait(&go);
  int r = weft_rt_wait(g_rt, UINT64_MAX);
  pthread_join(w.th, NULL);
  pthread_barrier_destroy(&go);
  assert_int_equal(r, 0);
  assert_int_equal(atomic_load(&w.result), 0);
  assert_int_equal(atomic_load(&g_overlaps), 0);
  /* Every post accepted ran once: all of them, unless the other thread
   * started the shutdown, which refuses the rest of the chains' posts. */
  assert_int_equal(atomic_load(&g_ran), atomic_load(&g_accepted));
  if (!shutdown)
    assert_int_equal(atomic_load(&g_ran), g_expected);
  TU_ASSERT_NO_ASYNC_ERRORS();
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
}

static void test_two_waiters(void **state) {
  (void)state;
  two_waits(false);
}

static void test_shutdown_from_other_thread(void **state) {
  (void)state;
  two_waits(true);
}

/* ---- a timed wait beside a driver -------------------------------------- */

static struct waiter g_timed;
static uint64_t g_real_t0;

static void tick(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  if (status)
    return;
  /* The run ends once the timed wait has returned; a bounded real time
   * turns a wait that never returns into a failure, not a hang. */
  if (atomic_load(&g_timed.returned) ||
      tu_now_ns() - g_real_t0 > (uint64_t)TU_WAIT_S / 2 * SEC) {
    int r = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_NOWAIT);
    TU_CHECK(r == 0 || r == -EALREADY);
  }
}

static void test_timeout_while_another_drives(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 5;
  assert_int_equal(weft_rt_create(&g_rt, &cfg), 0);
  weft_timer *t;
  assert_int_equal(weft_timer_create(g_rt, NULL, &t), 0);
  assert_int_equal(weft_timer_start(t, MS, MS, tick, NULL), 0);
  g_real_t0 = tu_now_ns();
  memset(&g_timed, 0, sizeof(g_timed));
  g_timed.timeout = SEC;
  /* Whichever of the two waits first drives. */
  assert_int_equal(pthread_create(&g_timed.th, NULL, waiter_main, &g_timed), 0);
  assert_int_equal(weft_rt_wait(g_rt, UINT64_MAX), 0);
  pthread_join(g_timed.th, NULL);
  assert_int_equal(atomic_load(&g_timed.returned), 1);
  assert_int_equal(atomic_load(&g_timed.result), -ETIMEDOUT);
  TU_ASSERT_NO_ASYNC_ERRORS();
  weft_timer_destroy(t);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
}

/* ---- another thread's posts and reads during a wait --------------------- */

static atomic_int g_started, g_posted_all;
static atomic_long g_other_ran;

static void other_work(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_other_ran, 1);
}

static void other_cancel(void *arg) {
  (void)arg;
  TU_CHECK(!"a post of the other thread cancelled");
}

static void watch_tick(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  if (status)
    return;
  atomic_store(&g_started, 1);
  if (atomic_load(&g_posted_all) ||
      tu_now_ns() - g_real_t0 > (uint64_t)TU_WAIT_S / 2 * SEC) {
    int r = weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_NOWAIT);
    TU_CHECK(r == 0 || r == -EALREADY);
  }
}

struct poster {
  weft_strand *s;
  long n, refused;
  uint64_t seed;
};

static void *poster_main(void *arg) {
  struct poster *p = arg;
  uint64_t t0 = tu_now_ns(), steps = 0, handlers = 0;
  /* Posts while the wait runs the simulation, not before. */
  while (!atomic_load(&g_started) &&
         tu_now_ns() - t0 < (uint64_t)TU_WAIT_S / 4 * SEC)
    tu_sleep_ms(1);
  TU_CHECK(atomic_load(&g_started));
  for (long i = 0; i < p->n; i++) {
    int r = weft_post_ex(p->s, other_work, other_cancel, NULL);
    TU_CHECKF(r == 0, "post %ld from another thread: %d", i, r);
    p->refused += r != 0;
    weft_sim_info si;
    TU_CHECK(weft_rt_sim_info(g_rt, &si) == 0);
    TU_CHECK(si.seed == p->seed);
    TU_CHECK(si.steps >= steps && si.handlers >= handlers);
    steps = si.steps;
    handlers = si.handlers;
  }
  atomic_store(&g_posted_all, 1);
  return NULL;
}

static void test_posts_from_other_thread(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 11;
  cfg.sim_faults = WEFT_SIM_FAULT_ENOMEM;
  cfg.sim_fault_odds = 1;
  assert_int_equal(weft_rt_create(&g_rt, &cfg), 0);
  struct poster p = {.n = (long)TU_SCALED(20000, 2000), .seed = 11};
  assert_int_equal(weft_strand_create(g_rt, &p.s), 0);
  weft_timer *t;
  assert_int_equal(weft_timer_create(g_rt, NULL, &t), 0);
  assert_int_equal(weft_timer_start(t, MS, MS, watch_tick, NULL), 0);
  atomic_store(&g_started, 0);
  atomic_store(&g_posted_all, 0);
  atomic_store(&g_other_ran, 0);
  g_real_t0 = tu_now_ns();
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, poster_main, &p), 0);
  assert_int_equal(weft_rt_wait(g_rt, UINT64_MAX), 0);
  pthread_join(th, NULL);
  assert_int_equal(p.refused, 0);
  assert_int_equal(atomic_load(&g_other_ran), p.n);
  TU_ASSERT_NO_ASYNC_ERRORS();
  weft_timer_destroy(t);
  weft_strand_release(p.s);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
}

/* ---- a wait inside the driver's own steps ------------------------------ */

static int g_phase; /* 0 until the job's done, then 1 */
static long g_enomem[2], g_ok[2];

static void chain(void *arg) {
  uintptr_t n = (uintptr_t)arg;
  if (!n)
    return;
  int r;
  while ((r = weft_post(weft_strand_current(), chain, (void *)(n - 1))) ==
         -ENOMEM)
    g_enomem[g_phase]++;
  TU_CHECK(r == 0);
  g_ok[g_phase]++;
}

static long job_waits(void *arg) {
  (void)arg;
  return weft_rt_wait(g_rt, MS);
}

static long g_job_result = 1;
static void job_done(void *arg, long result) {
  (void)arg;
  g_job_result = result;
  g_phase = 1;
}

static void test_nested_wait_keeps_faults(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 3;
  cfg.sim_faults = WEFT_SIM_FAULT_ENOMEM;
  cfg.sim_fault_odds = 8;
  assert_int_equal(weft_rt_create(&g_rt, &cfg), 0);
  weft_strand *s, *j;
  assert_int_equal(weft_strand_create(g_rt, &s), 0);
  assert_int_equal(weft_strand_create(g_rt, &j), 0);
  assert_int_equal(weft_post(s, chain, (void *)(uintptr_t)20000), 0);
  assert_int_equal(weft_blocking(g_rt, job_waits, NULL, j, job_done, NULL), 0);
  assert_int_equal(weft_rt_wait(g_rt, 100 * SEC), -ETIMEDOUT);
  /* A job waiting for its runtime's end waits for itself. */
  assert_int_equal(g_job_result, -EDEADLK);
  printf("# posts before the job's done: %ld ok, %ld -ENOMEM; after: %ld ok, "
         "%ld -ENOMEM\n",
         g_ok[0], g_enomem[0], g_ok[1], g_enomem[1]);
  assert_int_equal(g_ok[0] + g_ok[1], 20000);
  /* One in 8 draws strikes: over thousands of posts after the job, some. */
  assert_true(g_ok[1] > 1000);
  assert_true(g_enomem[1] > g_ok[1] / 32);
  TU_ASSERT_NO_ASYNC_ERRORS();
  weft_strand_release(s);
  weft_strand_release(j);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_waiters),
      cmocka_unit_test(test_shutdown_from_other_thread),
      cmocka_unit_test(test_timeout_while_another_drives),
      cmocka_unit_test(test_posts_from_other_thread),
      cmocka_unit_test(test_nested_wait_keeps_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
