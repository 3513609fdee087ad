/*
 * test_tcp_listen_inuse: weft_tcp_listen on an address already in use
 * fails with -EADDRINUSE unless both listeners share it.
 *
 *  - A listener of every shard (SO_REUSEPORT group) on a port picked by
 *    port 0; a second weft_tcp_listen on that port fails with -EADDRINUSE,
 *    with and without WEFT_LISTEN_SINGLE, and the first still accepts.
 *  - A plain socket listening without SO_REUSEPORT: weft_tcp_listen on its
 *    port fails with -EADDRINUSE.
 *  - WEFT_LISTEN_SHARE on both: the second listen succeeds, and
 *    connections reach the two listeners' callbacks between them.
 *  - WEFT_LISTEN_SHARE joining a listener made without it (net.h: such a
 *    listener "keeps out weft listeners made without it, not those made
 *    with it"): a default one and a WEFT_LISTEN_SINGLE one, on runtimes of
 *    1 and 2 workers. The join succeeds, a listen without the flag still
 *    fails with -EADDRINUSE, and connections reach the two between them.
 *    Before the fix a single socket (WEFT_LISTEN_SINGLE, or the default
 *    on 1 worker) was bound without SO_REUSEPORT: the join failed with
 *    -EADDRINUSE.
 * Every listener is closed and the runtime shut down cleanly.
 */
#include "testutil.h"

#include <arpa/inet.h>

static tu_count g_accepted;

static void accept_cb(void *arg, weft_tcp *c) {
  atomic_fetch_add((tu_count *)arg, 1);
  atomic_fetch_add(&g_accepted, 1);
  TU_CHECK(weft_tcp_close(c, 0) == 0);
}

static struct sockaddr_in loopback(uint16_t port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

static uint16_t port_of(weft_listener *l) {
  struct sockaddr_in a;
  unsigned len = sizeof(a);
  assert_int_equal(weft_listener_addr(l, (struct sockaddr *)&a, &len), 0);
  return ntohs(a.sin_port);
}

static int listen_on(weft_rt *rt, uint16_t port, unsigned flags,
                     tu_count *count, weft_listener **out) {
  struct sockaddr_in a = loopback(port);
  weft_listen_opts o = {.flags = flags};
  return weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof(a), &o, accept_cb,
                         count, out);
}

/* Connects n times to port and waits until the server closes each. */
static void connect_n(uint16_t port, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = loopback(port);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    char b;
    (void)!read(fd, &b, 1); /* EOF or reset once accepted and closed */
    close(fd);
  }
}

static weft_rt *make_rt_n(unsigned workers) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = workers;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

static weft_rt *make_rt(void) { return make_rt_n(2); }

static void end_rt(weft_rt *rt) {
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_group_in_use(void **state) {
  (void)state;
  weft_rt *rt = make_rt();
  tu_count first = 0, second = 0;
  weft_listener *l, *l2 = NULL;
  assert_int_equal(listen_on(rt, 0, 0, &first, &l), 0);
  uint16_t port = port_of(l);
  assert_int_equal(listen_on(rt, port, 0, &second, &l2), -EADDRINUSE);
  assert_int_equal(listen_on(rt, port, WEFT_LISTEN_SINGLE, &second, &l2),
                   -EADDRINUSE);
  assert_null(l2);
  connect_n(port, 8);
  tu_wait_count(&first, 8, "the first listener's accepts");
  assert_int_equal(atomic_load(&second), 0);
  tu_listener_close(l);
  end_rt(rt);
}

static void test_plain_socket_in_use(void **state) {
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = loopback(0);
  socklen_t len = sizeof(a);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 8), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  weft_rt *rt = make_rt();
  tu_count n = 0;
  weft_listener *l = NULL;
  assert_int_equal(listen_on(rt, ntohs(a.sin_port), 0, &n, &l), -EADDRINUSE);
  assert_null(l);
  end_rt(rt);
  close(fd);
}

static void test_shared(void **state) {
  (void)state;
  weft_rt *rt = make_rt();
  tu_count first = 0, second = 0;
  weft_listener *l, *l2;
  assert_int_equal(listen_on(rt, 0, WEFT_LISTEN_SHARE, &first, &l), 0);
  uint16_t port = port_of(l);
  assert_int_equal(listen_on(rt, port, WEFT_LISTEN_SHARE, &second, &l2), 0);
  atomic_store(&g_accepted, 0);
  connect_n(port, 32);
  tu_wait_count(&g_accepted, 32, "accepts of both listeners");
  assert_int_equal(atomic_load(&first) + atomic_load(&second), 32);
  tu_listener_close(l);
  tu_listener_close(l2);
  end_rt(rt);
}

static void join_one(unsigned workers, unsigned flags) {
  print_message("[ INFO     ] %u worker(s), first listener's flags %u\n",
                workers, flags);
  weft_rt *rt = make_rt_n(workers);
  tu_count first = 0, second = 0;
  weft_listener *l, *l2, *l3 = NULL;
  assert_int_equal(listen_on(rt, 0, flags, &first, &l), 0);
  uint16_t port = port_of(l);
  assert_int_equal(listen_on(rt, port, WEFT_LISTEN_SHARE, &second, &l2), 0);
  assert_int_equal(listen_on(rt, port, 0, &second, &l3), -EADDRINUSE);
  assert_null(l3);
  atomic_store(&g_accepted, 0);
  connect_n(port, 16);
  tu_wait_count(&g_accepted, 16, "accepts of both listeners");
  assert_int_equal(atomic_load(&first) + atomic_load(&second), 16);
  tu_listener_close(l);
  tu_listener_close(l2);
  end_rt(rt);
}

static void test_share_joins_unshared(void **state) {
  (void)state;
  join_one(1, 0);
  join_one(1, WEFT_LISTEN_SINGLE);
  join_one(2, 0);
  join_one(2, WEFT_LISTEN_SINGLE);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_group_in_use),
      cmocka_unit_test(test_plain_socket_in_use),
      cmocka_unit_test(test_shared),
      cmocka_unit_test(test_share_joins_unshared),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
