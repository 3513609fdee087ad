/*
 * test_lock: weft__lock (src/lock.h), the futex mutex guarding each
 * shard's timer wheel, gives mutual exclusion and never loses a wakeup.
 *
 *  - 4 threads (twice the CPUs here, so holders get preempted and waiters
 *    reach the futex path) each take the lock N times, by weft__lock or by
 *    a weft__trylock loop, and inside it increment a plain counter and
 *    check that no other thread is inside. The counter must end at 4 * N;
 *    under ThreadSanitizer a missing happens-before edge between critical
 *    sections is reported as a race on the counter.
 *  - Some critical sections sleep 50 us, so others must sleep on the futex
 *    and be woken by weft__unlock: a lost wakeup hangs the test (watchdog).
 */
#include "testutil.h"

#include "lock.h"

#define NTHREADS 4

static weft__lock_t lock;
static uint64_t counter; /* guarded by lock: deliberately not atomic */
static atomic_int inside;

static void *worker(void *arg) {
  uint64_t n = *(const uint64_t *)arg;
  for (uint64_t i = 0; i < n; i++) {
    if (i % 3 == 0) {
      while (!weft__trylock(&lock))
        ;
    } else {
      weft__lock(&lock);
    }
    int was = atomic_fetch_add_explicit(&inside, 1, memory_order_relaxed);
    TU_CHECKF(was == 0, "%d other threads inside the lock", was);
    counter++;
    if (i % 1024 == 0)
      nanosleep(&(struct timespec){0, 50000}, NULL);
    atomic_fetch_sub_explicit(&inside, 1, memory_order_relaxed);
    weft__unlock(&lock);
  }
  return NULL;
}

static void test_mutual_exclusion(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("weft__lock from 4 threads");
  weft__lock_init(&lock);
  counter = 0;
  uint64_t n = TU_SCALED(200000, 5000);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    assert_int_equal(pthread_create(&th[i], NULL, worker, &n), 0);
  for (int i = 0; i < NTHREADS; i++)
    tu_thread_join(th[i], "a locking thread");
  weft__lock(&lock);
  assert_int_equal(counter, NTHREADS * n);
  weft__unlock(&lock);
  assert_int_equal(atomic_load(&lock.word), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mutual_exclusion),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
