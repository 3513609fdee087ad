/*
 * test_tcp_listen_shutdown: weft_tcp_listen racing a shutdown returns 0 or
 * -ESHUTDOWN, nothing else, and never leaves or frees a listening socket
 * twice.
 *
 * Each round: a runtime of 2 workers, so that a listener is two sockets
 * (one a shard) registered one after the other; a thread outside it
 * listens on 127.0.0.1 over and over until a call fails; the test thread
 * starts a DRAIN shutdown after a short, varying delay. A shutdown that
 * began between the two registrations used to find the first socket live
 * and close it, while the second's registration failed and had the first
 * discarded again (under ASan: a use after free). Listeners that were made
 * are closed by the shutdown: weft_listener_close then says -EALREADY,
 * and a round's runtime is destroyed with all of them.
 */
#include "testutil.h"

#include <arpa/inet.h>

#define MAX_LISTENERS 4096

typedef struct round_ctx {
  weft_rt *rt;
  unsigned made;
  int failed;
  weft_listener *l[MAX_LISTENERS];
} round_ctx;

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  weft_tcp_close(c, 1);
}

static void *listener_thread(void *arg) {
  round_ctx *r = arg;
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  while (r->made < MAX_LISTENERS) {
    int rc = weft_tcp_listen(r->rt, (struct sockaddr *)&a, sizeof(a), NULL,
                             on_accept, NULL, &r->l[r->made]);
    if (rc) {
      r->failed = rc;
      return NULL;
    }
    r->made++;
  }
  r->failed = -ENOSPC; /* never shut down in time: the round fails */
  return NULL;
}

static void test_listen_during_shutdown(void **state) {
  (void)state;
  unsigned rounds = (unsigned)TU_SCALED(60, 10);
  for (unsigned i = 0; i < rounds; i++) {
    round_ctx *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    weft_config cfg;
    weft_config_init(&cfg);
    cfg.workers = 2;
    assert_int_equal(weft_rt_create(&r->rt, &cfg), 0);
    pthread_t t;
    tu_thread_start(&t, listener_thread, r);
    struct timespec d = {0, (long)(50000 + (i % 8) * 100000)};
    nanosleep(&d, NULL);
    assert_int_equal(weft_rt_shutdown(r->rt, WEFT_SHUTDOWN_DRAIN), 0);
    tu_thread_join(t, "the listener thread");
    if (r->failed != -ESHUTDOWN)
      fail_msg("round %u: weft_tcp_listen failed with %d (%s) during a "
               "shutdown, not -ESHUTDOWN",
               i, r->failed, weft_strerror(r->failed));
    for (unsigned k = 0; k < r->made; k++)
      assert_int_equal(weft_listener_close(r->l[k], NULL, NULL), -EALREADY);
    assert_int_equal(weft_rt_destroy(r->rt), 0);
    free(r);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_listen_during_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
