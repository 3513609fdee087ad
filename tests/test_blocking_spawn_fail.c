/*
 * test_blocking_spawn_fail: weft_blocking accepts a job only when a pool
 * thread will run it.
 *
 * This program defines pthread_create itself, so that the library's calls
 * come here: while the calling thread has fail_here set, every create
 * fails with EAGAIN, as against a thread limit.
 *
 *  - no pool thread: with no pool thread running and none able to start,
 *    weft_blocking fails with -EAGAIN, its work and done never run, and
 *    its slot is not lost: once threads start again, both pool threads
 *    and the whole queue take jobs, each done runs exactly once, and a
 *    DRAIN shutdown completes.
 *  - a live thread: while one pool thread runs a job and no other can
 *    start, a second job is accepted (0) and runs once the first is done.
 */
#include "testutil.h"

#include <dlfcn.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
                         void *);

/* As in test_lazy_start_fail.c: the sanitizers' own interceptor when a
 * sanitizer runtime is linked in statically (clang), else the next
 * definition (libc, or gcc's dynamic sanitizer runtime). */
extern int __interceptor_pthread_create(pthread_t *, const pthread_attr_t *,
                                        void *(*)(void *), void *)
    __attribute__((weak));

static create_fn real_create;

__attribute__((constructor)) static void find_real(void) {
  real_create = __interceptor_pthread_create
                    ? __interceptor_pthread_create
                    : (create_fn)dlsym(RTLD_NEXT, "pthread_create");
}

static _Thread_local bool fail_here;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                   void *arg) {
  if (fail_here)
    return EAGAIN;
  return real_create(t, a, fn, arg);
}

#define QUEUE 4

static tu_count g_work, g_done;
static tu_gate g_gate;

static long work_fn(void *arg) {
  atomic_fetch_add(&g_work, 1);
  if (arg)
    tu_gate_pass(&g_gate);
  return 7;
}

static void done_fn(void *arg, long result) {
  (void)arg;
  TU_CHECKF(result == 7, "done got %ld", result);
  atomic_fetch_add(&g_done, 1);
}

static weft_rt *make_rt(void) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  cfg.blocking_threads = 2;
  cfg.blocking_queue = QUEUE;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

static void finish(weft_rt *rt, unsigned ndone) {
  tu_wait_count(&g_done, ndone, "done calls");
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_done), ndone);
  assert_int_equal(atomic_load(&g_work), ndone);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_no_pool_thread(void **state) {
  (void)state;
  atomic_store(&g_work, 0);
  atomic_store(&g_done, 0);
  weft_rt *rt = make_rt();
  weft_job id = 0;
  fail_here = true;
  int r = weft_blocking(rt, work_fn, NULL, NULL, done_fn, &id);
  fail_here = false;
  assert_int_equal(r, -EAGAIN);
  assert_true(id == 0); /* not written for a refused job */
  /* The refused job holds no slot: with both pool threads held in work
   * by the gate, the queue takes QUEUE more, every slot of the table. */
  tu_gate_init(&g_gate);
  for (unsigned i = 0; i < 2; i++)
    assert_int_equal(weft_blocking(rt, work_fn, &g_gate, NULL, done_fn, NULL),
                     0);
  tu_wait_count(&g_work, 2, "both pool threads in work");
  for (unsigned i = 0; i < QUEUE; i++)
    assert_int_equal(weft_blocking(rt, work_fn, NULL, NULL, done_fn, NULL), 0);
  assert_int_equal(weft_blocking(rt, work_fn, NULL, NULL, done_fn, NULL),
                   -EAGAIN);
  tu_gate_open(&g_gate);
  finish(rt, 2 + QUEUE);
  tu_gate_destroy(&g_gate);
}

static void test_live_thread(void **state) {
  (void)state;
  atomic_store(&g_work, 0);
  atomic_store(&g_done, 0);
  weft_rt *rt = make_rt();
  tu_gate_init(&g_gate);
  assert_int_equal(weft_blocking(rt, work_fn, &g_gate, NULL, done_fn, NULL), 0);
  tu_wait_count(&g_work, 1, "the first job in work");
  fail_here = true;
  int r = weft_blocking(rt, work_fn, NULL, NULL, done_fn, NULL);
  fail_here = false;
  assert_int_equal(r, 0);
  tu_gate_open(&g_gate);
  finish(rt, 2);
  tu_gate_destroy(&g_gate);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_pool_thread),
      cmocka_unit_test(test_live_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
