/*
 * test_tcp_connect_shutdown: weft_tcp_connect racing a shutdown returns 0
 * or -ESHUTDOWN, nothing else, and every connect it accepted gets its
 * connect callback exactly once, then its close callback exactly once.
 *
 * Each round: a runtime of 2 workers; a thread outside it connects to a
 * plain listening socket over and over (strand NULL, so each connection
 * makes a strand of its own) until a call fails; the test thread starts a
 * DRAIN shutdown after a short, varying delay. The failing call must say
 * -ESHUTDOWN: a connect that passed the shutdown check just before the
 * shutdown began used to fail later, when its strand was refused, and
 * report that as -ENOMEM. The connections are left to the shutdown to
 * close; each sets its close callback in its connect callback (weft.h:
 * the shutdown closes every connection, and the close callback comes
 * after the connection's other callbacks). When the shutdown has
 * returned, the connect callbacks run and the close callbacks run each
 * equal the connects accepted.
 */
#include "testutil.h"

#include <arpa/inet.h>

typedef struct round_ctx {
  weft_rt *rt;
  struct sockaddr_in addr;
  unsigned accepted; /* weft_tcp_connect calls that returned 0 */
  int failed;        /* the first call that did not */
  tu_count cbs;      /* connect callbacks */
  tu_count closes;   /* close callbacks */
} round_ctx;

static void close_cb(void *data, weft_tcp *c) {
  (void)c;
  atomic_fetch_add(&((round_ctx *)data)->closes, 1);
}

static void connect_cb(void *arg, weft_tcp *c, int status) {
  (void)status;
  TU_CHECK_RC(weft_tcp_set_data(c, arg, close_cb), 0);
  atomic_fetch_add(&((round_ctx *)arg)->cbs, 1);
}

static void *connector(void *arg) {
  round_ctx *r = arg;
  for (;;) {
    weft_tcp *c;
    int rc = weft_tcp_connect(r->rt, NULL, (struct sockaddr *)&r->addr,
                              sizeof(r->addr), 0, connect_cb, r, &c);
    if (rc) {
      r->failed = rc;
      return NULL;
    }
    r->accepted++;
  }
}

static void test_connect_during_shutdown(void **state) {
  (void)state;
  uint16_t port;
  int lfd = tu_sock_listen(4096, &port);
  assert_true(lfd >= 0);
  unsigned rounds = (unsigned)TU_SCALED(60, 10);
  for (unsigned i = 0; i < rounds; i++) {
    round_ctx r = {.addr = {.sin_family = AF_INET, .sin_port = htons(port)}};
    r.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    weft_config cfg;
    weft_config_init(&cfg);
    cfg.workers = 2;
    assert_int_equal(weft_rt_create(&r.rt, &cfg), 0);
    pthread_t t;
    tu_thread_start(&t, connector, &r);
    struct timespec d = {0, (long)(100000 + (i % 8) * 150000)};
    nanosleep(&d, NULL);
    assert_int_equal(weft_rt_shutdown(r.rt, WEFT_SHUTDOWN_DRAIN), 0);
    tu_thread_join(t, "the connector");
    if (r.failed != -ESHUTDOWN)
      fail_msg("round %u: weft_tcp_connect failed with %d (%s) during a "
               "shutdown, not -ESHUTDOWN",
               i, r.failed, weft_strerror(r.failed));
    assert_int_equal(atomic_load(&r.cbs), r.accepted);
    assert_int_equal(atomic_load(&r.closes), r.accepted);
    assert_int_equal(weft_rt_destroy(r.rt), 0);
  }
  close(lfd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_connect_during_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
