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
 *   - every connection got its close callback (set with weft_tcp_set_data
 *     in its accept or connect callback) exactly once, whether the user or
 *     the shutdown closed it, the pending connect's included (weft.h: it
 *     "runs exactly once whatever ends the connection"), with the data
 *     given, after its operations' and its connect callbacks;
 *   - the sockets are closed: every plain client sees EOF or RST, and the
 *     listener's port refuses connections;
 *   - weft_listener_close is -EALREADY (done not called), weft_tcp_listen
 *     and weft_tcp_connect are -ESHUTDOWN; weft_rt_destroy returns 0 and
 *     the sanitizers find nothing (a read buffer is freed in its callback).
 * A connection must not be used once its close callback has run, so
 * nothing touches one after the shutdown. Two more cases, with one
 * accepted connection (a read in flight) each:
 *   - weft_tcp_close from the test thread once a NOWAIT shutdown (DRAIN and
 *     CANCEL) has begun, while a handler holds the connection's strand (so
 *     its close callback cannot have run): -ESHUTDOWN; no callback of it
 *     has run yet; once the shutdown is over the read got -ECANCELED and
 *     the close callback came exactly once, and the client sees the
 *     connection closed;
 *   - weft_rt_destroy without weft_rt_shutdown: the same, once it returns.
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
  bool connects; /* weft_tcp_connect: its connect callback comes first */
  bool no_read;  /* never connected: no read was made */
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
  TU_CHECK(weft_tcp_data(c) == s);
  TU_CHECKF(atomic_load(&s->read_cbs) == (s->no_read ? 0u : 1u) &&
                atomic_load(&s->write_cbs) == (s->writes ? NW : 0) &&
                atomic_load(&s->connect_cbs) == (s->connects ? 1u : 0u),
            "close callback before the operations' callbacks (%u read, %u "
            "write, %u connect)",
            atomic_load(&s->read_cbs), atomic_load(&s->write_cbs),
            atomic_load(&s->connect_cbs));
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
    weft_tcp_close(c, 1);
    return;
  }
  sconn *s = &g_acc[i];
  TU_CHECK_RC(weft_tcp_set_data(c, s, close_cb), 0);
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
  /* the pending connect too: it fails at the shutdown, then closes itself
   * and its close callback comes */
  TU_CHECK_RC(weft_tcp_set_data(c, s, close_cb), 0);
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
  g_cli.connects = g_pending.connects = true;
  g_pending.no_read = true;
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
  /* weft.h: exactly once, whatever closed it (before, a connection that
   * the shutdown closed got none) */
  if (atomic_load(&s->close_cbs) != 1)
    fail_msg("%s %u: %u close callbacks, expected one (closed by %s)", what, i,
             atomic_load(&s->close_cbs),
             s->user_close ? "the user" : "the shutdown");
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
  /* from the test thread: their close callback was set in the accept
   * callback */
  for (unsigned i = 0; i < NCONN; i++)
    if (g_acc[i].user_close)
      tu_assert_rc(weft_tcp_close(g_acc[i].c, i % 2), 0);
  tu_assert_rc(weft_rt_shutdown(w.rt, mode), 0);

  for (unsigned i = 0; i < NCONN; i++)
    check_conn(&g_acc[i], "accepted connection", i,
               g_acc[i].peer_port == g_cli.local_port);
  check_conn(&g_cli, "weft client", 0, true);
  assert_int_equal(atomic_load(&g_cli.connect_cbs), 1);
  assert_int_equal(atomic_load(&g_pending.connect_cbs), 1);
  tu_assert_rc(atomic_load(&g_pending.connect_res), -ECANCELED);
  /* a failed connect closes itself: its close callback still comes */
  assert_int_equal(atomic_load(&g_pending.read_cbs), 0);
  assert_int_equal(atomic_load(&g_pending.close_cbs), 1);
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

/* ------------------------------------ one connection, closed from outside */

static void accept_one(void *arg, weft_tcp *c) {
  sconn *s = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECKF(s->c == NULL, "a second connection was accepted");
  if (s->c != NULL) {
    weft_tcp_close(c, 1);
    return;
  }
  TU_CHECK_RC(weft_tcp_set_data(c, s, close_cb), 0);
  start_ops(s, c); /* a read in flight */
  tu_event_add(&g_ev, 1);
}

/* A runtime with one connection accepted from a plain client (*fd) into
 * s, its read in flight. */
static weft_rt *one_open(sconn *s, int *fd) {
  memset(s, 0, sizeof *s);
  tu_event_init(&g_ev);
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_one, s, &l);
  *fd = tu_sock_connect(port, 0, 0);
  assert_true(*fd >= 0);
  tu_event_wait(&g_ev, 1, "the accept callback");
  return rt;
}

/* After the runtime closed s: its read got -ECANCELED, then exactly one
 * close callback came; the client sees EOF or RST. */
static void one_check(sconn *s, int fd, const char *what) {
  check_conn(s, what, 0, false);
  int rc = tu_sock_wait_closed(fd, TU_WAIT_S * 1000, NULL);
  if (rc != 0 && rc != -ECONNRESET)
    fail_msg("%s: the client's connection was not closed (%s)", what,
             strerror(-rc));
  close(fd);
  tu_event_destroy(&g_ev);
}

static void run_close_after_shutdown(int mode) {
  tu_reset_async_errors();
  tu_phase(mode == WEFT_SHUTDOWN_DRAIN ? "close after a DRAIN shutdown began"
                                       : "close after a CANCEL shutdown began");
  static sconn s;
  int fd;
  weft_rt *rt = one_open(&s, &fd);
  /* A handler holds the connection's strand: none of its callbacks, the
   * close callback included, can run until the gate opens, so s.c stays
   * valid. */
  tu_gate g;
  tu_gate_init(&g);
  tu_assert_rc(weft_post(weft_tcp_strand(s.c), tu_gate_handler, &g), 0);
  tu_wait_count(&g.entered, 1, "the gate handler to start");
  tu_assert_rc(weft_rt_shutdown(rt, mode | WEFT_SHUTDOWN_NOWAIT), 0);
  /* weft.h: from outside the runtime once its shutdown has begun:
   * -ESHUTDOWN, "the shutdown closes c, and the close callback still
   * comes" */
  tu_assert_rc(weft_tcp_close(s.c, 0), -ESHUTDOWN);
  assert_int_equal(atomic_load(&s.read_cbs), 0);
  assert_int_equal(atomic_load(&s.close_cbs), 0);
  tu_gate_open(&g);
  tu_assert_rc(weft_rt_wait(rt, (uint64_t)TU_WAIT_S * 1000000000u), 0);
  one_check(&s, fd, "connection closed from outside during the shutdown");
  TU_ASSERT_NO_ASYNC_ERRORS();
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_close_after_shutdown_drain(void **state) {
  (void)state;
  run_close_after_shutdown(WEFT_SHUTDOWN_DRAIN);
}

static void test_close_after_shutdown_cancel(void **state) {
  (void)state;
  run_close_after_shutdown(WEFT_SHUTDOWN_CANCEL);
}

/* weft_rt_destroy without weft_rt_shutdown closes the connection too, and
 * its close callback comes before weft_rt_destroy returns. */
static void test_destroy_closes(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("destroy without shutdown");
  static sconn s;
  int fd;
  weft_rt *rt = one_open(&s, &fd);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  one_check(&s, fd, "connection open at weft_rt_destroy");
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shutdown_drain),
      cmocka_unit_test(test_shutdown_cancel),
      cmocka_unit_test(test_close_after_shutdown_drain),
      cmocka_unit_test(test_close_after_shutdown_cancel),
      cmocka_unit_test(test_destroy_closes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
