/*
 * test_tcp_bad_input: every documented error of the TCP section of weft.h,
 * and the backend selection.
 *
 *  - Backends: cfg.backend NONE gives a runtime without sockets whose
 *    weft_tcp_listen / _connect return -ENOTSUP; EPOLL and URING force
 *    their backend (URING may instead fail to create where io_uring is
 *    refused); a forced backend is not overridden by WEFT_BACKEND; unknown
 *    values of cfg.backend and of WEFT_BACKEND are -EINVAL.
 *  - listen: NULL arguments, addrlen too small for the family, unknown
 *    flags (-EINVAL); a family neither IPv4, IPv6 nor Unix (-EAFNOSUPPORT); a
 *    port held by a plain listening socket
 *    (-EADDRINUSE); listener_close of NULL (-EINVAL) and twice (-EALREADY,
 *    done runs once).
 *  - connect: NULL arguments and addrlen too small (-EINVAL), a foreign
 *    family (-EAFNOSUPPORT), a strand of another runtime (-EXDEV); nothing
 *    is created (tcp_live stays 0). A closed port: -ECONNREFUSED, and in
 *    that connect callback read / write / shutdown fail with -ENOTCONN. A
 *    connect that cannot complete (a plain listener with a full backlog):
 *    -ETIMEDOUT after its 50 ms timeout; with no timeout, operations fail
 *    with -ENOTCONN while it is pending and a close ends it with
 *    -ECANCELED before the close callback. The close callback is set in
 *    the connect callback (for the pending one, on its strand before the
 *    close); weft_tcp_data gives NULL before. A failed connect closes
 *    itself once its callback returns: the close callback comes exactly
 *    once, unasked; a weft_tcp_close inside a failed connect callback
 *    returns 0 (-EALREADY when the user had closed it already), read then
 *    fails with -EBADF, and the close callback still comes once.
 *    Inside every close callback weft_tcp_close returns -EALREADY.
 *  - A connected pair: read with NULL buffer or fn or len 0 (-EINVAL), a
 *    second read (-EBUSY); write with NULL buffer, writev with bad iovecs
 *    (-EINVAL); bad watermarks and keepalive idle times (-EINVAL); every
 *    strand-only call from the test thread and from another strand
 *    (-EPERM); a zero-length write completes with 0 in order; writes after
 *    weft_tcp_shutdown (-EPIPE), shutdown twice (-EALREADY); close twice
 *    (-EALREADY); in a callback after the close, read / write / shutdown
 *    fail with -EBADF; weft_tcp_close(NULL) and weft_tcp_set_data(NULL)
 *    are -EINVAL, weft_tcp_set_data off the strand -EPERM; the close
 *    callbacks (set in the accept and connect callbacks) get their data.
 *  - After weft_rt_shutdown: listen and connect fail with -ESHUTDOWN.
 *  - Races: two weft_listener_close at once, or one against the
 *    shutdown: each close returns 0 and its done runs once, or returns
 *    -EALREADY and its done never runs; of two closes exactly one wins.
 */
#include "testutil.h"

#define NWORKERS 2

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void must_not_accept(void *arg, weft_tcp *c) {
  (void)arg;
  TU_CHECKF(false, "unexpected accept callback");
  weft_tcp_close(c, 1);
}

static void must_not_connect(void *arg, weft_tcp *c, int status) {
  (void)arg;
  (void)c;
  TU_CHECKF(false, "connect callback of a refused connect (%d)", status);
}

static void count_event(void *arg) { tu_event_add(arg, 1); }

static void must_not_run(void *arg) {
  (void)arg;
  TU_CHECKF(false, "a done callback that must not run ran");
}

static void assert_tcp_live(weft_rt *rt, uint64_t want) {
  weft_stats st;
  tu_stats(rt, &st);
  if (st.tcp_live != want)
    fail_msg("stats.tcp_live is %" PRIu64 ", expected %" PRIu64, st.tcp_live,
             want);
}

static void rt_destroy(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

/* --------------------------------------------------------------- backends */

static int create_with(weft_rt **rt, int backend) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = NWORKERS;
  cfg.backend = backend;
  *rt = NULL;
  return weft_rt_create(rt, &cfg);
}

static void test_backend_none(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_config cfg;
  memset(&cfg, 0xff, sizeof cfg);
  weft_config_init(&cfg);
  assert_int_equal(cfg.backend, WEFT_BACKEND_AUTO);
  weft_rt *rt;
  tu_assert_rc(create_with(&rt, WEFT_BACKEND_NONE), 0);
  assert_int_equal(weft_rt_backend(rt), WEFT_BACKEND_NONE);
  assert_string_equal(weft_rt_backend_name(rt), "none");
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  weft_listener *l = NULL;
  weft_tcp *c = NULL;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL,
                               must_not_accept, NULL, &l),
               -ENOTSUP);
  tu_addr_loopback(&a, 9);
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                must_not_connect, NULL, &c),
               -ENOTSUP);
  assert_tcp_live(rt, 0);
  /* the runtime still runs handlers */
  tu_event ev;
  tu_event_init(&ev);
  tu_assert_rc(weft_post_rt(rt, count_event, &ev), 0);
  tu_event_wait(&ev, 1, "a handler on a runtime without sockets");
  tu_event_destroy(&ev);
  rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_backend_forced(void **state) {
  (void)state;
  weft_rt *rt;
  /* forced: WEFT_BACKEND (set for this run or not) does not override it */
  tu_assert_rc(create_with(&rt, WEFT_BACKEND_EPOLL), 0);
  assert_int_equal(weft_rt_backend(rt), WEFT_BACKEND_EPOLL);
  assert_string_equal(weft_rt_backend_name(rt), "epoll");
  rt_destroy(rt);
  int rc = create_with(&rt, WEFT_BACKEND_URING);
  if (rc == 0) {
    assert_int_equal(weft_rt_backend(rt), WEFT_BACKEND_URING);
    assert_string_equal(weft_rt_backend_name(rt), "uring");
    rt_destroy(rt);
  } else {
    assert_true(rc < 0);
    print_message("[ INFO     ] io_uring refused here: cfg.backend URING "
                  "fails with %d (%s)\n",
                  rc, weft_strerror(rc));
  }
  /* AUTO: whatever WEFT_BACKEND names, never AUTO */
  tu_assert_rc(create_with(&rt, WEFT_BACKEND_AUTO), 0);
  tu_assert_backend(rt);
  assert_true(weft_rt_backend(rt) != WEFT_BACKEND_AUTO);
  rt_destroy(rt);
  /* weft.h: "a bad WEFT_BACKEND" is -EINVAL */
  const char *env = getenv("WEFT_BACKEND");
  char *saved = env ? strdup(env) : NULL;
  assert_int_equal(setenv("WEFT_BACKEND", "bogus", 1), 0);
  rc = create_with(&rt, WEFT_BACKEND_AUTO);
  if (saved)
    setenv("WEFT_BACKEND", saved, 1);
  else
    unsetenv("WEFT_BACKEND");
  free(saved);
  if (rc != -EINVAL)
    fail_msg("WEFT_BACKEND=bogus: weft_rt_create returned %d (%s), expected "
             "-EINVAL",
             rc, weft_strerror(rc));
  static const int bad[] = {4, 5, -1, 1000};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rc = create_with(&rt, bad[i]);
    if (rc != -EINVAL)
      fail_msg("cfg.backend %d: weft_rt_create returned %d (%s), expected "
               "-EINVAL",
               bad[i], rc, weft_strerror(rc));
  }
}

/* ----------------------------------------------------------------- listen */

static weft_rt *rt_start(void) {
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  return rt;
}

/* A failed case is reported and counted; the test goes on with the others
 * and fails at its end (one wrong code should not hide the rest). */
static void listen_expect(weft_rt *rt, const void *addr, unsigned len,
                          const weft_listen_opts *opts, int want,
                          const char *what) {
  weft_listener *l = NULL;
  int rc = weft_tcp_listen(rt, addr, len, opts, must_not_accept, NULL, &l);
  if (rc != want)
    TU_CHECKF(false, "weft_tcp_listen (%s) returned %d (%s), expected %d (%s)",
              what, rc, weft_strerror(rc), want, weft_strerror(want));
}

static void test_listen_bad(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_start();
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  weft_listener *l = NULL;
  tu_assert_rc(weft_tcp_listen(NULL, (struct sockaddr *)&a, sizeof a, NULL,
                               must_not_accept, NULL, &l),
               -EINVAL);
  tu_assert_rc(
      weft_tcp_listen(rt, NULL, sizeof a, NULL, must_not_accept, NULL, &l),
      -EINVAL);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL, NULL,
                               NULL, &l),
               -EINVAL);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL,
                               must_not_accept, NULL, NULL),
               -EINVAL);
  listen_expect(rt, &a, sizeof a - 1, NULL, -EINVAL, "addrlen too small");
  listen_expect(rt, &a, 0, NULL, -EINVAL, "addrlen 0");
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
  a6.sin6_addr = in6addr_loopback;
  listen_expect(rt, &a6, sizeof a, NULL, -EINVAL, "IPv6, IPv4 addrlen");
  struct sockaddr_storage pk = {.ss_family = AF_PACKET};
  listen_expect(rt, &pk, sizeof pk, NULL, -EAFNOSUPPORT, "AF_PACKET");
  weft_listen_opts opts = {.backlog = 0, .flags = 4};
  listen_expect(rt, &a, sizeof a, &opts, -EINVAL, "flags 4");
  opts.flags = 0x80000000u;
  listen_expect(rt, &a, sizeof a, &opts, -EINVAL, "flags high bit");

  /* a port held by a plain listening socket (no SO_REUSEPORT) */
  uint16_t port;
  int fd = tu_sock_listen(4, &port);
  assert_true(fd >= 0);
  tu_addr_loopback(&a, port);
  listen_expect(rt, &a, sizeof a, NULL, -EADDRINUSE, "port in use");
  opts.flags = WEFT_LISTEN_SINGLE;
  listen_expect(rt, &a, sizeof a, &opts, -EADDRINUSE, "port in use, SINGLE");
  close(fd);
  assert_tcp_live(rt, 0);

  /* closing */
  tu_assert_rc(weft_listener_close(NULL, NULL, NULL), -EINVAL);
  uint16_t p = tu_tcp_listen(rt, NULL, must_not_accept, NULL, &l);
  assert_true(p != 0);
  tu_event done;
  tu_event_init(&done);
  tu_assert_rc(weft_listener_close(l, count_event, &done), 0);
  /* at once, before its done can have run (weft.h: -EALREADY) */
  tu_assert_rc(weft_listener_close(l, count_event, &done), -EALREADY);
  tu_event_wait(&done, 1, "the listener's done callback");
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "the listener to be freed");
  rt_destroy(rt);
  assert_int_equal(tu_event_get(&done), 1);
  tu_event_destroy(&done);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------------------------------- connect */

static void connect_expect(weft_rt *rt, weft_strand *s, const void *addr,
                           unsigned len, int want, const char *what) {
  weft_tcp *c = NULL;
  int rc = weft_tcp_connect(rt, s, addr, len, 0, must_not_connect, NULL, &c);
  if (rc != want)
    TU_CHECKF(false, "weft_tcp_connect (%s) returned %d (%s), expected %d (%s)",
              what, rc, weft_strerror(rc), want, weft_strerror(want));
}

static void test_connect_bad(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_start();
  struct sockaddr_in a;
  tu_addr_loopback(&a, 9);
  weft_tcp *c = NULL;
  tu_assert_rc(weft_tcp_connect(NULL, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                must_not_connect, NULL, &c),
               -EINVAL);
  tu_assert_rc(
      weft_tcp_connect(rt, NULL, NULL, sizeof a, 0, must_not_connect, NULL, &c),
      -EINVAL);
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                NULL, NULL, &c),
               -EINVAL);
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                must_not_connect, NULL, NULL),
               -EINVAL);
  connect_expect(rt, NULL, &a, sizeof a - 1, -EINVAL, "addrlen too small");
  connect_expect(rt, NULL, &a, 0, -EINVAL, "addrlen 0");
  struct sockaddr_storage pk = {.ss_family = AF_PACKET};
  connect_expect(rt, NULL, &pk, sizeof pk, -EAFNOSUPPORT, "AF_PACKET");
  weft_rt *other = rt_start();
  weft_strand *s;
  tu_strand_create(other, &s);
  connect_expect(rt, s, &a, sizeof a, -EXDEV, "strand of another runtime");
  weft_strand_release(s);
  rt_destroy(other);
  assert_tcp_live(rt, 0); /* nothing was created */
  rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* What a failed connect callback does besides recording (cres.flags). */
#define CR_OPS 1u   /* checks that read, write, shutdown are -ENOTCONN */
#define CR_CLOSE 2u /* calls weft_tcp_close (cres.close_rc) */

/* A connection whose connect callback has run (or not yet). */
typedef struct cres {
  tu_event ev; /* +1 at the connect callback, +1 at the close callback */
  unsigned flags;
  int status;
  unsigned connect_cbs, close_cbs;
  int close_rc;    /* CR_CLOSE: weft_tcp_close in the connect callback */
  int close_again; /* weft_tcp_close in the close callback */
  weft_tcp *c;     /* from the connect callback */
  weft_tcp *out;   /* from weft_tcp_connect */
} cres;

static void on_close(void *arg, weft_tcp *c);
static void ops_not_connected(void *arg);

static void not_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  (void)c;
  TU_CHECKF(false, "read callback of a refused read (%ld)", n);
}

static void on_connect(void *arg, weft_tcp *c, int status) {
  cres *r = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(r->close_cbs == 0);
  /* NULL before weft_tcp_set_data; r if set on the strand already */
  void *d = weft_tcp_data(c);
  TU_CHECKF(d == NULL || d == r, "weft_tcp_data is %p before it was set", d);
  TU_CHECK_RC(weft_tcp_set_data(c, r, on_close), 0);
  TU_CHECK(weft_tcp_data(c) == r);
  r->c = c;
  r->status = status;
  r->connect_cbs++;
  if (status != 0 && (r->flags & CR_OPS))
    ops_not_connected(c);
  if (status != 0 && (r->flags & CR_CLOSE)) {
    static char buf[8];
    r->close_rc = weft_tcp_close(c, 0);
    TU_CHECK_RC(weft_tcp_read(c, buf, sizeof buf, not_read, NULL), -EBADF);
  }
  tu_event_add(&r->ev, 1);
}

/* The connection is still valid here: a close is under way, so
 * weft_tcp_close is -EALREADY. */
static void on_close(void *arg, weft_tcp *c) {
  cres *r = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(weft_tcp_data(c) == r);
  TU_CHECKF(r->connect_cbs == 1, "close callback after %u connect callbacks",
            r->connect_cbs);
  r->close_again = weft_tcp_close(c, 0);
  r->close_cbs++;
  tu_event_add(&r->ev, 1);
}

static void not_written(void *arg, weft_tcp *c, int status) {
  (void)arg;
  (void)c;
  TU_CHECKF(false, "write callback of a refused write (%d)", status);
}

/* On the strand of a connection that is not connected. */
static void ops_not_connected(void *arg) {
  weft_tcp *c = arg;
  static char buf[16];
  struct iovec iov = {buf, sizeof buf};
  TU_CHECK_RC(weft_tcp_read(c, buf, sizeof buf, not_read, NULL), -ENOTCONN);
  TU_CHECK_RC(weft_tcp_write(c, buf, sizeof buf, not_written, NULL), -ENOTCONN);
  TU_CHECK_RC(weft_tcp_writev(c, &iov, 1, not_written, NULL), -ENOTCONN);
  TU_CHECK_RC(weft_tcp_shutdown(c), -ENOTCONN);
}

/* On the strand of a pending connect: no data yet, then the close
 * callback, before anything closes it; operations are -ENOTCONN. */
static void pending_setup(void *arg) {
  cres *r = arg;
  TU_CHECK(weft_tcp_data(r->out) == NULL);
  TU_CHECK_RC(weft_tcp_set_data(r->out, r, on_close), 0);
  ops_not_connected(r->out);
}

static void connect_to(weft_rt *rt, uint16_t port, uint64_t timeout_ns, cres *r,
                       unsigned flags, weft_tcp **out) {
  struct sockaddr_in a;
  tu_addr_loopback(&a, port);
  memset(r, 0, sizeof *r);
  r->flags = flags;
  r->close_rc = r->close_again = 1;
  tu_event_init(&r->ev);
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a,
                                timeout_ns, on_connect, r, out),
               0);
}

/* After a failed connect: one connect callback (status want), then, the
 * connection having closed itself (or been closed in the callback: CR_CLOSE,
 * which returned close_want), one close callback, in which weft_tcp_close
 * was -EALREADY. The connection is not used again: it may be freed. */
static void expect_failed(cres *r, weft_tcp *out, int want, int close_want) {
  tu_event_wait(&r->ev, 2, "the connect and close callbacks");
  tu_assert_rc(r->status, want);
  assert_ptr_equal(r->c, out);
  assert_int_equal(r->connect_cbs, 1);
  assert_int_equal(r->close_cbs, 1);
  if (r->flags & CR_CLOSE)
    tu_assert_rc(r->close_rc, close_want);
  tu_assert_rc(r->close_again, -EALREADY);
  tu_event_destroy(&r->ev);
}

static void test_connect_refused(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_start();
  /* a port bound by a plain socket that does not listen: RST */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cres r;
  weft_tcp *out = NULL;
  /* closes itself: the close callback comes unasked */
  connect_to(rt, tu_sock_port(fd), 0, &r, CR_OPS, &out);
  expect_failed(&r, out, -ECONNREFUSED, 0);
  /* closed in the failed connect callback: 0, one close callback */
  connect_to(rt, tu_sock_port(fd), 0, &r, CR_CLOSE, &out);
  expect_failed(&r, out, -ECONNREFUSED, 0);
  close(fd);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "the connections to be freed");
  rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_connect_timeout(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_start();
  tu_full_listener f;
  tu_assert_rc(tu_full_listener_open(&f), 0);

  /* 50 ms: -ETIMEDOUT, not before the timeout; the connection closes
   * itself, or is closed in the connect callback */
  for (unsigned flags = CR_OPS; flags <= CR_CLOSE; flags++) {
    cres r;
    weft_tcp *out = NULL;
    uint64_t t0 = tu_now_ns();
    connect_to(rt, f.port, 50000000u, &r, flags, &out);
    tu_event_wait(&r.ev, 1, "the connect callback (50 ms timeout)");
    uint64_t took = tu_now_ns() - t0;
    if (took < 50000000u)
      fail_msg("the connect timed out after %" PRIu64 " ns, before its 50 ms",
               took);
    expect_failed(&r, out, -ETIMEDOUT, 0);
  }

  /* no timeout: pending; operations fail; a close from the test thread
   * ends it (its close callback set on the strand first); closed before,
   * a close in the connect callback is -EALREADY */
  cres r;
  weft_tcp *out = NULL;
  connect_to(rt, f.port, 0, &r, CR_CLOSE, &out);
  r.out = out;
  tu_on_strand(weft_tcp_strand(out), pending_setup, &r);
  assert_int_equal(tu_event_get(&r.ev), 0);
  tu_assert_rc(weft_tcp_close(out, 0), 0);
  expect_failed(&r, out, -ECANCELED, -EALREADY);

  tu_full_listener_close(&f);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "the connections to be freed");
  rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* --------------------------------------------------------- connected pair */

typedef struct pair {
  weft_rt *rt;
  weft_listener *l;
  weft_tcp *cli, *srv;
  cres cr; /* the client's connect and close */
  cres sr; /* the server side's close */
  _Atomic(weft_tcp *) acc;
  tu_event acc_ev;
  /* the server side reads what the client sends, until EOF */
  char got[64];
  size_t ngot;
  long last;
  tu_event srv_eof;
  /* write callbacks of the client, in order */
  struct wtag {
    struct pair *p;
    int idx;
  } wt[3];
  int nw;
  tu_event wdone;
  /* the server's read in the close phase */
  unsigned late_read_cbs;
} pair;

static void pair_accept(void *arg, weft_tcp *c) {
  pair *p = arg;
  TU_CHECK(on_strand_of(c));
  weft_tcp *none = NULL;
  TU_CHECK(atomic_compare_exchange_strong(&p->acc, &none, c));
  TU_CHECK(weft_tcp_data(c) == NULL);
  TU_CHECK_RC(weft_tcp_set_data(c, &p->sr, on_close), 0);
  tu_event_add(&p->acc_ev, 1);
}

static void pair_open(pair *p) {
  memset(p, 0, sizeof *p);
  p->rt = rt_start();
  tu_event_init(&p->acc_ev);
  tu_event_init(&p->srv_eof);
  tu_event_init(&p->wdone);
  tu_event_init(&p->sr.ev);
  uint16_t port = tu_tcp_listen(p->rt, NULL, pair_accept, p, &p->l);
  connect_to(p->rt, port, 0, &p->cr, 0, &p->cli);
  tu_event_wait(&p->cr.ev, 1, "the connect callback");
  tu_assert_rc(p->cr.status, 0);
  tu_event_wait(&p->acc_ev, 1, "the accept callback");
  p->srv = atomic_load(&p->acc);
  p->sr.connect_cbs = 1; /* accepted: for on_close's check */
}

static void pair_finish(pair *p) {
  tu_event done;
  tu_event_init(&done);
  tu_assert_rc(weft_listener_close(p->l, count_event, &done), 0);
  tu_event_wait(&done, 1, "the listener's done callback");
  tu_stat_wait w = {p->rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  rt_destroy(p->rt);
  tu_event_destroy(&done);
  tu_event_destroy(&p->acc_ev);
  tu_event_destroy(&p->srv_eof);
  tu_event_destroy(&p->wdone);
  tu_event_destroy(&p->cr.ev);
  tu_event_destroy(&p->sr.ev);
}

static void drain_cb(void *arg, weft_tcp *c) {
  (void)arg;
  (void)c;
}

/* Reads a socket option of the weft socket of c (found by its ports). */
typedef struct sockopt_q {
  int level, name, value, found;
} sockopt_q;

static void sockopt_get(int fd, void *ctx) {
  sockopt_q *q = ctx;
  socklen_t len = sizeof q->value;
  if (getsockopt(fd, q->level, q->name, &q->value, &len) == 0)
    q->found++;
}

static int weft_sockopt(weft_tcp *c, int level, int name) {
  struct sockaddr_storage la, pa;
  unsigned ll = sizeof la, pl = sizeof pa;
  TU_CHECK_RC(weft_tcp_local_addr(c, (struct sockaddr *)&la, &ll), 0);
  TU_CHECK_RC(weft_tcp_peer_addr(c, (struct sockaddr *)&pa, &pl), 0);
  sockopt_q q = {level, name, -1, 0};
  tu_for_tcp_fds(tu_addr_port((struct sockaddr *)&la),
                 tu_addr_port((struct sockaddr *)&pa), sockopt_get, &q);
  TU_CHECKF(q.found == 1, "found %d sockets for a connection", q.found);
  return q.value;
}

/* On the client's strand: -EINVAL for each bad argument; options work. */
static void ops_einval(void *arg) {
  weft_tcp *c = arg;
  static char buf[64];
  static struct iovec many[1025];
  struct iovec iov[1] = {{buf, 1}};
  for (unsigned i = 0; i < 1025; i++)
    many[i] = (struct iovec){buf, 1};
  TU_CHECK_RC(weft_tcp_read(c, NULL, 1, not_read, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_read(c, buf, 1, NULL, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_read(c, buf, 0, not_read, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_write(c, NULL, 1, not_written, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_writev(c, NULL, 1, not_written, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_writev(c, iov, 0, not_written, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_writev(c, iov, -1, not_written, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_writev(c, many, 1025, not_written, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_set_watermarks(c, 10, 5, drain_cb, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_set_watermarks(c, 0, 0, drain_cb, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_set_watermarks(c, 64 << 10, 1 << 20, drain_cb, NULL), 0);
  TU_CHECK_RC(weft_tcp_keepalive(c, 1, 0), -EINVAL);
  TU_CHECK_RC(weft_tcp_keepalive(c, 1, 32768), -EINVAL);
  TU_CHECK_RC(weft_tcp_keepalive(c, 1, 77), 0);
  TU_CHECK(weft_sockopt(c, SOL_SOCKET, SO_KEEPALIVE) == 1);
  TU_CHECK(weft_sockopt(c, IPPROTO_TCP, TCP_KEEPIDLE) == 77);
  TU_CHECK_RC(weft_tcp_keepalive(c, 0, 77), 0);
  TU_CHECK(weft_sockopt(c, SOL_SOCKET, SO_KEEPALIVE) == 0);
  TU_CHECK_RC(weft_tcp_nodelay(c, 1), 0);
  TU_CHECK(weft_sockopt(c, IPPROTO_TCP, TCP_NODELAY) == 1);
  TU_CHECK_RC(weft_tcp_nodelay(c, 0), 0);
  TU_CHECK(weft_sockopt(c, IPPROTO_TCP, TCP_NODELAY) == 0);
  TU_CHECK_RC(weft_tcp_nodelay(NULL, 1), -EINVAL);
}

/* Off the connection's strand: every strand-only call is -EPERM. */
static void ops_eperm(void *arg) {
  weft_tcp *c = arg;
  static char buf[64];
  struct iovec iov[1] = {{buf, 1}};
  TU_CHECK_RC(weft_tcp_read(c, buf, sizeof buf, not_read, NULL), -EPERM);
  TU_CHECK_RC(weft_tcp_write(c, buf, 1, not_written, NULL), -EPERM);
  TU_CHECK_RC(weft_tcp_writev(c, iov, 1, not_written, NULL), -EPERM);
  TU_CHECK_RC(weft_tcp_shutdown(c), -EPERM);
  TU_CHECK_RC(weft_tcp_set_watermarks(c, 1, 2, drain_cb, NULL), -EPERM);
  TU_CHECK_RC(weft_tcp_nodelay(c, 1), -EPERM);
  TU_CHECK_RC(weft_tcp_keepalive(c, 1, 10), -EPERM);
  TU_CHECK_RC(weft_tcp_set_data(c, NULL, NULL), -EPERM);
}

/* The server side reads until EOF. */
static void srv_read(pair *p);

static void srv_got(void *arg, weft_tcp *c, long n) {
  pair *p = arg;
  TU_CHECK(on_strand_of(c) && c == p->srv);
  p->last = n;
  if (n <= 0) {
    tu_event_add(&p->srv_eof, 1);
    return;
  }
  p->ngot += (size_t)n;
  srv_read(p);
}

static void srv_read(pair *p) {
  TU_CHECK_RC(weft_tcp_read(p->srv, p->got + p->ngot, sizeof p->got - p->ngot,
                            srv_got, p),
              0);
}

/* On the server's strand: a read in flight, and a second one refused. */
static void srv_read_twice(void *arg) {
  pair *p = arg;
  srv_read(p);
  TU_CHECK_RC(weft_tcp_read(p->srv, p->got, sizeof p->got, not_read, NULL),
              -EBUSY);
}

static void cli_written(void *arg, weft_tcp *c, int status) {
  struct wtag *t = arg;
  pair *p = t->p;
  TU_CHECK(on_strand_of(c) && c == p->cli);
  TU_CHECKF(status == 0, "write %d: %d (%s)", t->idx, status,
            weft_strerror(status));
  TU_CHECKF(t->idx == p->nw, "write %d completed as number %d", t->idx, p->nw);
  p->nw++;
  tu_event_add(&p->wdone, 1);
}

/* On the client's strand: "A", a zero-length write, "B", then shutdown;
 * afterwards writes fail with -EPIPE and a second shutdown -EALREADY. */
static void cli_write_shut(void *arg) {
  pair *p = arg;
  static const char ab[2] = {'A', 'B'};
  for (int i = 0; i < 3; i++)
    p->wt[i] = (struct wtag){p, i};
  TU_CHECK_RC(weft_tcp_write(p->cli, &ab[0], 1, cli_written, &p->wt[0]), 0);
  TU_CHECK_RC(weft_tcp_write(p->cli, &ab[1], 0, cli_written, &p->wt[1]), 0);
  TU_CHECK_RC(weft_tcp_write(p->cli, &ab[1], 1, cli_written, &p->wt[2]), 0);
  TU_CHECK_RC(weft_tcp_shutdown(p->cli), 0);
  struct iovec iov[1] = {{(void *)ab, 1}};
  TU_CHECK_RC(weft_tcp_write(p->cli, ab, 1, not_written, NULL), -EPIPE);
  TU_CHECK_RC(weft_tcp_write(p->cli, ab, 0, not_written, NULL), -EPIPE);
  TU_CHECK_RC(weft_tcp_writev(p->cli, iov, 1, not_written, NULL), -EPIPE);
  TU_CHECK_RC(weft_tcp_shutdown(p->cli), -EALREADY);
}

/* The server's read in the close phase: after the close, calls fail with
 * -EBADF ("closing"). */
static void srv_late_read(void *arg, weft_tcp *c, long n) {
  pair *p = arg;
  static char buf[8];
  TU_CHECK(on_strand_of(c) && c == p->srv);
  TU_CHECK(p->sr.close_cbs == 0);
  TU_CHECKF(n == 0 || n == -ECANCELED, "read after EOF: %ld", n);
  p->late_read_cbs++;
  TU_CHECK_RC(weft_tcp_read(c, buf, sizeof buf, not_read, NULL), -EBADF);
  TU_CHECK_RC(weft_tcp_write(c, buf, 1, not_written, NULL), -EBADF);
  TU_CHECK_RC(weft_tcp_shutdown(c), -EBADF);
}

static void srv_close_twice(void *arg) {
  pair *p = arg;
  static char buf[8];
  TU_CHECK_RC(weft_tcp_read(p->srv, buf, sizeof buf, srv_late_read, p), 0);
  TU_CHECK(weft_tcp_data(p->srv) == &p->sr); /* set in the accept callback */
  TU_CHECK_RC(weft_tcp_close(p->srv, 0), 0);
  TU_CHECK_RC(weft_tcp_close(p->srv, 0), -EALREADY);
  TU_CHECK_RC(weft_tcp_close(p->srv, 1), -EALREADY);
}

static void test_pair_bad(void **state) {
  (void)state;
  tu_reset_async_errors();
  static pair p;
  pair_open(&p);
  tu_assert_rc(weft_tcp_close(NULL, 0), -EINVAL);
  tu_assert_rc(weft_tcp_set_data(NULL, NULL, NULL), -EINVAL);
  tu_on_strand(weft_tcp_strand(p.cli), ops_einval, p.cli);
  ops_eperm(p.cli); /* from the test thread */
  weft_strand *other;
  tu_strand_create(p.rt, &other);
  tu_on_strand(other, ops_eperm, p.cli); /* another strand */
  tu_on_strand(weft_tcp_strand(p.srv), ops_eperm, p.cli);
  weft_strand_release(other);
  TU_ASSERT_NO_ASYNC_ERRORS();

  tu_on_strand(weft_tcp_strand(p.srv), srv_read_twice, &p);
  tu_on_strand(weft_tcp_strand(p.cli), cli_write_shut, &p);
  tu_event_wait(&p.wdone, 3, "the three write callbacks");
  tu_event_wait(&p.srv_eof, 1, "the server to read EOF");
  if (p.last != 0 || p.ngot != 2 || memcmp(p.got, "AB", 2) != 0)
    fail_msg("the server read %zu bytes (\"%.*s\"), then %ld; expected "
             "\"AB\" then EOF",
             p.ngot, (int)p.ngot, p.got, p.last);

  tu_on_strand(weft_tcp_strand(p.srv), srv_close_twice, &p);
  tu_event_wait(&p.sr.ev, 1, "the server side's close callback");
  assert_int_equal(p.late_read_cbs, 1);
  assert_int_equal(p.sr.close_cbs, 1);
  tu_assert_rc(p.sr.close_again, -EALREADY);
  /* from the test thread: its close callback was set in on_connect */
  tu_assert_rc(weft_tcp_close(p.cli, 0), 0);
  tu_event_wait(&p.cr.ev, 2, "the client's close callback");
  assert_int_equal(p.cr.close_cbs, 1);
  tu_assert_rc(p.cr.close_again, -EALREADY);
  pair_finish(&p);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* --------------------------------------------------------------- shutdown */

static void test_after_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_start();
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, must_not_accept, NULL, &l);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  weft_listener *l2 = NULL;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL,
                               must_not_accept, NULL, &l2),
               -ESHUTDOWN);
  tu_addr_loopback(&a, port);
  weft_tcp *c = NULL;
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                must_not_connect, NULL, &c),
               -ESHUTDOWN);
  /* closed by the shutdown: -EALREADY, done is not called */
  tu_assert_rc(weft_listener_close(l, must_not_run, NULL), -EALREADY);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------- close races */

typedef struct closer {
  weft_listener *l;
  weft_rt *rt; /* non-NULL: shut the runtime down instead of closing */
  tu_barrier *b;
  tu_event done;
  int rc;
} closer;

static void *closer_main(void *arg) {
  closer *c = arg;
  tu_barrier_wait(c->b);
  if (c->rt)
    c->rc = weft_rt_shutdown(c->rt, WEFT_SHUTDOWN_NOWAIT);
  else
    c->rc = weft_listener_close(c->l, count_event, &c->done);
  return NULL;
}

/* weft.h: weft_listener_close returns 0 and done runs once, or it returns
 * -EALREADY (closed already, or by a shutdown) and done never runs; this
 * holds when two closes race, and when a close races the shutdown. */
static void test_close_races(void **state) {
  (void)state;
  tu_reset_async_errors();
  unsigned rounds = (unsigned)TU_SCALED(200, 16);
  for (unsigned r = 0; r < rounds; r++) {
    tu_phase("close races: two closes, or a close and the shutdown");
    bool vs_shutdown = r & 1;
    weft_rt *rt = rt_start();
    weft_listener *l;
    assert_true(tu_tcp_listen(rt, NULL, must_not_accept, NULL, &l) != 0);
    tu_barrier b;
    tu_barrier_init(&b, 2);
    closer c[2];
    pthread_t th[2];
    for (unsigned i = 0; i < 2; i++) {
      c[i] = (closer){.l = l, .b = &b, .rc = 1};
      if (vs_shutdown && i == 1)
        c[i].rt = rt;
      tu_event_init(&c[i].done);
      tu_thread_start(&th[i], closer_main, &c[i]);
    }
    for (unsigned i = 0; i < 2; i++)
      tu_thread_join(th[i], "closer");
    if (vs_shutdown)
      tu_assert_rc(weft_rt_wait(rt, (uint64_t)TU_WAIT_S * 1000000000u), 0);
    /* Once destroyed, every done that will run has run: the runtime
     * finishes only after its last socket. */
    tu_assert_rc(weft_rt_destroy(rt), 0);
    unsigned closes = vs_shutdown ? 1 : 2, won = 0;
    for (unsigned i = 0; i < closes; i++) {
      TU_CHECKF(c[i].rc == 0 || c[i].rc == -EALREADY,
                "weft_listener_close returned %d", c[i].rc);
      uint64_t ran = tu_event_get(&c[i].done);
      TU_CHECKF(ran == (c[i].rc == 0 ? 1u : 0u),
                "close returned %d and its done ran %llu times", c[i].rc,
                (unsigned long long)ran);
      won += c[i].rc == 0;
    }
    if (!vs_shutdown)
      TU_CHECKF(won == 1, "%u of two racing closes returned 0", won);
    for (unsigned i = 0; i < 2; i++)
      tu_event_destroy(&c[i].done);
    tu_barrier_destroy(&b);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backend_none),
      cmocka_unit_test(test_backend_forced),
      cmocka_unit_test(test_listen_bad),
      cmocka_unit_test(test_connect_bad),
      cmocka_unit_test(test_connect_refused),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_pair_bad),
      cmocka_unit_test(test_after_shutdown),
      cmocka_unit_test(test_close_races),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
