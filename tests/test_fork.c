/*
 * test_fork: a child forked while a runtime runs is told the truth at
 * once, and can run a runtime of its own.
 *
 * weft.h, "fork": every call on a runtime created before the fork, or on
 * its objects, returns -ECHILD in the child (calls returning nothing do
 * nothing), weft_rt_destroy included; the child may create and use
 * runtimes of its own.
 *
 * The parent keeps its runtime busy (strands re-posting themselves, a
 * periodic timer, a blocking job in flight, a listener and a connection)
 * and forks 20 children while that runs, so a fork often lands while one
 * of weft's locks is held by a parent thread. Each child checks the calls
 * on the parent's runtime (posts, strand and timer calls, the blocking
 * pool, a connection call, the listener's close, address and statistics
 * (before the fix those two returned 0), shutdown, wait, destroy, stats)
 * all return
 * -ECHILD without blocking, then creates a runtime, runs a handler on it,
 * shuts it down and destroys it. A child that hangs is killed by its own
 * alarm (10 s) and counts as a failure. Skipped under ThreadSanitizer,
 * which does not support a multi-threaded process that forks and then
 * starts threads, and under AddressSanitizer, whose allocator (clang 14's,
 * Debian 12's) does not take its own locks across fork: a child forked
 * while a parent thread held one of its size classes deadlocks in its
 * first malloc of that class (seen in 3 of 15 runs, every thread of the
 * child waiting in SizeClassAllocator64::GetFromAllocator).
 */
#include "testutil.h"

#include <signal.h>
#include <sys/wait.h>

#define CHILDREN 20
#define CHURN 4

static atomic_bool g_stop;
static weft_strand *g_churn[CHURN];

static void churn(void *arg) {
  if (!atomic_load(&g_stop))
    weft_post(arg, churn, arg);
}

static void tick(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)status;
  (void)missed;
}

static long slow_job(void *arg) {
  (void)arg;
  tu_sleep_ms(5);
  return 0;
}

static weft_rt *g_rt;
static void job_done(void *arg, long r) {
  (void)arg;
  (void)r;
  if (!atomic_load(&g_stop))
    weft_blocking(g_rt, slow_job, NULL, NULL, job_done, NULL);
}

static void accept_keep(void *arg, weft_tcp *c) {
  atomic_store((_Atomic(weft_tcp *) *)arg, c);
}

static void child_ran(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

static void noop(void *arg) { (void)arg; }

static void on_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  (void)c;
  (void)n;
}

/* In the child: 0 if every check passed, else the number of the first
 * that failed. */
static int child(weft_timer *t, weft_tcp *c, weft_listener *l) {
  alarm(10);
  weft_strand *s;
  weft_timer *t2;
  weft_stats st;
  char buf[4];
  if (weft_post(g_churn[0], noop, NULL) != -ECHILD)
    return 1;
  if (weft_post_rt(g_rt, noop, NULL) != -ECHILD)
    return 2;
  if (weft_strand_create(g_rt, &s) != -ECHILD)
    return 3;
  if (weft_timer_create(g_rt, NULL, &t2) != -ECHILD)
    return 4;
  if (weft_timer_start(t, 1000, 0, tick, NULL) != -ECHILD)
    return 5;
  if (weft_timer_cancel(t) != -ECHILD)
    return 6;
  weft_timer_destroy(t);           /* does nothing */
  weft_strand_release(g_churn[1]); /* does nothing */
  if (weft_blocking(g_rt, slow_job, NULL, NULL, job_done, NULL) != -ECHILD)
    return 7;
  if (weft_tcp_read(c, buf, sizeof(buf), on_read, NULL) != -ECHILD)
    return 8;
  if (weft_tcp_close(c, 0) != -ECHILD)
    return 9;
  if (weft_listener_close(l, NULL, NULL) != -ECHILD)
    return 10;
  struct sockaddr_storage ss;
  unsigned sslen = sizeof(ss);
  weft_listener_stats ls;
  if (weft_listener_addr(l, (struct sockaddr *)&ss, &sslen) != -ECHILD)
    return 15;
  if (weft_listener_stats_get(l, &ls) != -ECHILD)
    return 16;
  if (weft_rt_stats(g_rt, &st) != -ECHILD)
    return 11;
  if (weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN) != -ECHILD)
    return 12;
  if (weft_rt_wait(g_rt, 0) != -ECHILD)
    return 13;
  if (weft_rt_destroy(g_rt) != -ECHILD)
    return 14;
  /* A runtime of its own. */
  weft_rt *mine;
  if (weft_rt_create(&mine, NULL) != 0)
    return 20;
  atomic_int ran = 0;
  if (weft_strand_create(mine, &s) != 0 || weft_post(s, child_ran, &ran) != 0)
    return 21;
  weft_strand_release(s);
  if (weft_rt_shutdown(mine, WEFT_SHUTDOWN_DRAIN) != 0 ||
      weft_rt_destroy(mine) != 0)
    return 22;
  return atomic_load(&ran) == 1 ? 0 : 23;
}

static void test_fork(void **state) {
  (void)state;
#if defined(TU_UNDER_TSAN) || defined(TU_UNDER_ASAN)
  skip();
#endif
  tu_reset_async_errors();
  tu_phase("fork: setup");
  tu_rt_create(&g_rt, 2, 0);
  atomic_store(&g_stop, false);
  for (int i = 0; i < CHURN; i++) {
    tu_strand_create(g_rt, &g_churn[i]);
    tu_assert_rc(weft_post(g_churn[i], churn, g_churn[i]), 0);
  }
  weft_timer *t;
  tu_assert_rc(weft_timer_create(g_rt, NULL, &t), 0);
  tu_assert_rc(weft_timer_start(t, 0, 100000, tick, NULL), 0);
  tu_assert_rc(weft_blocking(g_rt, slow_job, NULL, NULL, job_done, NULL), 0);
  _Atomic(weft_tcp *) kept = NULL;
  weft_listener *l;
  uint16_t port = tu_tcp_listen(g_rt, NULL, accept_keep, (void *)&kept, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  while (!atomic_load(&kept))
    tu_sleep_ms(1);

  tu_phase("fork: children");
  int bad = 0;
  for (int k = 0; k < CHILDREN; k++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
      _exit(child(t, atomic_load(&kept), l));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (bad++ < 5)
        print_error("child %d: %s %d\n", k,
                    WIFEXITED(status) ? "failed check" : "killed by signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    tu_sleep_ms(2);
  }

  tu_phase("fork: the parent goes on");
  atomic_int ran = 0;
  tu_assert_rc(weft_post(g_churn[0], child_ran, &ran), 0);
  atomic_store(&g_stop, true);
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_timer_destroy(t);
  for (int i = 0; i < CHURN; i++)
    weft_strand_release(g_churn[i]);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  close(fd);
  assert_int_equal(atomic_load(&ran), 1);
  assert_int_equal(bad, 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
