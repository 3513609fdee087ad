/*
 * test_tcp_lifetime: a connection's close callback comes last, and what it
 * frees is not touched afterwards.
 *
 * weft.h, "Lifetime": the close callback runs exactly once, "after every
 * other callback of the connection has returned", and after it weft never
 * touches the connection; "Strands": a strand weft made for a connection
 * lives until its close callback has returned.
 *
 *  - Handlers posted to the connection's strand before it finished
 *    closing run before its close callback: posted from the accept
 *    callback before weft_tcp_close; and at a shutdown, posted behind a
 *    gate on the strand while a read event of the connection is queued
 *    there already (the shutdown's close used to join that earlier queued
 *    event and overtake the handler).
 *  - A timer on the connection's own strand, periodic, destroyed in the
 *    close callback: no call after the close callback.
 *  - A strand lent to another connection: each accepted connection A
 *    connects a second one, B, on A's strand (weft_tcp_strand), and
 *    relays what its client sends to B, while clients keep sending; the
 *    runtime then shuts down. Every A, B and far end gets exactly one
 *    close callback. A's strand must outlive B (a debug build of weft
 *    aborts on a post to a reclaimed strand).
 *  - The application's own strand, given to weft_tcp_connect and released
 *    while the connection is open: the connection's callbacks, its close
 *    callback at the shutdown included, still run there, once (a debug
 *    build of weft aborts on a post to a reclaimed strand; ASan catches
 *    one in any build).
 *  - Misuse is named: with log_level WEFT_LOG_DEBUG, a read made off the
 *    connection's strand logs the call and the rule it broke.
 */
#include "testutil.h"

#include <arpa/inet.h>

/* ------------------------------------------- posted before the close */

typedef struct rec {
  tu_count posted_ran; /* handlers posted before the close that ran */
  tu_count closes;
  unsigned posted_at_close; /* posted_ran seen by the close callback */
  tu_event closed;
  tu_gate gate;
  weft_tcp *c;
  char buf[64];
  tu_count reads;
  int last_read;
} rec;

static void posted(void *arg) {
  atomic_fetch_add(&((rec *)arg)->posted_ran, 1);
}

static void rec_close(void *data, weft_tcp *c) {
  rec *r = data;
  TU_CHECK(weft_tcp_data(c) == r);
  r->posted_at_close = (unsigned)atomic_load(&r->posted_ran);
  atomic_fetch_add(&r->closes, 1);
  tu_event_add(&r->closed, 1);
}

static void accept_post_close(void *arg, weft_tcp *c) {
  rec *r = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, r, rec_close), 0);
  for (int i = 0; i < 3; i++)
    TU_CHECK_RC(weft_post(weft_tcp_strand(c), posted, r), 0);
  TU_CHECK_RC(weft_tcp_close(c, 0), 0);
}

static void test_posted_before_close(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("lifetime: posted before an explicit close");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  rec r;
  memset(&r, 0, sizeof(r));
  tu_event_init(&r.closed);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_post_close, &r, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&r.closed, 1, "the close callback");
  close(fd);
  tu_listener_close(l);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(r.posted_at_close, 3);
  assert_int_equal(atomic_load(&r.closes), 1);
  tu_event_destroy(&r.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void on_read_rec(void *arg, weft_tcp *c, long n) {
  rec *r = arg;
  r->last_read = (int)n;
  atomic_fetch_add(&r->reads, 1);
  if (n > 0)
    weft_tcp_read(c, r->buf, sizeof(r->buf), on_read_rec, r);
}

static void accept_hold(void *arg, weft_tcp *c) {
  rec *r = arg;
  r->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, r, rec_close), 0);
  TU_CHECK_RC(weft_tcp_read(c, r->buf, sizeof(r->buf), on_read_rec, r), 0);
  TU_CHECK_RC(weft_post(weft_tcp_strand(c), tu_gate_handler, &r->gate), 0);
}

static void test_posted_before_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("lifetime: posted before a shutdown's close");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  rec r;
  memset(&r, 0, sizeof(r));
  tu_event_init(&r.closed);
  tu_gate_init(&r.gate);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_hold, &r, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_wait_count(&r.gate.entered, 1, "the gate on the connection's strand");
  /* Bytes for the pending read: its event is queued behind the gate. */
  assert_int_equal(tu_sock_send_all(fd, "x", 1), 0);
  tu_sleep_ms(20);
  for (int i = 0; i < 3; i++)
    tu_assert_rc(weft_post(weft_tcp_strand(r.c), posted, &r), 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT),
               0);
  tu_gate_open(&r.gate);
  tu_event_wait(&r.closed, 1, "the close callback");
  assert_int_equal(weft_rt_destroy(rt), 0);
  close(fd);
  assert_int_equal(r.posted_at_close, 3);
  assert_int_equal(atomic_load(&r.closes), 1);
  tu_gate_destroy(&r.gate);
  tu_event_destroy(&r.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------- a timer on its strand */

typedef struct tconn {
  weft_timer *t;
  atomic_bool closed;
  tu_count ticks, late_ticks;
  tu_event done;
} tconn;

static void tick(void *arg, int status, uint64_t missed) {
  tconn *k = arg;
  (void)missed;
  if (atomic_load(&k->closed))
    atomic_fetch_add(&k->late_ticks, 1);
  if (status == 0)
    atomic_fetch_add(&k->ticks, 1);
}

static void tconn_close(void *data, weft_tcp *c) {
  (void)c;
  tconn *k = data;
  weft_timer_destroy(k->t);
  atomic_store(&k->closed, true);
  tu_event_add(&k->done, 1);
}

static void accept_timer(void *arg, weft_tcp *c) {
  tconn *k = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, k, tconn_close), 0);
  TU_CHECK_RC(weft_timer_create(weft_rt_current(), weft_tcp_strand(c), &k->t),
              0);
  TU_CHECK_RC(weft_timer_start(k->t, 0, 100000, tick, k), 0);
}

static void test_timer_on_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("lifetime: a timer on the connection's strand");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  tconn k;
  memset(&k, 0, sizeof(k));
  tu_event_init(&k.done);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_timer, &k, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_wait_count(&k.ticks, 5, "the connection's timer");
  close(fd); /* the shutdown closes the connection */
  tu_listener_close(l);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_event_wait(&k.done, 1, "the close callback");
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&k.late_ticks), 0);
  tu_event_destroy(&k.done);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* --------------------------------------------------- a lent strand */

#define PAIRS 16
#define CHUNK 4096

static uint16_t g_far_port;
static tu_count g_a_closes, g_b_closes, g_far_closes, g_b_connected;
static tu_count g_far_accepted;

typedef struct pair {
  weft_tcp *a, *b; /* b: NULL until connected, and after its close */
  char buf[CHUNK];
  bool writing;
} pair;

static void a_read(void *arg, weft_tcp *c, long n);

static void b_close(void *data, weft_tcp *c) {
  pair *p = data;
  (void)c;
  p->b = NULL;
  atomic_fetch_add(&g_b_closes, 1);
}

static void a_close(void *data, weft_tcp *c) {
  pair *p = data;
  (void)c;
  atomic_fetch_add(&g_a_closes, 1);
  /* b shares the strand: its own close callback is still to come, or
   * came already (p->b NULL); p is freed by whichever comes last. */
  if (p->b) {
    p->a = NULL;
    weft_tcp_close(p->b, 0);
  } else {
    free(p);
  }
}

static void b_close_last(void *data, weft_tcp *c) {
  pair *p = data;
  b_close(data, c);
  if (!p->a)
    free(p);
}

static void b_written(void *arg, weft_tcp *c, int status) {
  pair *p = arg;
  (void)c;
  p->writing = false;
  if (status == 0 && p->a)
    weft_tcp_read(p->a, p->buf, sizeof(p->buf), a_read, p);
}

static void a_read(void *arg, weft_tcp *c, long n) {
  pair *p = arg;
  if (n <= 0 || !p->b) {
    weft_tcp_close(c, 0);
    return;
  }
  if (weft_tcp_write(p->b, p->buf, (size_t)n, b_written, p) == 0)
    p->writing = true;
  else
    weft_tcp_close(c, 0);
}

static void b_connected(void *arg, weft_tcp *c, int status) {
  pair *p = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, p, b_close_last), 0);
  if (status != 0)
    return; /* it closes itself; then so does a */
  p->b = c;
  atomic_fetch_add(&g_b_connected, 1);
  TU_CHECK_RC(weft_tcp_read(p->a, p->buf, sizeof(p->buf), a_read, p), 0);
}

static void accept_a(void *arg, weft_tcp *c) {
  (void)arg;
  pair *p = calloc(1, sizeof(*p));
  TU_CHECK(p != NULL);
  p->a = c;
  TU_CHECK_RC(weft_tcp_set_data(c, p, a_close), 0);
  struct sockaddr_in to;
  tu_addr_loopback(&to, g_far_port);
  weft_tcp *b;
  int rc = weft_tcp_connect(weft_rt_current(), weft_tcp_strand(c),
                            (struct sockaddr *)&to, sizeof(to), 0, b_connected,
                            p, &b);
  TU_CHECKF(rc == 0, "connect: %d", rc);
}

typedef struct far {
  char buf[CHUNK];
} far;

static void far_close(void *data, weft_tcp *c) {
  (void)c;
  free(data);
  atomic_fetch_add(&g_far_closes, 1);
}

static void far_read(void *arg, weft_tcp *c, long n) {
  far *f = arg;
  if (n <= 0 || weft_tcp_read(c, f->buf, sizeof(f->buf), far_read, f) != 0)
    weft_tcp_close(c, 0);
}

static void accept_far(void *arg, weft_tcp *c) {
  (void)arg;
  far *f = malloc(sizeof(*f));
  TU_CHECK(f != NULL);
  TU_CHECK_RC(weft_tcp_set_data(c, f, far_close), 0);
  TU_CHECK_RC(weft_tcp_read(c, f->buf, sizeof(f->buf), far_read, f), 0);
  atomic_fetch_add(&g_far_accepted, 1);
}

static atomic_bool g_stop_send;

static void *sender(void *arg) {
  int *fds = arg;
  static const char data[CHUNK];
  while (!atomic_load(&g_stop_send))
    for (int i = 0; i < PAIRS; i++)
      if (send(fds[i], data, sizeof(data), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
          errno != EAGAIN)
        return NULL;
  return NULL;
}

static void test_lent_strand_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("lifetime: a strand lent to another connection, shut down");
  atomic_store(&g_a_closes, 0);
  atomic_store(&g_b_closes, 0);
  atomic_store(&g_far_closes, 0);
  atomic_store(&g_b_connected, 0);
  atomic_store(&g_far_accepted, 0);
  atomic_store(&g_stop_send, false);
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_listener *lfar, *la;
  g_far_port = tu_tcp_listen(rt, NULL, accept_far, NULL, &lfar);
  uint16_t port = tu_tcp_listen(rt, NULL, accept_a, NULL, &la);
  int fds[PAIRS];
  for (int i = 0; i < PAIRS; i++) {
    fds[i] = tu_sock_connect(port, 0, 0);
    assert_true(fds[i] >= 0);
  }
  tu_wait_count(&g_b_connected, PAIRS, "every relay to connect");
  /* B's connect completes when the kernel queues it for accept: a far end
   * the shutdown finds not yet accepted never reaches the application,
   * and gets no close callback (weft.h). */
  tu_wait_count(&g_far_accepted, PAIRS, "every far end to be accepted");
  pthread_t th;
  tu_thread_start(&th, sender, fds);
  tu_sleep_ms(50); /* bytes in flight through every pair */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  atomic_store(&g_stop_send, true);
  tu_thread_join(th, "the sender");
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (int i = 0; i < PAIRS; i++)
    close(fds[i]);
  assert_int_equal(atomic_load(&g_a_closes), PAIRS);
  assert_int_equal(atomic_load(&g_b_closes), PAIRS);
  assert_int_equal(atomic_load(&g_far_closes), PAIRS);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------- the user's strand, released */

static tu_count g_rel_connected, g_rel_closes;
static _Atomic(weft_strand *) g_rel_strand;

static void rel_close(void *data, weft_tcp *c) {
  (void)data;
  (void)c;
  TU_CHECK(weft_strand_current() == atomic_load(&g_rel_strand));
  atomic_fetch_add(&g_rel_closes, 1);
}

static void rel_connected(void *arg, weft_tcp *c, int status) {
  (void)arg;
  TU_CHECK_RC(status, 0);
  TU_CHECK_RC(weft_tcp_set_data(c, NULL, rel_close), 0);
  atomic_fetch_add(&g_rel_connected, 1);
}

static void accept_idle(void *arg, weft_tcp *c) {
  (void)arg;
  (void)c;
}

static void test_released_user_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  atomic_store(&g_rel_connected, 0);
  atomic_store(&g_rel_closes, 0);
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_idle, NULL, &l);
  weft_strand *s;
  tu_strand_create(rt, &s);
  atomic_store(&g_rel_strand, s);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  enum { N = 4 };
  for (int i = 0; i < N; i++) {
    weft_tcp *c;
    tu_assert_rc(weft_tcp_connect(rt, s, (struct sockaddr *)&a, sizeof a, 0,
                                  rel_connected, NULL, &c),
                 0);
  }
  tu_wait_count(&g_rel_connected, N, "the connects");
  weft_strand_release(s); /* the connections stay open on it */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&g_rel_closes), N);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------ misuse is named */

/* With log_level WEFT_LOG_DEBUG, a connection call off its strand logs
 * which call broke which rule, besides returning -EPERM. */
typedef struct msgs {
  pthread_mutex_t m;
  char last[512];
  int level;
} msgs;

static void log_to(void *ctx, int level, const char *msg) {
  msgs *ms = ctx;
  pthread_mutex_lock(&ms->m);
  snprintf(ms->last, sizeof(ms->last), "%s", msg);
  ms->level = level;
  pthread_mutex_unlock(&ms->m);
}

static void accept_keep(void *arg, weft_tcp *c) {
  atomic_store((_Atomic(weft_tcp *) *)arg, c);
}

static void test_misuse_logged(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("lifetime: misuse is logged");
  msgs ms = {.m = PTHREAD_MUTEX_INITIALIZER};
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.log_fn = log_to;
  cfg.log_ctx = &ms;
  cfg.log_level = WEFT_LOG_DEBUG;
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  _Atomic(weft_tcp *) kept = NULL;
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_keep, (void *)&kept, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  while (!atomic_load(&kept))
    tu_sleep_ms(1);
  char buf[8];
  assert_int_equal(
      weft_tcp_read(atomic_load(&kept), buf, sizeof(buf), on_read_rec, NULL),
      -EPERM);
  pthread_mutex_lock(&ms.m);
  print_message("[ INFO     ] logged: %s\n", ms.last);
  assert_int_equal(ms.level, WEFT_LOG_DEBUG);
  assert_non_null(strstr(ms.last, "weft_tcp_read"));
  assert_non_null(strstr(ms.last, "not called on the connection's strand"));
  pthread_mutex_unlock(&ms.m);
  tu_listener_close(l);
  assert_int_equal(weft_rt_destroy(rt), 0);
  close(fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_posted_before_close),
      cmocka_unit_test(test_posted_before_shutdown),
      cmocka_unit_test(test_timer_on_strand),
      cmocka_unit_test(test_lent_strand_shutdown),
      cmocka_unit_test(test_released_user_strand),
      cmocka_unit_test(test_misuse_logged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
