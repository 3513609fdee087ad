/*
 * test_io_busy_poll: a worker that never parks still serves its sockets.
 *
 * A one-worker runtime is fed posts from outside one at a time: a poster
 * thread posts the next handler as soon as the current one has started,
 * and each handler runs 200 us, so whenever the worker looks for work
 * one item waits in the inject queue and its own run queue is empty. It
 * never parks, so it never waits in its backend, and on epoll it only
 * sees what became ready through the run loop's own polls (io.c: one turn
 * in 16, busy or idle), and on io_uring the requests it prepares go to
 * the kernel only when it submits them (one turn in 8, busy or idle). A
 * listener is made and a client connects while the stream runs; the
 * accept callback must run within AFTER_CONNECT more handlers. A worker
 * that polled or submitted only with work of its own queued would leave
 * the connection waiting until the stream stopped or the poster fell
 * behind. Registered for each backend.
 */
#include "testutil.h"

#define SPIN_NS 200000u
#define AFTER_CONNECT 500u

static atomic_uint started, accepted, stop;

static void spin_handler(void *arg) {
  (void)arg;
  atomic_fetch_add(&started, 1);
  uint64_t end = tu_now_ns() + SPIN_NS;
  while (tu_now_ns() < end) {
  }
}

static void on_accept(void *arg, weft_tcp *conn) {
  (void)arg;
  atomic_store(&accepted, 1);
  TU_CHECK(weft_tcp_close(conn, 1) == 0);
}

static void *poster_main(void *arg) {
  weft_rt *rt = arg;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&stop) && tu_now_ns() < deadline) {
    unsigned seen = atomic_load(&started);
    TU_CHECK(weft_post_rt(rt, spin_handler, NULL) == 0);
    /* The next post goes in while this one runs: the worker then finds
     * exactly one item whenever it looks. */
    while (atomic_load(&started) == seen && !atomic_load(&stop) &&
           tu_now_ns() < deadline) {
    }
  }
  return NULL;
}

static void test_accept_while_fed_one_by_one(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);

  pthread_t th;
  tu_thread_start(&th, poster_main, rt);
  while (atomic_load(&started) < 20) /* the stream runs */
    tu_sleep_ms(1);

  /* Made while the worker is fed: on io_uring its accept request is
   * prepared on the worker's ring by a turn of the stream. */
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, on_accept, NULL, &l);
  tu_sleep_ms(5);

  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  unsigned s0 = atomic_load(&started), ran = 0;
  while (!atomic_load(&accepted) &&
         (ran = atomic_load(&started) - s0) < AFTER_CONNECT)
    tu_sleep_ms(1);
  atomic_store(&stop, 1);
  tu_thread_join(th, "the poster");
  if (!atomic_load(&accepted))
    fail_msg("not accepted after %u more handlers, the worker fed posts "
             "one at a time (backend %s)",
             ran, weft_rt_backend_name(rt));
  close(fd);

  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accept_while_fed_one_by_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
