/*
 * test_fault_sweep: fails the Nth allocation, the Nth thread start or the
 * Nth io_uring setup made by weft, for every N, through a whole session:
 * runtime create, posts, a timer, a blocking job, an echo over TCP, and a
 * shutdown. Each run must end with success or a documented error, with
 * every accepted handler, timer arming, job and connection completed
 * exactly once, and without a hang (each wait is bounded) or a leak (the
 * ASan build's LeakSanitizer checks the whole process at exit).
 *
 * The failures are injected at the link: the test is linked with
 * --wrap for malloc, calloc, realloc, posix_memalign, aligned_alloc,
 * pthread_create and io_uring_queue_init_params (tests/CMakeLists.txt),
 * so only calls made by weft (and this file, which allocates nothing)
 * can fail; glibc's own calls go straight through. weft's pools call the
 * allocator for their slabs, so their refills are swept too. The sweep
 * for a kind ends at the first N that the whole session does not reach.
 */
/* A lost job shows as a shutdown that does not end: 10 s is plenty. */
#define TU_WAIT_S 10
#include "testutil.h"

#include <liburing.h>
#include <poll.h>

/* ---- injection ----------------------------------------------------------- */

enum { K_ALLOC, K_THREAD, K_RING, K_KINDS };
static const char *const kind_name[K_KINDS] = {"allocation", "thread start",
                                               "io_uring setup"};
static _Atomic long g_fail_at[K_KINDS]; /* 0: none */
static _Atomic long g_calls[K_KINDS];
static _Atomic long g_failed[K_KINDS];

static bool inject(int k) {
  long n = atomic_fetch_add(&g_calls[k], 1) + 1;
  if (n != atomic_load(&g_fail_at[k]))
    return false;
  atomic_fetch_add(&g_failed[k], 1);
  return true;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);
int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n) {
  if (inject(K_ALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __real_malloc(n);
}
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_calloc(size_t k, size_t n) {
  if (inject(K_ALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __real_calloc(k, n);
}
void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) {
  if (inject(K_ALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  if (inject(K_ALLOC))
    return ENOMEM;
  return __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n) {
  if (inject(K_ALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __real_aligned_alloc(a, n);
}
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg) {
  if (inject(K_THREAD))
    return EAGAIN;
  return __real_pthread_create(t, a, fn, arg);
}
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p) {
  if (inject(K_RING))
    return -ENOMEM;
  return __real_io_uring_queue_init_params(entries, ring, p);
}

/* ---- one session ----------------------------------------------------------
 */

#define POSTS 8
#define WAIT_MS 300

typedef struct session {
  weft_rt *rt;
  tu_count ran, cancelled;       /* posted handlers */
  tu_count timer_calls, jobs;    /* timer handler, blocking done */
  tu_count accepted, closes;     /* connections */
  tu_count conn_cbs_after_close; /* any callback after the close */
  char buf[64];
} session;

static session g_s;

static void handler(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_s.ran, 1);
}
static void cancelled(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_s.cancelled, 1);
}
static void on_timer(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECKF(status == 0 || status == -ECANCELED, "timer status %d", status);
  atomic_fetch_add(&g_s.timer_calls, 1);
}
static long job(void *arg) { return (long)(uintptr_t)arg; }
static void job_done(void *arg, long r) {
  (void)arg;
  TU_CHECKF(r == 7 || r == -ECANCELED, "job result %ld", r);
  atomic_fetch_add(&g_s.jobs, 1);
}

typedef struct conn_rec {
  atomic_bool closed;
} conn_rec;
static conn_rec g_recs[4];
static _Atomic unsigned g_nrec;

static void echo_read(void *arg, weft_tcp *c, long n);
static void echo_written(void *arg, weft_tcp *c, int status) {
  conn_rec *r = arg;
  if (atomic_load(&r->closed))
    atomic_fetch_add(&g_s.conn_cbs_after_close, 1);
  if (status < 0 ||
      weft_tcp_read(c, g_s.buf, sizeof(g_s.buf), echo_read, r) < 0)
    weft_tcp_close(c, 0);
}
static void echo_read(void *arg, weft_tcp *c, long n) {
  conn_rec *r = arg;
  if (atomic_load(&r->closed))
    atomic_fetch_add(&g_s.conn_cbs_after_close, 1);
  if (n <= 0 || weft_tcp_write(c, g_s.buf, (size_t)n, echo_written, r) < 0)
    weft_tcp_close(c, 0);
}
static void echo_close(void *data, weft_tcp *c) {
  conn_rec *r = data;
  (void)c;
  TU_CHECK(!atomic_exchange(&r->closed, true));
  atomic_fetch_add(&g_s.closes, 1);
}
static void echo_accept(void *arg, weft_tcp *c) {
  (void)arg;
  unsigned i = atomic_fetch_add(&g_nrec, 1);
  if (i >= 4) {
    weft_tcp_close(c, 1);
    return;
  }
  conn_rec *r = &g_recs[i];
  atomic_fetch_add(&g_s.accepted, 1);
  TU_CHECK_RC(weft_tcp_set_data(c, r, echo_close), 0);
  if (weft_tcp_read(c, g_s.buf, sizeof(g_s.buf), echo_read, r) < 0)
    weft_tcp_close(c, 0);
}

static bool ok_err(int r) {
  return r == -ENOMEM || r == -EAGAIN || r == -ESHUTDOWN;
}

/* One session; false (after recording why) if a rule was broken. */
static bool run_session(int how) {
  memset(&g_s, 0, sizeof(g_s));
  memset(g_recs, 0, sizeof(g_recs));
  atomic_store(&g_nrec, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  int r = weft_rt_create(&g_s.rt, &cfg);
  if (r) {
    TU_CHECKF(ok_err(r), "weft_rt_create: %d (%s)", r, weft_strerror(r));
    return true;
  }
  weft_rt *rt = g_s.rt;
  unsigned posted = 0;
  weft_strand *s = NULL;
  if (weft_strand_create(rt, &s) == 0) {
    for (int i = 0; i < POSTS; i++) {
      r = weft_post_ex(s, handler, cancelled, NULL);
      TU_CHECKF(r == 0 || ok_err(r), "post: %d", r);
      posted += r == 0;
    }
  }
  weft_timer *t = NULL;
  bool armed = false;
  if (weft_timer_create(rt, s, &t) == 0) {
    r = weft_timer_start(t, 1000000, 0, on_timer, NULL);
    TU_CHECKF(r == 0 || ok_err(r), "timer start: %d", r);
    armed = r == 0;
  }
  r = weft_blocking(rt, job, (void *)7, s, job_done, NULL);
  TU_CHECKF(r == 0 || ok_err(r), "blocking: %d", r);
  bool job_in = r == 0;
  weft_listener *l = NULL;
  struct sockaddr_in a;
  tu_addr_loopback(&a, 0);
  r = weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof(a), NULL, echo_accept,
                      NULL, &l);
  TU_CHECKF(r == 0 || ok_err(r), "listen: %d (%s)", r, weft_strerror(r));
  if (r == 0) {
    struct sockaddr_storage got;
    unsigned len = sizeof(got);
    weft_listener_addr(l, (struct sockaddr *)&got, &len);
    int fd = tu_sock_connect(tu_addr_port((struct sockaddr *)&got), 0, 0);
    if (fd >= 0) {
      char echo[4];
      if (send(fd, "ping", 4, MSG_NOSIGNAL) == 4 &&
          tu_sock_poll(fd, POLLIN, WAIT_MS) > 0)
        (void)recv(fd, echo, sizeof(echo), MSG_DONTWAIT);
      close(fd);
    }
  }
  tu_sleep_ms(2); /* the timer's millisecond */
  r = weft_rt_shutdown(rt, how | WEFT_SHUTDOWN_NOWAIT);
  TU_CHECKF(r == 0, "shutdown: %d", r);
  if (weft_rt_wait(rt, (uint64_t)TU_WAIT_S * 1000000000u) != 0)
    fail_msg("the shutdown did not finish within %d s: accepted work that "
             "nothing will run",
             TU_WAIT_S); /* the runtime is left as it is */
  weft_timer_destroy(t);
  if (s)
    weft_strand_release(s);
  r = weft_rt_destroy(rt);
  TU_CHECKF(r == 0, "destroy: %d", r);
  uint64_t ran = atomic_load(&g_s.ran), can = atomic_load(&g_s.cancelled);
  TU_CHECKF(ran + can == posted,
            "%u posts accepted, %" PRIu64 " ran, %" PRIu64 " cancelled", posted,
            ran, can);
  TU_CHECKF(atomic_load(&g_s.timer_calls) == (armed ? 1u : 0u),
            "timer handler called %" PRIu64 " times (armed: %d)",
            (uint64_t)atomic_load(&g_s.timer_calls), armed);
  TU_CHECKF(atomic_load(&g_s.jobs) == (job_in ? 1u : 0u),
            "job done called %" PRIu64 " times (accepted: %d)",
            (uint64_t)atomic_load(&g_s.jobs), job_in);
  TU_CHECKF(atomic_load(&g_s.closes) == atomic_load(&g_s.accepted),
            "%" PRIu64 " connections, %" PRIu64 " close callbacks",
            (uint64_t)atomic_load(&g_s.accepted),
            (uint64_t)atomic_load(&g_s.closes));
  TU_CHECK(atomic_load(&g_s.conn_cbs_after_close) == 0);
  return atomic_load(tu_async_errors()) == 0;
}

/* Fails the Nth call of kind k for N = 1, 2, ... until a session makes
 * fewer than N such calls; the shutdown mode alternates. */
static void sweep(int k) {
  long n;
  for (n = 1;; n++) {
    for (int i = 0; i < K_KINDS; i++) {
      atomic_store(&g_calls[i], 0);
      atomic_store(&g_fail_at[i], 0);
    }
    atomic_store(&g_failed[k], 0);
    atomic_store(&g_fail_at[k], n);
    bool ok = run_session(n % 2 ? WEFT_SHUTDOWN_DRAIN : WEFT_SHUTDOWN_CANCEL);
    atomic_store(&g_fail_at[k], 0);
    if (!ok)
      fail_msg("failing %s #%ld broke a rule (above)", kind_name[k], n);
    if (!atomic_load(&g_failed[k]))
      break; /* the session made fewer than n: all swept */
  }
  print_message("[ INFO     ] %s: %ld failure points swept\n", kind_name[k],
                n - 1);
  assert_true(n > 1);
}

static void test_alloc(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("sweep: allocations");
  sweep(K_ALLOC);
}

static void test_thread(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("sweep: thread starts");
  sweep(K_THREAD);
}

static void test_ring(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("sweep: io_uring setups");
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, NULL), 0);
  bool uring = weft_rt_backend(rt) == WEFT_BACKEND_URING;
  assert_int_equal(weft_rt_destroy(rt), 0);
  if (!uring)
    skip(); /* epoll, by choice or because io_uring is refused */
  sweep(K_RING);
}

/* A configuration refused after create has allocated (the blocking
 * queue is checked last): -EINVAL, and nothing leaks (LeakSanitizer, at
 * exit in the ASan build). */
static void test_refused_config(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.blocking_queue = 1u << 20;
  weft_rt *rt = NULL;
  assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
  assert_null(rt);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc),
      cmocka_unit_test(test_thread),
      cmocka_unit_test(test_ring),
      cmocka_unit_test(test_refused_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
