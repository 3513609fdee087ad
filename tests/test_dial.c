/*
 * test_dial: weft_tcp_dial, connecting by name, and weft_tcp_dial_cancel.
 *
 * getaddrinfo is wrapped at link time (-Wl,--wrap=getaddrinfo) to give
 * chosen address lists: "both.test" is ::1 then 127.0.0.1, "order.test"
 * 127.0.0.3, 127.0.0.4, ::1, "slow.test" 127.0.0.1 then 127.0.0.2,
 * "noname.test" fails with EAI_NONAME, and names under ".hang.test" block
 * until the test opens a gate (then 127.0.0.1).
 *
 *  - Fallback: nobody listens on [::1]:P, a weft listener on 127.0.0.1:P:
 *    the dial connects to 127.0.0.1, fn runs once, on the strand given
 *    (and the connection is on it) or, with none, on the connection's own.
 *  - Order (RFC 8305 interleaving): with listeners on 127.0.0.4:P and
 *    [::1]:P, "order.test" reaches ::1 (second in the interleaved order),
 *    not 127.0.0.4 (third). Skipped where ::1 cannot be bound.
 *  - Per-attempt timeout: 127.0.0.1:P has a full backlog (connects
 *    hang), 127.0.0.2:P listens: with 50 ms per attempt the dial gets
 *    through to 127.0.0.2.
 *  - Failures: every address refused gives conn NULL and -ECONNREFUSED;
 *    an unknown name WEFT_EAI_NONAME; every failed attempt's connection
 *    is freed (tcp_live back to the listener's).
 *  - Cancel while the lookup hangs and while a connect hangs: fn runs once
 *    with -ECANCELED, at once; a second cancel gives -EALREADY.
 *  - Bad input, and a CANCEL shutdown with a dial waiting on its lookup:
 *    fn runs exactly once.
 */
#include "fake_gai.h"

#define NWORKERS 2

/* ------------------------------------------------------- the wrapped call */

int __wrap_getaddrinfo(const char *node, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res) {
  static const char *const both[] = {"::1", "127.0.0.1", NULL};
  static const char *const order[] = {"127.0.0.3", "127.0.0.4", "::1", NULL};
  static const char *const slow[] = {"127.0.0.1", "127.0.0.2", NULL};
  static const char *const lo[] = {"127.0.0.1", NULL};
  if (fg_hang(node))
    return fg_chain(lo, service, hints, res);
  if (node && !strcmp(node, "both.test"))
    return fg_chain(both, service, hints, res);
  if (node && !strcmp(node, "order.test"))
    return fg_chain(order, service, hints, res);
  if (node && !strcmp(node, "slow.test"))
    return fg_chain(slow, service, hints, res);
  if (node && !strcmp(node, "noname.test"))
    return EAI_NONAME;
  return __real_getaddrinfo(node, service, hints, res);
}

/* ---------------------------------------------------------------- results */

typedef struct dres {
  weft_strand *want; /* NULL: the connection's own */
  int status;
  unsigned calls;
  bool on_strand;
  struct sockaddr_storage peer;
  tu_event ev, closed;
} dres;

static void dres_init(dres *r, weft_strand *want) {
  memset(r, 0, sizeof *r);
  r->want = want;
  r->status = 1;
  tu_event_init(&r->ev);
  tu_event_init(&r->closed);
}

static void dres_fini(dres *r) {
  tu_event_destroy(&r->ev);
  tu_event_destroy(&r->closed);
}

static void on_closed(void *data, weft_tcp *c) {
  (void)c;
  tu_event_add(&((dres *)data)->closed, 1);
}

static void on_dial(void *arg, weft_tcp *c, int status) {
  dres *r = arg;
  r->calls++;
  r->status = status;
  weft_strand *cur = weft_strand_current();
  if (status == 0) {
    TU_CHECK(c != NULL);
    r->on_strand = cur != NULL && cur == weft_tcp_strand(c) &&
                   (!r->want || cur == r->want);
    unsigned len = sizeof r->peer;
    TU_CHECK_RC(weft_tcp_peer_addr(c, (struct sockaddr *)&r->peer, &len), 0);
    TU_CHECK_RC(weft_tcp_set_data(c, r, on_closed), 0);
    TU_CHECK_RC(weft_tcp_close(c, 0), 0);
  } else {
    TU_CHECK(c == NULL);
    r->on_strand = cur != NULL && (!r->want || cur == r->want);
  }
  tu_event_add(&r->ev, 1);
}

static weft_rt *rt_make(void) {
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  return rt;
}

static void rt_end(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static void count_accept(void *arg, weft_tcp *c) {
  tu_event_add(arg, 1);
  weft_tcp_close(c, 0);
}

static const char *port_str(char *buf, uint16_t port) {
  snprintf(buf, 8, "%u", port);
  return buf;
}

static void assert_peer4(const struct sockaddr_storage *ss, const char *ip,
                         uint16_t port) {
  const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
  char got[64];
  assert_int_equal(a->sin_family, AF_INET);
  inet_ntop(AF_INET, &a->sin_addr, got, sizeof got);
  assert_string_equal(got, ip);
  assert_int_equal(ntohs(a->sin_port), port);
}

/* A dial to name:port; waits for fn (and for the close of a connection it
 * got). Returns fn's status. */
static int dial_wait(weft_rt *rt, weft_strand *s, const char *name,
                     uint16_t port, uint64_t attempt_ns, dres *r) {
  char ps[8];
  dres_init(r, s);
  weft_dial *d = NULL;
  tu_assert_rc(weft_tcp_dial(rt, s, name, port_str(ps, port), attempt_ns,
                             on_dial, r, &d),
               0);
  assert_non_null(d);
  tu_event_wait(&r->ev, 1, "the dial's callback");
  if (r->status == 0)
    tu_event_wait(&r->closed, 1, "the dialled connection's close");
  assert_int_equal(r->calls, 1);
  assert_true(r->on_strand);
  return r->status;
}

/* ------------------------------------------------------------------ tests */

static void test_fallback(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make();
  tu_event acc;
  tu_event_init(&acc);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, count_accept, &acc, &l);
  dres r;
  tu_assert_rc(dial_wait(rt, NULL, "both.test", port, 0, &r), 0);
  assert_peer4(&r.peer, "127.0.0.1", port);
  dres_fini(&r);
  weft_strand *s;
  tu_strand_create(rt, &s);
  tu_assert_rc(dial_wait(rt, s, "both.test", port, 0, &r), 0);
  assert_peer4(&r.peer, "127.0.0.1", port);
  dres_fini(&r);
  tu_event_wait(&acc, 2, "both accepts");
  tu_listener_close(l);
  weft_strand_release(s);
  rt_end(rt);
  tu_event_destroy(&acc);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A plain listener on ip:port (port 0: any); returns its fd or -errno. */
static int plain_listen(int family, const char *ip, uint16_t *port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  if (family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(*port);
    inet_pton(AF_INET, ip, &a->sin_addr);
    len = sizeof *a;
  } else {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(*port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    len = sizeof *a;
  }
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  len = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &len);
  *port = tu_addr_port((struct sockaddr *)&ss);
  return fd;
}

static void test_order(void **state) {
  (void)state;
  tu_reset_async_errors();
  uint16_t port = 0;
  int l6 = plain_listen(AF_INET6, "::1", &port);
  if (l6 < 0) {
    print_message("no IPv6 loopback (%s): skipped\n", strerror(-l6));
    skip();
  }
  int l4 = plain_listen(AF_INET, "127.0.0.4", &port);
  assert_true(l4 >= 0);
  weft_rt *rt = rt_make();
  dres r;
  tu_assert_rc(dial_wait(rt, NULL, "order.test", port, 0, &r), 0);
  assert_int_equal(r.peer.ss_family, AF_INET6);
  dres_fini(&r);
  rt_end(rt);
  close(l4);
  close(l6);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_attempt_timeout(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_full_listener f;
  tu_assert_rc(tu_full_listener_open(&f), 0);
  uint16_t port = f.port;
  int l2 = plain_listen(AF_INET, "127.0.0.2", &port);
  assert_true(l2 >= 0);
  weft_rt *rt = rt_make();
  dres r;
  tu_assert_rc(dial_wait(rt, NULL, "slow.test", port, 50000000u, &r), 0);
  assert_peer4(&r.peer, "127.0.0.2", port);
  dres_fini(&r);
  rt_end(rt);
  close(l2);
  tu_full_listener_close(&f);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static bool tcp_live_zero(void *ctx, char *buf, size_t len) {
  weft_stats st;
  weft_rt_stats(ctx, &st);
  snprintf(buf, len, "tcp_live %" PRIu64, st.tcp_live);
  return st.tcp_live == 0;
}

static void test_failures(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make();
  /* A port bound on 127.0.0.1 without listening: refused there, and
   * (most likely) nobody on [::1] either. */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  uint16_t port = tu_sock_port(fd);
  dres r;
  tu_assert_rc(dial_wait(rt, NULL, "both.test", port, 0, &r), -ECONNREFUSED);
  dres_fini(&r);
  tu_assert_rc(dial_wait(rt, NULL, "noname.test", port, 0, &r),
               WEFT_EAI_NONAME);
  dres_fini(&r);
  tu_wait_until(tcp_live_zero, rt, "the failed attempts to be freed");
  rt_end(rt);
  close(fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_cancel(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make();
  weft_strand *s;
  tu_strand_create(rt, &s);
  /* While the lookup hangs. */
  dres r;
  dres_init(&r, s);
  weft_dial *d;
  tu_assert_rc(weft_tcp_dial(rt, s, "a.hang.test", "80", 0, on_dial, &r, &d),
               0);
  fg_wait_hung(1);
  tu_assert_rc(weft_tcp_dial_cancel(d), 0);
  tu_event_wait(&r.ev, 1, "the cancelled dial's callback (lookup)");
  tu_assert_rc(r.status, -ECANCELED);
  assert_true(r.on_strand);
  dres_fini(&r);
  fg_gate_open();

  /* While a connect hangs (a full backlog, no attempt timeout). */
  tu_full_listener f;
  tu_assert_rc(tu_full_listener_open(&f), 0);
  char ps[8];
  dres_init(&r, s);
  tu_assert_rc(weft_tcp_dial(rt, s, "127.0.0.1", port_str(ps, f.port), 0,
                             on_dial, &r, &d),
               0);
  weft_stats st;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  do {
    tu_sleep_ms(1);
    tu_stats(rt, &st);
  } while (st.tcp_live == 0 && tu_now_ns() < deadline);
  assert_true(st.tcp_live > 0);
  tu_assert_rc(weft_tcp_dial_cancel(d), 0);
  tu_event_wait(&r.ev, 1, "the cancelled dial's callback (connect)");
  tu_assert_rc(r.status, -ECANCELED);
  assert_int_equal(r.calls, 1);
  dres_fini(&r);
  tu_wait_until(tcp_live_zero, rt, "the cancelled attempt to be freed");
  tu_full_listener_close(&f);
  weft_strand_release(s);
  rt_end(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

typedef struct twice {
  weft_dial *d;
  int rc1, rc2;
} twice;

static void cancel_twice(void *arg) {
  twice *t = arg;
  t->rc1 = weft_tcp_dial_cancel(t->d);
  t->rc2 = weft_tcp_dial_cancel(t->d);
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make(), *other = rt_make();
  weft_strand *s, *os;
  tu_strand_create(rt, &s);
  tu_strand_create(other, &os);
  dres r;
  dres_init(&r, s);
  weft_dial *d;
  tu_assert_rc(weft_tcp_dial(NULL, s, "h", "1", 0, on_dial, &r, &d), -EINVAL);
  tu_assert_rc(weft_tcp_dial(rt, s, NULL, "1", 0, on_dial, &r, &d), -EINVAL);
  tu_assert_rc(weft_tcp_dial(rt, s, "h", NULL, 0, on_dial, &r, &d), -EINVAL);
  tu_assert_rc(weft_tcp_dial(rt, s, "h", "1", 0, NULL, &r, &d), -EINVAL);
  tu_assert_rc(weft_tcp_dial(rt, os, "h", "1", 0, on_dial, &r, &d), -EXDEV);
  tu_assert_rc(weft_tcp_dial_cancel(NULL), -EINVAL);
  /* Two cancels on the strand, before fn: the second is -EALREADY. The
   * gate holds the strand until the handle is stored. */
  tu_gate g;
  tu_gate_init(&g);
  tu_assert_rc(weft_post(s, tu_gate_handler, &g), 0);
  tu_wait_count(&g.entered, 1, "the gate handler on the strand");
  twice t = {NULL, 1, 1};
  tu_assert_rc(weft_tcp_dial(rt, s, "b.hang.test", "1", 0, on_dial, &r, &t.d),
               0);
  tu_assert_rc(weft_post(s, cancel_twice, &t), 0);
  tu_gate_open(&g);
  tu_event_wait(&r.ev, 1, "the cancelled dial's callback");
  tu_assert_rc(t.rc1, 0);
  tu_assert_rc(t.rc2, -EALREADY);
  tu_assert_rc(r.status, -ECANCELED);
  fg_gate_open();
  weft_strand_release(s);
  weft_strand_release(os);
  rt_end(rt);
  rt_end(other);
  assert_int_equal(r.calls, 1);
  dres_fini(&r);
  tu_gate_destroy(&g);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void *open_later(void *arg) {
  (void)arg;
  tu_sleep_ms(50);
  fg_gate_open();
  return NULL;
}

static void test_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make();
  dres r;
  dres_init(&r, NULL);
  tu_assert_rc(
      weft_tcp_dial(rt, NULL, "c.hang.test", "1", 0, on_dial, &r, NULL), 0);
  fg_wait_hung(1);
  pthread_t t;
  tu_thread_start(&t, open_later, NULL);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_thread_join(t, "the gate opener");
  assert_int_equal(r.calls, 1);
  assert_true(r.status != 0);
  dres_fini(&r);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fallback),        cmocka_unit_test(test_order),
      cmocka_unit_test(test_attempt_timeout), cmocka_unit_test(test_failures),
      cmocka_unit_test(test_cancel),          cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
