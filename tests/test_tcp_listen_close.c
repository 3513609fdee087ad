/*
 * test_tcp_listen_close: weft_listener_close while connections keep coming.
 * weft.h: "Stops accepting and closes the sockets. done(arg), if not NULL,
 * runs on any worker once no accept callback of l will start any more;
 * ... Connections already accepted are not affected."
 *
 * ROUNDS rounds (scaled), each with a fresh listener on a runtime of 2
 * workers. A client thread connects in a loop, as fast as the kernel
 * completes handshakes; the accept callback closes each connection at
 * once. After AHEAD connections were accepted, the test thread closes the
 * listener while the client goes on; the client stops once done has run.
 * With io_uring on 6.10 and later an accept request is often in the ring
 * at that moment (listen.c, ring_accept): its connection must be closed,
 * not delivered, and the listener must still finish. Each client
 * connection sends one byte. Checked each round:
 *   - done runs exactly once, and no accept callback starts after it
 *     (before the fix, accept callbacks of connections accepted just
 *     before the close ran after done: 38 in one run);
 *   - every client connection ends, with EOF or RST, none hangs: those
 *     accepted (closed by the callback), those that a ring accept took
 *     after the close (closed by weft), and those still in the accept
 *     queue when the socket closed (reset by the kernel); connects after
 *     the close are refused.
 * The byte: without it a few connections hung, with every backend. The
 * kernel (6.18) can drop the handshake's last ACK at a listener that is
 * closing (TcpExtListenDrops), so the client believes it is connected
 * while the server has no socket for it; it learns otherwise (RST) only
 * when it sends. Not something a server can close.
 * At the end every socket is freed (stats.tcp_live == 0) and, after
 * weft_rt_destroy, the process has as many descriptors open as before.
 */
#include "testutil.h"

#define NWORKERS 2
#define AHEAD 8
#define MAXC 4096

typedef struct round_ctx {
  weft_listener *l;
  tu_count accepted; /* accept callbacks run */
  tu_count done;     /* done callbacks run */
  atomic_uint late;  /* accept callbacks that started after done */
  atomic_bool stop;  /* the client stops connecting */
  uint16_t port;
  int fds[MAXC]; /* the client's connections */
  unsigned nfds;
  unsigned refused;    /* connects that failed once the listener closed */
  unsigned early_fail; /* connects that failed before the close */
  atomic_bool closing; /* weft_listener_close was called */
} round_ctx;

static void accept_cb(void *arg, weft_tcp *c) {
  round_ctx *r = arg;
  if (atomic_load(&r->done))
    atomic_fetch_add(&r->late, 1);
  atomic_fetch_add(&r->accepted, 1);
  int rc = weft_tcp_close(c, 0);
  TU_CHECKF(rc == 0, "weft_tcp_close of an accepted connection: %d", rc);
}

static void done_cb(void *arg) {
  round_ctx *r = arg;
  atomic_fetch_add(&r->done, 1);
}

static void *client_main(void *arg) {
  round_ctx *r = arg;
  while (!atomic_load(&r->stop) && r->nfds < MAXC) {
    int fd = tu_sock_connect(r->port, 0, 0);
    if (fd >= 0 && send(fd, "x", 1, MSG_NOSIGNAL) != 1) {
      close(fd); /* reset already: nothing to wait for */
    } else if (fd >= 0) {
      r->fds[r->nfds++] = fd;
    } else if (atomic_load(&r->closing)) {
      r->refused++;
      tu_sleep_ms(1); /* refused at once: do not spin on it */
    } else {
      r->early_fail++;
    }
  }
  return NULL;
}

static void one_round(weft_rt *rt, round_ctx *r, uint64_t *eof,
                      uint64_t *reset) {
  memset(r, 0, sizeof *r);
  r->port = tu_tcp_listen(rt, NULL, accept_cb, r, &r->l);
  pthread_t th;
  tu_thread_start(&th, client_main, r);
  tu_wait_count(&r->accepted, AHEAD, "the first connections accepted");
  atomic_store(&r->closing, true);
  tu_assert_rc(weft_listener_close(r->l, done_cb, r), 0);
  tu_wait_count(&r->done, 1, "the listener's done callback");
  atomic_store(&r->stop, true);
  tu_thread_join(th, "client");
  assert_int_equal(r->early_fail, 0);
  uint64_t eofs = 0;
  for (unsigned i = 0; i < r->nfds; i++) {
    int rc = tu_sock_wait_closed(r->fds[i], TU_WAIT_S * 1000, NULL);
    if (rc != 0 && rc != -ECONNRESET)
      fail_msg("client connection %u of %u: %d (%s), want EOF or RST", i,
               r->nfds, rc, strerror(-rc));
    if (rc == -ECONNRESET)
      (*reset)++;
    else
      eofs++;
    close(r->fds[i]);
  }
  assert_int_equal(atomic_load(&r->done), 1);
  assert_int_equal(atomic_load(&r->late), 0);
  *eof += eofs;
}

static void test_listen_close(void **state) {
  (void)state;
  unsigned fds_before = tu_count_fds();
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  uint64_t rounds = TU_SCALED(200, 20), eofs = 0, reset = 0, conns = 0;
  round_ctx *r = malloc(sizeof *r);
  assert_non_null(r);
  for (uint64_t i = 0; i < rounds; i++) {
    tu_phase("listen close: a round");
    one_round(rt, r, &eofs, &reset);
    conns += r->nfds;
  }
  print_message("[ INFO     ] %" PRIu64 " rounds, %" PRIu64
                " connections: %" PRIu64 " ended by EOF, %" PRIu64 " by RST\n",
                rounds, conns, eofs, reset);
  free(r);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every socket to be freed");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_int_equal(tu_count_fds(), fds_before);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_listen_close),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
