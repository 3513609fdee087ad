/*
 * test_lazy_start_fail: a lazy thread start that fails slowly loses no
 * work and does not keep the shutdown from completing.
 *
 * This program defines pthread_create (and pthread_mutex_lock) itself, so
 * that the library's calls come here: for one chosen thread, a create
 * blocks until the test lets it fail with EAGAIN, as a create against a
 * thread limit can take a while (stack mapping, clone, unmapping). The
 * popped dormant thread counts as a searcher for all that time, so posts
 * made meanwhile skip their wakeup; when its start fails, someone must
 * take that work (park.c, unpop_dormant and weft__park's recheck).
 *
 *  - lost post: workers 2, 3 and 8, one eager, no monitor. The eager
 *    thread is busy in h while a post from the failing thread pops a
 *    dormant one; h returns, its thread runs that post and parks; a
 *    second post is made, then the start fails. The second post runs.
 *  - shutdown: the same, with the eager thread held just before its park
 *    takes the sleeper lock (this program's pthread_mutex_lock), and a
 *    NOWAIT shutdown started before the start fails. weft_rt_wait sees
 *    the shutdown complete and the second post has run.
 *  - orphan timers: timers on shards whose thread cannot be started
 *    (every runtime thread's create fails) fire exactly once, on their
 *    strands.
 *  - socket: the first socket fails with -EAGAIN while a shard's thread
 *    cannot be started, and a later one starts them all.
 * The waits that steer the interleaving are sleeps; nothing asserts time.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <dlfcn.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
                         void *);
typedef int (*lock_fn)(pthread_mutex_t *);

/* The sanitizers' own interceptor when a sanitizer runtime is linked in
 * statically (clang), else the next definition (libc, or gcc's dynamic
 * sanitizer runtime, which then intercepts it). */
extern int __interceptor_pthread_create(pthread_t *, const pthread_attr_t *,
                                        void *(*)(void *), void *)
    __attribute__((weak));

static create_fn real_create;
static lock_fn real_lock;

__attribute__((constructor)) static void find_real(void) {
  real_create = __interceptor_pthread_create
                    ? __interceptor_pthread_create
                    : (create_fn)dlsym(RTLD_NEXT, "pthread_create");
  real_lock = (lock_fn)dlsym(RTLD_NEXT, "pthread_mutex_lock");
}

/* The entry of every runtime thread (src/shard.c): the creates to fail
 * are those of runtime threads, not, say, the helper thread that sets up
 * io_uring rings. */
extern void *weft__thread_entry(void *);

static _Thread_local bool fail_here;
static atomic_int fail_all; /* every runtime thread's create fails */
static atomic_int in_create, release_create;
static atomic_int hold_armed, held, go;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                   void *arg) {
  if (atomic_load(&fail_all) && fn == weft__thread_entry)
    return EAGAIN;
  if (fail_here) {
    atomic_store(&in_create, 1);
    uint64_t dl = tu_deadline_ns(TU_WAIT_S);
    while (!atomic_load(&release_create) && tu_now_ns() < dl)
      tu_sleep_ms(1);
    return EAGAIN;
  }
  return real_create(t, a, fn, arg);
}

static tu_count g_ran_w, g_ran_w2;

/* Once armed, the first mutex a runtime thread takes after w has run
 * (its park's sleeper lock: nothing else it does then takes one) waits
 * for go. */
int pthread_mutex_lock(pthread_mutex_t *m) {
  if (atomic_load(&hold_armed) && weft_rt_current() && !fail_here &&
      atomic_load(&g_ran_w) > 0 && atomic_exchange(&hold_armed, 0)) {
    atomic_store(&held, 1);
    uint64_t dl = tu_deadline_ns(TU_WAIT_S);
    while (!atomic_load(&go) && tu_now_ns() < dl)
      tu_sleep_ms(1);
  }
  return real_lock(m);
}

static atomic_int in_h, release_h;

static void h(void *a) {
  (void)a;
  atomic_store(&in_h, 1);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&release_h) && tu_now_ns() < dl)
    tu_sleep_ms(1);
}
static void w(void *a) {
  (void)a;
  atomic_fetch_add(&g_ran_w, 1);
}
static void w2(void *a) {
  (void)a;
  atomic_fetch_add(&g_ran_w2, 1);
}

static void *failer(void *arg) {
  fail_here = true;
  TU_CHECK(weft_post_rt(arg, w, NULL) == 0);
  return NULL;
}

static void wait_flag(atomic_int *f, const char *what) {
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(f)) {
    if (tu_now_ns() > dl)
      fail_msg("waited %d s for %s", TU_WAIT_S, what);
    tu_sleep_ms(1);
  }
}

/* workers shards, one thread started at create, no monitor (no spares:
 * only lazy starts can add threads). */
static weft_rt *create_one_eager(unsigned workers) {
  weft_config c;
  weft_config_init(&c);
  c.workers = workers;
  c.eager_workers = 1;
  c.flags = WEFT_CONFIG_NO_MONITOR;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create(&rt, &c), 0);
  return rt;
}

static weft_rt *setup(unsigned workers, pthread_t *f) {
  atomic_store(&in_create, 0);
  atomic_store(&release_create, 0);
  atomic_store(&in_h, 0);
  atomic_store(&release_h, 0);
  atomic_store(&g_ran_w, 0);
  atomic_store(&g_ran_w2, 0);
  weft_rt *rt = create_one_eager(workers);
  tu_sleep_ms(50); /* the eager thread parks */
  tu_assert_rc(weft_post_rt(rt, h, NULL), 0);
  wait_flag(&in_h, "h to start");
  tu_thread_start(f, failer, rt);
  wait_flag(&in_create, "the failing start"); /* a phantom searcher now */
  atomic_store(&release_h, 1); /* its thread runs w, finds nothing, parks */
  return rt;
}

static void test_lost_post(void **state) {
  (void)state;
  atomic_store(&hold_armed, 0);
  const unsigned ws[] = {2, 3, 8};
  for (unsigned k = 0; k < 3; k++) {
    tu_phase("lost post: a post made while a start fails slowly");
    pthread_t f;
    weft_rt *rt = setup(ws[k], &f);
    tu_wait_count(&g_ran_w, 1, "the failing thread's post");
    tu_sleep_ms(50);                             /* the eager thread asleep */
    tu_assert_rc(weft_post_rt(rt, w2, NULL), 0); /* sees a searcher */
    atomic_store(&release_create, 1);            /* EAGAIN */
    tu_thread_join(f, "failing poster");
    tu_wait_count(&g_ran_w2, 1, "the post made while the start failed");
    weft_stats st;
    tu_stats(rt, &st);
    assert_true(st.thread_start_errors >= 1);
    assert_int_equal(weft_rt_destroy(rt), 0);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_shutdown_completes(void **state) {
  (void)state;
  tu_phase("shutdown: started while a start fails slowly");
  atomic_store(&held, 0);
  atomic_store(&go, 0);
  pthread_t f;
  atomic_store(&hold_armed, 1);
  weft_rt *rt = setup(2, &f);
  wait_flag(&held, "the eager thread held before its park");
  tu_assert_rc(weft_post_rt(rt, w2, NULL), 0);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_NOWAIT), 0);
  atomic_store(&release_create, 1);
  tu_thread_join(f, "failing poster");
  atomic_store(&go, 1);
  tu_assert_rc(weft_rt_wait(rt, (uint64_t)TU_WAIT_S * 1000000000u), 0);
  assert_int_equal(atomic_load(&g_ran_w), 1);
  assert_int_equal(atomic_load(&g_ran_w2), 1);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------- timers of a shard never started
 */

#define NT 32

typedef struct trec {
  weft_strand *s;
  weft_timer *t;
  atomic_uint fired, bad;
} trec;

static trec g_tr[NT];
static tu_count g_fired;

static void on_timer(void *arg, int status, uint64_t missed) {
  trec *r = arg;
  (void)missed;
  if (status != 0 || weft_strand_current() != r->s)
    atomic_fetch_add(&r->bad, 1);
  atomic_fetch_add(&r->fired, 1);
  atomic_fetch_add(&g_fired, 1);
}

static void *start_timers(void *arg) {
  (void)arg;
  for (unsigned i = 0; i < NT; i++)
    TU_CHECK(weft_timer_start(g_tr[i].t, 2000000 + 100000 * (i % 8), 0,
                              on_timer, &g_tr[i]) == 0);
  return NULL;
}

/* Timers homed on shards whose thread cannot be started (every start of a
 * runtime thread fails) still fire, exactly once, on their strands: the
 * started thread wakes for their deadlines and serves them. */
static void test_orphan_timers(void **state) {
  (void)state;
  tu_phase("orphan timers: shards whose thread could not be started");
  weft_rt *rt = create_one_eager(4);
  atomic_store(&g_fired, 0);
  for (unsigned i = 0; i < NT; i++) {
    atomic_store(&g_tr[i].fired, 0);
    atomic_store(&g_tr[i].bad, 0);
    tu_strand_create(rt, &g_tr[i].s);
    tu_assert_rc(weft_timer_create(rt, g_tr[i].s, &g_tr[i].t), 0);
  }
  atomic_store(&fail_all, 1);
  pthread_t th;
  tu_thread_start(&th, start_timers, NULL);
  tu_thread_join(th, "timer starter");
  tu_wait_count(&g_fired, NT, "every timer fired");
  atomic_store(&fail_all, 0);
  weft_stats st;
  tu_stats(rt, &st);
  /* 32 strands hashed over 4 shards: some on the 3 never started. */
  assert_true(st.thread_start_errors >= 1);
  assert_int_equal(st.threads, 1);
  for (unsigned i = 0; i < NT; i++) {
    assert_int_equal(atomic_load(&g_tr[i].fired), 1);
    assert_int_equal(atomic_load(&g_tr[i].bad), 0);
    weft_timer_destroy(g_tr[i].t);
    weft_strand_release(g_tr[i].s);
  }
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------------- a socket */

typedef struct lis {
  weft_rt *rt;
  int rc;
} lis;

static void on_accept(void *arg, weft_tcp *conn) {
  (void)arg;
  weft_tcp_close(conn, 0);
}

static void *listen_failing(void *arg) {
  lis *l = arg;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *out = NULL;
  l->rc = weft_tcp_listen(l->rt, (struct sockaddr *)&a, sizeof a, NULL,
                          on_accept, NULL, &out);
  return NULL;
}

/* The first socket needs every shard's thread: it fails with -EAGAIN
 * while one cannot be started, and a later one, with threads to be had,
 * starts them and succeeds. */
static void test_socket_needs_all(void **state) {
  (void)state;
  tu_phase("socket: the first one needs every thread");
  weft_rt *rt = create_one_eager(4);
  lis l = {.rt = rt};
  atomic_store(&fail_all, 1);
  pthread_t th;
  tu_thread_start(&th, listen_failing, &l);
  tu_thread_join(th, "failing listener");
  atomic_store(&fail_all, 0);
  if (l.rc == -ENOTSUP) { /* WEFT_BACKEND=none: no sockets at all */
    assert_int_equal(weft_rt_destroy(rt), 0);
    return;
  }
  assert_int_equal(l.rc, -EAGAIN);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.threads, 1);
  assert_true(st.thread_start_errors >= 1);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *out = NULL;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL,
                               on_accept, NULL, &out),
               0);
  tu_stats(rt, &st);
  assert_int_equal(st.threads, 4);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lost_post),
      cmocka_unit_test(test_shutdown_completes),
      cmocka_unit_test(test_orphan_timers),
      cmocka_unit_test(test_socket_needs_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
