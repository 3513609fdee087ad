/*
 * test_uring_partial_submit: an io_uring enter that takes only part of the
 * SQ loses no close count, and drops none twice.
 *
 * A close entry must stay counted until an enter has consumed it
 * (io_uring.c, entered): it keeps the descriptor counted busy, so that a
 * shutdown does not end before the descriptor is closed. The kernel
 * consumes entries in order and stops at the first one that fails its
 * checks (without IORING_SETUP_SUBMIT_ALL): the entries behind it stay in
 * the SQ for the next enter. Dropping the count after every enter, or
 * only after one that emptied the SQ, is wrong both ways: early (a
 * shutdown ends before the close is in) or never (a shutdown waits
 * forever).
 *
 * So this test makes the kernel split submissions: handlers on the runtime
 * threads put an invalid entry (opcode 255, its completion ignored as
 * WEFT_OP_QUIET) into their shard's ring, before and after the accept,
 * receive, cancel and close entries of CONNS connections. First it checks
 * on a ring of its own that the kernel does stop there (else the test
 * would check nothing, and says so). Then:
 *   - every connection is accepted once, reads its client's byte, and is
 *     closed by the server: the client sees EOF;
 *   - weft_rt_shutdown returns (every close entry was counted down);
 *     afterwards no ring has a close left;
 *   - with connections open at the shutdown: when it returns, each
 *     client sees its connection closed, and each connection has had its
 *     read callback (an error) and then its close callback, once;
 *   - after weft_rt_destroy the process has as many descriptors open as
 *     before.
 * Registered with WEFT_BACKEND=uring: a runtime on epoll fails the test.
 */
#include "testutil.h"

#include <liburing.h>

#include "io_uring.h" /* weft__uring_sqe, struct weft__io */

#define NWORKERS 2
#define BATCH 16 /* client connections open at once */
#define BAD_OPCODE 255

typedef struct ctx {
  weft_rt *rt;
  tu_count accepted, reads, closed, injected, cancelled;
  bool shutting; /* reads end with an error, weft closes */
} ctx;

typedef struct conn {
  ctx *x;
  char byte;
  unsigned read_cbs; /* on the connection's strand */
} conn;

static _Thread_local uint64_t rng;

/* Puts 0, 1 or 2 invalid entries into the calling thread's ring. */
static void maybe_inject(ctx *x) {
  if (rng == 0)
    rng = (uint64_t)(uintptr_t)&rng | 1;
  unsigned n = (unsigned)(tu_rand(&rng) % 3);
  struct weft__shard *sh = weft__local_begin(x->rt);
  for (unsigned i = 0; sh && i < n; i++) {
    struct io_uring_sqe *sqe = weft__uring_sqe(weft__io_of(sh));
    if (!sqe)
      break;
    io_uring_prep_rw(BAD_OPCODE, sqe, -1, NULL, 0, 0);
    io_uring_sqe_set_data64(sqe, WEFT_OP_QUIET); /* nobody's: ignored */
    atomic_fetch_add(&x->injected, 1);
  }
  weft__local_end(sh);
}

/* Once per connection, whatever closed it, after its read callback. */
static void close_cb(void *arg, weft_tcp *c) {
  (void)c;
  conn *k = arg;
  TU_CHECKF(k->read_cbs == 1, "close callback after %u read callbacks",
            k->read_cbs);
  atomic_fetch_add(&k->x->closed, 1);
  free(k);
}

static void read_cb(void *arg, weft_tcp *c, long n) {
  conn *k = arg;
  k->read_cbs++;
  if (k->x->shutting) { /* the shutdown closes c; close_cb frees k */
    TU_CHECKF(n < 0, "read during the shutdown: %ld, want an error", n);
    maybe_inject(k->x);
    atomic_fetch_add(&k->x->cancelled, 1);
    return;
  }
  TU_CHECKF(n == 1, "read: %ld, want the client's byte", n);
  atomic_fetch_add(&k->x->reads, 1);
  maybe_inject(k->x);
  int rc = weft_tcp_close(c, 0);
  TU_CHECKF(rc == 0, "weft_tcp_close: %d", rc);
  maybe_inject(k->x);
}

/* Counted accepted once its read is issued: test_shutdown_closes starts
 * the shutdown when all are, and a read issued after that is refused
 * (-ESHUTDOWN, as weft/net.h says). */
static void accept_cb(void *arg, weft_tcp *c) {
  ctx *x = arg;
  conn *k = malloc(sizeof *k);
  TU_CHECK(k != NULL);
  if (!k)
    return;
  k->x = x;
  k->read_cbs = 0;
  TU_CHECK_RC(weft_tcp_set_data(c, k, close_cb), 0);
  maybe_inject(x);
  int rc = weft_tcp_read(c, &k->byte, 1, read_cb, k);
  TU_CHECKF(rc == 0, "weft_tcp_read: %d", rc);
  maybe_inject(x);
  atomic_fetch_add(&x->accepted, 1);
}

/* The premise: the kernel stops submitting at an entry that fails its
 * checks and leaves the ones behind it in the SQ. */
static void check_kernel_stops(void) {
  struct io_uring ring;
  int rc = io_uring_queue_init(8, &ring, 0);
  if (rc != 0)
    fail_msg("io_uring_queue_init: %d (%s): this test needs io_uring", rc,
             strerror(-rc));
  io_uring_prep_nop(io_uring_get_sqe(&ring));
  io_uring_prep_rw(BAD_OPCODE, io_uring_get_sqe(&ring), -1, NULL, 0, 0);
  io_uring_prep_nop(io_uring_get_sqe(&ring));
  int n = io_uring_submit(&ring);
  unsigned left = io_uring_sq_ready(&ring);
  io_uring_queue_exit(&ring);
  if (n != 2 || left != 1)
    fail_msg("three entries, the second invalid: the enter took %d and left "
             "%u; this test expects 2 and 1 (a kernel that no longer stops "
             "at a failed entry needs another way to split submissions)",
             n, left);
}

typedef struct client {
  uint16_t port;
  uint64_t conns, eofs;
} client;

static void *client_main(void *arg) {
  client *cl = arg;
  int fds[BATCH];
  for (uint64_t done = 0; done < cl->conns;) {
    unsigned n = 0;
    while (n < BATCH && done + n < cl->conns) {
      int fd = tu_sock_connect(cl->port, 0, 0);
      TU_CHECKF(fd >= 0, "connect: %d", fd);
      if (fd < 0)
        return NULL;
      TU_CHECK(send(fd, "x", 1, MSG_NOSIGNAL) == 1);
      fds[n++] = fd;
    }
    for (unsigned i = 0; i < n; i++) {
      int rc = tu_sock_wait_closed(fds[i], TU_WAIT_S * 1000, NULL);
      TU_CHECKF(rc == 0, "client connection: %d (%s), want EOF", rc,
                strerror(-rc));
      if (rc == 0)
        cl->eofs++;
      close(fds[i]);
    }
    done += n;
  }
  return NULL;
}

/* After a shutdown: no ring has a close count left. */
static void check_rings(weft_rt *rt) {
  for (unsigned i = 0; i < rt->nshards; i++) {
    if (!rt->io.ios[i].ring)
      continue;
    if (rt->io.ios[i].close_n != 0)
      fail_msg("shard %u's ring after shutdown: closes %u", i,
               rt->io.ios[i].close_n);
  }
}

/* A runtime of NWORKERS on io_uring and a listener whose accept callback
 * is accept_cb with x; returns the port. */
static uint16_t setup(weft_rt **rtp, ctx *x, weft_listener **lp) {
  tu_rt_create(rtp, NWORKERS, 0);
  tu_assert_backend(*rtp);
  assert_int_equal(weft_rt_backend(*rtp), WEFT_BACKEND_URING);
  memset(x, 0, sizeof *x);
  x->rt = *rtp;
  return tu_tcp_listen(*rtp, NULL, accept_cb, x, lp);
}

static void test_partial_submit(void **state) {
  (void)state;
  check_kernel_stops();
  unsigned fds_before = tu_count_fds();
  weft_rt *rt;
  ctx x;
  weft_listener *l;
  client cl = {0, TU_SCALED(4000, 300), 0};
  cl.port = setup(&rt, &x, &l);
  print_message("[ INFO     ] accepts: %s\n",
                rt->io.ring_accept ? "ring requests" : "poll and accept4");
  pthread_t th;
  tu_thread_start(&th, client_main, &cl);
  tu_thread_join(th, "client");
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(cl.eofs, cl.conns);
  tu_wait_count(&x.closed, cl.conns, "every connection closed");
  assert_int_equal(atomic_load(&x.accepted), cl.conns);
  assert_int_equal(atomic_load(&x.reads), cl.conns);
  print_message("[ INFO     ] %" PRIu64 " connections, %" PRIu64
                " invalid entries\n",
                cl.conns, (uint64_t)atomic_load(&x.injected));
  assert_true(atomic_load(&x.injected) > 0);
  tu_assert_rc(weft_listener_close(l, NULL, NULL), 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  check_rings(rt);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_int_equal(tu_count_fds(), fds_before);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* weft_rt_shutdown with open connections, whose reads end and whose
 * closes weft makes, invalid entries among them: when it returns, every
 * client must see its connection closed at once (a close count dropped
 * before its entry went in would let it return early). */
static void test_shutdown_closes(void **state) {
  (void)state;
  unsigned fds_before = tu_count_fds();
  uint64_t rounds = TU_SCALED(100, 10), open_ = 0;
  for (uint64_t r = 0; r < rounds; r++) {
    tu_phase("shutdown closes: a round");
    weft_rt *rt;
    ctx x;
    weft_listener *l;
    uint16_t port = setup(&rt, &x, &l);
    int fds[BATCH];
    for (unsigned i = 0; i < BATCH; i++) {
      fds[i] = tu_sock_connect(port, 0, 0);
      assert_true(fds[i] >= 0);
    }
    tu_wait_count(&x.accepted, BATCH, "every connection accepted");
    x.shutting = true; /* before the shutdown: it orders the reads after */
    tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
    for (unsigned i = 0; i < BATCH; i++) {
      struct pollfd p = {fds[i], POLLIN, 0};
      if (poll(&p, 1, 0) != 1) {
        open_++;
        print_error("round %" PRIu64 ": connection %u still open after "
                    "weft_rt_shutdown returned\n",
                    r, i);
      }
      close(fds[i]);
    }
    assert_int_equal(atomic_load(&x.cancelled), BATCH);
    /* weft.h: the shutdown gives each connection its close callback */
    assert_int_equal(atomic_load(&x.closed), BATCH);
    check_rings(rt);
    tu_assert_rc(weft_rt_destroy(rt), 0);
    TU_ASSERT_NO_ASYNC_ERRORS();
  }
  assert_int_equal(open_, 0);
  assert_int_equal(tu_count_fds(), fds_before);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partial_submit),
      cmocka_unit_test(test_shutdown_closes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
