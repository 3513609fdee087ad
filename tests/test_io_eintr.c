/*
 * test_io_eintr: setting up and tearing down io_uring rings never
 * interrupts the application's own blocking calls.
 *
 * Linux puts the thread that creates a ring on the ring's task list, and
 * tearing the ring down queues task_work with TWA_SIGNAL on every task
 * still on it; a blocking call with a timeout (here recv(2) with
 * SO_RCVTIMEO) in such a thread then fails with EINTR instead of timing
 * out. weft creates its rings on a short-lived thread of its own (io.c).
 *
 *  - The first weft_rt_create of the process probes io_uring with a ring
 *    it tears down at once: the creating thread's recv right after must
 *    time out (EAGAIN), not fail with EINTR. This must be the process's
 *    first runtime (the probe's result is kept), so it is the first test.
 *  - A thread that opens the runtime's first socket (which sets up every
 *    shard's ring) and then blocks in recv while another thread destroys
 *    the runtime (tearing the rings down): EAGAIN again.
 * Each recv waits RECV_MS with nothing to read. On a kernel without
 * io_uring (the backend is then epoll) both still run and must pass.
 */
#include "testutil.h"

#define RECV_MS 300

/* recv on an idle socket pair with a RECV_MS timeout; returns errno. */
static int timed_recv(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return -1;
  struct timeval tv = {0, RECV_MS * 1000};
  setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  ssize_t n = recv(sv[0], &c, 1, 0);
  int e = n < 0 ? errno : 0;
  close(sv[0]);
  close(sv[1]);
  return e;
}

static void expect_timeout(int e, const char *when) {
  if (e != EAGAIN && e != EWOULDBLOCK)
    fail_msg("recv %s: %s, expected a timeout (EAGAIN)", when,
             e > 0 ? strerror(e) : "returned data or failed to start");
}

static void test_probe(void **state) {
  (void)state;
  tu_phase("recv right after the first weft_rt_create");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  print_message("[ INFO     ] backend %s\n", weft_rt_backend_name(rt));
  expect_timeout(timed_recv(), "after weft_rt_create");
  assert_int_equal(weft_rt_destroy(rt), 0);
}

typedef struct opener {
  weft_rt *rt;
  tu_count listening;
  tu_count may_block;
  int err;
} opener;

static void never_accept(void *arg, weft_tcp *c) {
  (void)arg;
  weft_tcp_close(c, 1);
}

static void *opener_main(void *arg) {
  opener *o = arg;
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  weft_listener *l;
  int rc = weft_tcp_listen(o->rt, (struct sockaddr *)&a, sizeof a, NULL,
                           never_accept, NULL, &l);
  TU_CHECKF(rc == 0, "weft_tcp_listen: %d (%s)", rc, weft_strerror(rc));
  atomic_store(&o->listening, 1);
  tu_wait_count_bg(&o->may_block, 1, "the destroyer to start");
  o->err = timed_recv();
  return NULL;
}

static void test_teardown(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("recv in the thread that opened the first socket, at destroy");
  opener o;
  memset(&o, 0, sizeof o);
  tu_rt_create(&o.rt, 2, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, opener_main, &o), 0);
  tu_wait_count(&o.listening, 1, "the first socket");
  atomic_store(&o.may_block, 1);
  tu_sleep_ms(RECV_MS / 3); /* it is in recv by now */
  tu_assert_rc(weft_rt_shutdown(o.rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(o.rt), 0);
  tu_thread_join(t, "the socket opener");
  expect_timeout(o.err, "while the runtime was destroyed");
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
