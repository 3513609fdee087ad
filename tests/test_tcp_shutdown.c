/*
 * test_tcp_shutdown: weft_rt_shutdown with sockets open. weft.h:
 * "weft_rt_shutdown closes every listener and connection of the runtime in
 * the same way [as weft_tcp_close: every operation in flight completes
 * exactly once, with -ECANCELED when the close ended it, before the close
 * callback] (in both modes; in CANCEL mode the callbacks still run, with
 * -ECANCELED), and new ones fail with -ESHUTDOWN"; weft_listener_close
 * after it: "-EALREADY (... closed by a shutdown: done is not called)".
 *
 * Open at the shutdown, in DRAIN and in CANCEL mode: a listener; 50
 * accepted connections from plain clients that neither send nor read, each
 * with a read in flight, every fifth also with four 16 KiB writes queued
 * (more than their small socket buffers hold); a weft client connected to
 * the listener, with a read in flight; a connect in flight to a plain
 * listener whose backlog is full; and every seventh accepted connection
 * closed by the user just before the shutdown. When weft_rt_shutdown
 * returns:
 *   - every read, write and connect callback has run exactly once, on its
 *     strand; none had anything to complete with, so the reads and the
 *     connect got -ECANCELED (the two ends of the weft client's connection
 *     may instead see the other end's close: EOF or RST), writes 0 or
 *     -ECANCELED in order, the last -ECANCELED;
 *   - the connections the user closed got their close callback exactly
 *     once, after their operations' callbacks;
 *   - the sockets are closed: every plain client sees EOF or RST, and the
 *     listener's port refuses connections;
 *   - weft_listener_close is -EALREADY (done not called), weft_tcp_listen
 *     and weft_tcp_connect are -ESHUTDOWN; weft_rt_destroy returns 0 and
 *     the sanitizers find nothing (a read buffer is freed in its callback).
 * weft.h does not say whether weft_tcp_close may still be called on a
 * connection after the shutdown closed it (its memory may be gone), so
 * that is not done here.
 */
#include "testutil.h"

#define NWORKERS 2
#define NPLAIN 50
#define SMALL_BUF 4096
#define NW 4
#define WCHUNK 16384
#define RBUF 1024

typedef struct sconn {
  weft_tcp *c;
  unsigned char *rbuf, *wbuf;
  bool writes, user_close;
  uint16_t peer_port, local_port;
  atomic_uint connect_cbs, read_cbs, write_cbs, close_cbs, order_bad;
  atomic_long read_res;
  atomic_int connect_res, wres[NW];
} sconn;

#define NCONN (NPLAIN + 1)
static sconn g_acc[NCONN]; /* accepted: NPLAIN plain, one weft client */
static sconn g_cli;        /* the weft client */
static sconn g_pending;    /* the connect that cannot complete */
static atomic_uint g_nacc;
static tu_event g_ev; /* accepted, connected, closed */

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void read_cb(void *arg, weft_tcp *c, long n) {
  sconn *s = arg;
  TU_CHECK(on_strand_of(c) && c == s->c);
  TU_CHECK(atomic_load(&s->close_cbs) == 0);
  atomic_store(&s->read_res, n);
  atomic_fetch_add(&s->read_cbs, 1);
  free(s->rbuf); /* the read is over: weft.h, buffers */
  s->rbuf = NULL;
}

static void write_cb(void *arg, weft_tcp *c, int status) {
  sconn *s = arg;
  TU_CHECK(on_strand_of(c) && c == s->c);
  TU_CHECK(atomic_load(&s->close_cbs) == 0);
  unsigned k = atomic_fetch_add(&s->write_cbs, 1);
  if (k >= NW)
    return;
  atomic_store(&s->wres[k], status);
  if (k > 0 && status == 0 && atomic_load(&s->wres[k - 1]) != 0)
    atomic_fetch_add(&s->order_bad, 1);
}

static void close_cb(void *arg, weft_tcp *c) {
  sconn *s = arg;
  TU_CHECK(on_strand_of(c) && c == s->c);
  TU_CHECKF(atomic_load(&s->read_cbs) == 1 &&
                atomic_load(&s->write_cbs) == (s->writes ? NW : 0),
            "close callback before the operations' callbacks (%u read, %u "
            "write)",
            atomic_load(&s->read_cbs), atomic_load(&s->write_cbs));
  atomic_fetch_add(&s->close_cbs, 1);
}

/* On the connection's strand: a read, and for some writes, in flight. */
static void start_ops(sconn *s, weft_tcp *c) {
  s->c = c;
  s->rbuf = malloc(RBUF);
  TU_CHECK(s->rbuf != NULL);
  TU_CHECK_RC(weft_tcp_read(c, s->rbuf, RBUF, read_cb, s), 0);
  for (unsigned k = 0; s->writes && k < NW; k++)
    TU_CHECK_RC(weft_tcp_write(c, s->wbuf + k * WCHUNK, WCHUNK, write_cb, s),
                0);
}

static void accept_cb(void *arg, weft_tcp *c) {
  (void)arg;
  TU_CHECK(on_strand_of(c));
  unsigned i = atomic_fetch_add(&g_nacc, 1);
  TU_CHECKF(i < NCONN, "more connections accepted than made");
  if (i >= NCONN) {
    weft_tcp_close(c, 1, NULL, NULL);
    return;
  }
  sconn *s = &g_acc[i];
  s->writes = i < NPLAIN && i % 5 == 0; /* not on the weft client's peer */
  s->user_close = i % 7 == 3;
  s->wbuf = s->writes ? malloc(NW * WCHUNK) : NULL;
  struct sockaddr_storage a;
  unsigned alen = sizeof a;
  TU_CHECK_RC(weft_tcp_peer_addr(c, (struct sockaddr *)&a, &alen), 0);
  s->peer_port = tu_addr_port((struct sockaddr *)&a);
  start_ops(s, c);
  tu_event_add(&g_ev, 1);
}

static void connect_cb(void *arg, weft_tcp *c, int status) {
  sconn *s = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(atomic_load(&s->close_cbs) == 0);
  atomic_store(&s->connect_res, status);
  atomic_fetch_add(&s->connect_cbs, 1);
  if (s == &g_cli) {
    TU_CHECK_RC(status, 0);
    struct sockaddr_storage a;
    unsigned alen = sizeof a;
    TU_CHECK_RC(weft_tcp_local_addr(c, (struct sockaddr *)&a, &alen), 0);
    s->local_port = tu_addr_port((struct sockaddr *)&a);
    start_ops(s, c);
    tu_event_add(&g_ev, 1);
  }
}

/* ------------------------------------------------------------------- test */

typedef struct world {
  weft_rt *rt;
  weft_listener *l;
  uint16_t port;
  int fds[NPLAIN];
  tu_full_listener full;
} world;

static void world_open(world *w) {
  memset(g_acc, 0, sizeof g_acc);
  memset(&g_cli, 0, sizeof g_cli);
  memset(&g_pending, 0, sizeof g_pending);
  atomic_store(&g_nacc, 0);
  tu_event_init(&g_ev);
  tu_rt_create(&w->rt, NWORKERS, 0);
  tu_assert_backend(w->rt);
  w->port = tu_tcp_listen(w->rt, NULL, accept_cb, NULL, &w->l);
  if (tu_shrink_listener_bufs(w->port, SMALL_BUF, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)w->port);
  for (unsigned i = 0; i < NPLAIN; i++) {
    w->fds[i] = tu_sock_connect(w->port, SMALL_BUF, 0);
    assert_true(w->fds[i] >= 0);
  }
  /* the plain clients first: the last one accepted is the weft client's */
  tu_event_wait(&g_ev, NPLAIN, "the plain clients to be accepted");
  struct sockaddr_in a;
  tu_addr_loopback(&a, w->port);
  weft_tcp *out;
  tu_assert_rc(weft_tcp_connect(w->rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                connect_cb, &g_cli, &out),
               0);
  tu_assert_rc(tu_full_listener_open(&w->full), 0);
  tu_addr_loopback(&a, w->full.port);
  tu_assert_rc(weft_tcp_connect(w->rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                connect_cb, &g_pending, &g_pending.c),
               0);
  /* every accept callback, and the weft client's connect callback */
  tu_event_wait(&g_ev, NCONN + 1, "the connections to be set up");
}

/* weft_pair: the two ends of the weft client's connection: the other end
 * may be closed first, so a read may end with EOF or RST instead. */
static void check_conn(const sconn *s, const char *what, unsigned i,
                       bool weft_pair) {
  long r = atomic_load(&s->read_res);
  bool r_ok = r == -ECANCELED || (weft_pair && (r == 0 || r == -ECONNRESET));
  if (atomic_load(&s->read_cbs) != 1 || !r_ok)
    fail_msg("%s %u: %u read callbacks, last with %ld (%s); expected one "
             "with -ECANCELED",
             what, i, atomic_load(&s->read_cbs), r, weft_strerror((int)r));
  unsigned wc = atomic_load(&s->write_cbs);
  int last = atomic_load(&s->wres[NW - 1]);
  if (s->writes &&
      (wc != NW || atomic_load(&s->order_bad) != 0 || last != -ECANCELED))
    fail_msg("%s %u: %u of %u write callbacks, %u out of order, the last "
             "with %d (%s); expected -ECANCELED",
             what, i, wc, NW, atomic_load(&s->order_bad), last,
             weft_strerror(last));
  for (unsigned k = 0; s->writes && k < NW; k++) {
    int st = atomic_load(&s->wres[k]);
    if (st != 0 && st != -ECANCELED)
      fail_msg("%s %u: write %u completed with %d (%s)", what, i, k, st,
               weft_strerror(st));
  }
  if (atomic_load(&s->close_cbs) != (s->user_close ? 1u : 0u))
    fail_msg("%s %u: %u close callbacks, the user closed it %s", what, i,
             atomic_load(&s->close_cbs), s->user_close ? "once" : "never");
}

/* After the shutdown: the descriptors are closed. */
static void check_closed(world *w) {
  for (unsigned i = 0; i < NPLAIN; i++) {
    int rc = tu_sock_wait_closed(w->fds[i], TU_WAIT_S * 1000, NULL);
    if (rc != 0 && rc != -ECONNRESET)
      fail_msg("plain client %u: its connection was not closed by the "
               "shutdown (%s)",
               i, strerror(-rc));
    close(w->fds[i]);
  }
  int fd = tu_sock_connect(w->port, 0, 0);
  if (fd >= 0) {
    close(fd);
    fail_msg("the listener's port still accepts connections after the "
             "shutdown");
  }
  assert_int_equal(fd, -ECONNREFUSED);
}

static void must_not_run(void *arg) {
  (void)arg;
  TU_CHECKF(false, "the done callback of a listener closed by the shutdown");
}

static void must_not_accept(void *arg, weft_tcp *c) {
  (void)arg;
  (void)c;
  TU_CHECKF(false, "accept callback of a refused listener");
}

static void check_refused(world *w) {
  tu_assert_rc(weft_listener_close(w->l, must_not_run, NULL), -EALREADY);
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  weft_listener *l = NULL;
  weft_tcp *c = NULL;
  tu_assert_rc(weft_tcp_listen(w->rt, (struct sockaddr *)&a, sizeof a, NULL,
                               must_not_accept, NULL, &l),
               -ESHUTDOWN);
  tu_addr_loopback(&a, w->port);
  tu_assert_rc(weft_tcp_connect(w->rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                connect_cb, &g_pending, &c),
               -ESHUTDOWN);
}

static void run_shutdown(int mode) {
  tu_reset_async_errors();
  tu_phase(mode == WEFT_SHUTDOWN_DRAIN ? "shutdown DRAIN" : "shutdown CANCEL");
  static world w;
  memset(&w, 0, sizeof w);
  world_open(&w);
  for (unsigned i = 0; i < NCONN; i++)
    if (g_acc[i].user_close)
      tu_assert_rc(weft_tcp_close(g_acc[i].c, i % 2, close_cb, &g_acc[i]), 0);
  tu_assert_rc(weft_rt_shutdown(w.rt, mode), 0);

  for (unsigned i = 0; i < NCONN; i++)
    check_conn(&g_acc[i], "accepted connection", i,
               g_acc[i].peer_port == g_cli.local_port);
  check_conn(&g_cli, "weft client", 0, true);
  assert_int_equal(atomic_load(&g_cli.connect_cbs), 1);
  assert_int_equal(atomic_load(&g_pending.connect_cbs), 1);
  tu_assert_rc(atomic_load(&g_pending.connect_res), -ECANCELED);
  check_closed(&w);
  check_refused(&w);
  TU_ASSERT_NO_ASYNC_ERRORS();

  tu_phase("destroy");
  tu_assert_rc(weft_rt_destroy(w.rt), 0);
  tu_full_listener_close(&w.full);
  for (unsigned i = 0; i < NCONN; i++)
    free(g_acc[i].wbuf);
  tu_event_destroy(&g_ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_shutdown_drain(void **state) {
  (void)state;
  run_shutdown(WEFT_SHUTDOWN_DRAIN);
}

static void test_shutdown_cancel(void **state) {
  (void)state;
  run_shutdown(WEFT_SHUTDOWN_CANCEL);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shutdown_drain),
      cmocka_unit_test(test_shutdown_cancel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
