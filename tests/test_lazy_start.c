/*
 * test_lazy_start: shards whose threads weft_rt_create did not start
 * (weft_config.eager_workers) get them when first needed, and a runtime
 * with such shards keeps every promise of one without.
 *
 *  - counts: eager_workers threads after create (0: one per CPU, at most
 *    workers; above workers: all); with no monitor (no spares), as many
 *    handlers as workers can be inside at once, blocked together, which
 *    takes every shard's thread: posts from outside start them.
 *  - started threads have weft_rt_create's caller's CPU affinity and the
 *    runtime's signal mask, whichever thread needed them.
 *  - timers homed on shards without a thread fire exactly once, on their
 *    strands, started from outside and from a handler.
 *  - the first socket starts every shard's thread (each serves sockets).
 *  - a start that fails (a thread that may not create threads needs one)
 *    is counted and undone: the work waits, is not lost, and runs once a
 *    thread can be started.
 *  - stress (scaled): foreign threads post and start timers in bursts
 *    into runtimes with one eager thread of 8, shut down at once in both
 *    modes: every post and timer is accounted exactly once (run, or
 *    cancelled), and runtimes that never needed a thread shut down and
 *    destroy with their shards still dormant.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static unsigned cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return 1;
  return (unsigned)CPU_COUNT(&set);
}

/* A handler preempted on these shared CPUs can look stalled: counted, not
 * printed. */
static tu_count g_stalls;
static void on_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  atomic_fetch_add(&g_stalls, 1);
}

static weft_rt *create(unsigned workers, unsigned eager, unsigned flags) {
  weft_config c;
  weft_config_init(&c);
  c.on_stall = on_stall;
  c.workers = workers;
  c.eager_workers = eager;
  c.flags = flags;
  weft_rt *rt = NULL;
  int rc = weft_rt_create(&rt, &c);
  if (rc != 0)
    fail_msg("weft_rt_create(workers %u, eager %u): %s", workers, eager,
             weft_strerror(rc));
  return rt;
}

static unsigned threads_of(weft_rt *rt) {
  weft_stats st;
  tu_stats(rt, &st);
  return st.threads;
}

/* ----------------------------------------------------------------- counts */

static void test_counts(void **state) {
  (void)state;
  const unsigned w = 8;
  unsigned want_default = cpus() < w ? cpus() : w;
  struct {
    unsigned eager, want;
  } cases[] = {{1, 1}, {3, 3}, {0, want_default}, {w, w}, {5 * w, w}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    weft_rt *rt = create(w, cases[i].eager, WEFT_CONFIG_NO_MONITOR);
    assert_int_equal(threads_of(rt), cases[i].want);
    assert_int_equal(weft_rt_workers(rt), w);
    assert_int_equal(weft_rt_destroy(rt), 0);
  }

  /* Every shard's thread, blocked in a handler at once: w gated handlers
   * on w strands, posted from outside one after the other, each once the
   * one before is inside, with one thread started. Each post finds every
   * started thread blocked and none asleep: it starts one. (Without a
   * monitor nothing else could take it: no spare, no handoff.) */
  tu_phase("counts: w handlers blocked at once");
  weft_rt *rt = create(w, 1, WEFT_CONFIG_NO_MONITOR);
  tu_gate g;
  tu_gate_init(&g);
  weft_strand *s[8];
  for (unsigned i = 0; i < w; i++) {
    tu_strand_create(rt, &s[i]);
    tu_assert_rc(weft_post(s[i], tu_gate_handler, &g), 0);
    tu_wait_count(&g.entered, i + 1, "the gated handler just posted inside");
  }
  assert_int_equal(threads_of(rt), w);
  tu_gate_open(&g);
  tu_wait_count(&g.passed, w, "gated handlers returned");
  for (unsigned i = 0; i < w; i++)
    weft_strand_release(s[i]);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.total.handlers_run, w);
  assert_int_equal(st.thread_start_errors, 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------- affinity, signal mask */

typedef struct seen {
  cpu_set_t cpus;
  bool sigint_blocked;
  tu_gate *g;
} seen;

/* Records the thread's affinity and mask, then blocks in the gate. */
static void look(void *arg) {
  seen *v = arg;
  sigset_t m;
  pthread_sigmask(SIG_BLOCK, NULL, &m);
  v->sigint_blocked = sigismember(&m, SIGINT) == 1;
  sched_getaffinity(0, sizeof v->cpus, &v->cpus);
  tu_gate_pass(v->g);
}

typedef struct poster {
  weft_strand *s;
  seen *v;
  int cpu;
} poster;

/* Posts from a foreign thread pinned to another CPU, SIGINT open. */
static void *poster_main(void *arg) {
  poster *p = arg;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(p->cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
  sigset_t m;
  sigemptyset(&m);
  sigaddset(&m, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &m, NULL);
  TU_CHECK(weft_post(p->s, look, p->v) == 0);
  return NULL;
}

/* Two handlers blocked at once on a runtime of two shards, one eager:
 * one of them runs on the thread started lazily, for a poster whose
 * affinity and mask differ from weft_rt_create's caller's. Both threads
 * must have the caller's affinity and SIGINT blocked. */
static void test_inherits(void **state) {
  (void)state;
  cpu_set_t all, mine;
  sched_getaffinity(0, sizeof all, &all);
  int c0 = -1, c1 = -1;
  for (int c = 0; c < CPU_SETSIZE && c1 < 0; c++)
    if (CPU_ISSET(c, &all)) {
      if (c0 < 0)
        c0 = c;
      else
        c1 = c;
    }
  if (c1 < 0)
    c1 = c0; /* one CPU: the mask is checked, the affinity trivially */
  CPU_ZERO(&mine);
  CPU_SET(c0, &mine);
  assert_int_equal(sched_setaffinity(0, sizeof mine, &mine), 0);
  weft_rt *rt = create(2, 1, WEFT_CONFIG_NO_MONITOR);
  assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);

  tu_gate g;
  tu_gate_init(&g);
  seen v[2];
  weft_strand *s[2];
  for (unsigned i = 0; i < 2; i++) {
    v[i] = (seen){.sigint_blocked = false, .g = &g};
    tu_strand_create(rt, &s[i]);
    poster p = {.s = s[i], .v = &v[i], .cpu = c1};
    pthread_t th;
    tu_thread_start(&th, poster_main, &p);
    tu_thread_join(th, "poster");
    tu_wait_count(&g.entered, i + 1, "the handler just posted inside");
  }
  assert_int_equal(threads_of(rt), 2);
  for (unsigned i = 0; i < 2; i++) {
    assert_true(v[i].sigint_blocked);
    assert_true(CPU_EQUAL(&v[i].cpus, &mine));
  }
  tu_gate_open(&g);
  for (unsigned i = 0; i < 2; i++)
    weft_strand_release(s[i]);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------------------- timers */

#define NTSTRANDS 64

typedef struct trec {
  weft_strand *s;
  weft_timer *t;
  atomic_uint fired, bad;
} trec;

static trec g_tr[2 * NTSTRANDS];
static tu_count g_tfired;

static void on_timer(void *arg, int status, uint64_t missed) {
  trec *r = arg;
  (void)missed;
  if (status != 0 || weft_strand_current() != r->s)
    atomic_fetch_add(&r->bad, 1);
  atomic_fetch_add(&r->fired, 1);
  atomic_fetch_add(&g_tfired, 1);
}

/* On a strand of the eager shard's thread: starts the second half. */
static void start_from_handler(void *arg) {
  (void)arg;
  for (unsigned i = NTSTRANDS; i < 2 * NTSTRANDS; i++)
    TU_CHECK(weft_timer_start(g_tr[i].t, 1000000 + 20000 * (i % 50), 0,
                              on_timer, &g_tr[i]) == 0);
}

static void test_timers(void **state) {
  (void)state;
  const unsigned w = 16;
  weft_rt *rt = create(w, 1, WEFT_CONFIG_NO_MONITOR);
  atomic_store(&g_tfired, 0);
  for (unsigned i = 0; i < 2 * NTSTRANDS; i++) {
    trec *r = &g_tr[i];
    atomic_store(&r->fired, 0);
    atomic_store(&r->bad, 0);
    tu_strand_create(rt, &r->s);
    tu_assert_rc(weft_timer_create(rt, r->s, &r->t), 0);
  }
  for (unsigned i = 0; i < NTSTRANDS; i++)
    tu_assert_rc(weft_timer_start(g_tr[i].t, 1000000 + 20000 * (i % 50), 0,
                                  on_timer, &g_tr[i]),
                 0);
  weft_strand *h;
  tu_strand_create(rt, &h);
  tu_assert_rc(weft_post(h, start_from_handler, NULL), 0);
  tu_wait_count(&g_tfired, 2 * NTSTRANDS, "every timer fired");
  for (unsigned i = 0; i < 2 * NTSTRANDS; i++) {
    assert_int_equal(atomic_load(&g_tr[i].fired), 1);
    assert_int_equal(atomic_load(&g_tr[i].bad), 0);
  }
  /* 128 strands hashed over 16 shards: more than the eager one's. */
  assert_true(threads_of(rt) > 1);
  for (unsigned i = 0; i < 2 * NTSTRANDS; i++) {
    weft_timer_destroy(g_tr[i].t);
    weft_strand_release(g_tr[i].s);
  }
  weft_strand_release(h);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------------------- socket */

static void on_accept(void *arg, weft_tcp *conn) {
  (void)arg;
  weft_tcp_close(conn, 0);
}

static void test_first_socket(void **state) {
  (void)state;
  const unsigned w = 4;
  weft_rt *rt = create(w, 1, WEFT_CONFIG_NO_MONITOR);
  assert_int_equal(threads_of(rt), 1);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *l = NULL;
  int rc = weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof a, NULL, on_accept,
                           NULL, &l);
  if (rc == -ENOTSUP) {
    /* WEFT_BACKEND=none: no sockets, and nothing to start for them. */
    assert_int_equal(threads_of(rt), 1);
  } else {
    assert_int_equal(rc, 0);
    assert_int_equal(threads_of(rt), w);
  }
  assert_int_equal(weft_rt_destroy(rt), 0); /* closes the listener */
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------- a failed start */

/* The calling thread alone (raw syscalls act on one thread) gets a real
 * uid of nobody, so that RLIMIT_NPROC counts for its clones, and loses
 * the two capabilities that bypass it; its euid stays 0, so it can take
 * all of that back. */
static int limit_this_thread(bool on) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) != 0)
    return -errno;
  const unsigned caps[] = {CAP_SYS_ADMIN, CAP_SYS_RESOURCE};
  if (!on && syscall(SYS_setresuid, 0, -1, -1) != 0)
    return -errno;
  for (unsigned i = 0; i < 2; i++) {
    uint32_t bit = 1u << (caps[i] % 32);
    if (on)
      d[caps[i] / 32].effective &= ~bit;
    else
      d[caps[i] / 32].effective |= d[caps[i] / 32].permitted & bit;
  }
  if (syscall(SYS_capset, &h, d) != 0)
    return -errno;
  if (on && syscall(SYS_setresuid, 65534, -1, -1) != 0)
    return -errno;
  return 0;
}

typedef struct failer {
  weft_rt *rt;
  weft_strand *s;
  tu_gate *g;
  int rc;
} failer;

/* With RLIMIT_NPROC at 0 for this thread: a post that needs a new thread
 * cannot start one. */
static void *failer_main(void *arg) {
  failer *f = arg;
  struct rlimit old, zero;
  getrlimit(RLIMIT_NPROC, &old);
  zero = (struct rlimit){.rlim_cur = 0, .rlim_max = old.rlim_max};
  f->rc = limit_this_thread(true);
  if (f->rc == 0 && setrlimit(RLIMIT_NPROC, &zero) != 0)
    f->rc = -errno;
  if (f->rc == 0)
    TU_CHECK(weft_post(f->s, tu_gate_handler, f->g) == 0);
  setrlimit(RLIMIT_NPROC, &old);
  int r = limit_this_thread(false);
  if (f->rc == 0)
    f->rc = r;
  return NULL;
}

/* The one started thread is blocked; a post from a thread that may not
 * create threads finds no thread to take it: the start fails, is counted,
 * and is undone (the handler waits in the queue, not lost, and the
 * runtime does not count a thread that does not exist). The next post,
 * from a thread that may, starts threads for both. */
static void test_start_failure(void **state) {
  (void)state;
  if (geteuid() != 0)
    skip(); /* needs CAP_SETUID to give one thread another real uid */
  const unsigned w = 8;
  weft_rt *rt = create(w, 1, WEFT_CONFIG_NO_MONITOR);
  tu_gate g;
  tu_gate_init(&g);
  weft_strand *s[8];
  for (unsigned i = 0; i < w; i++)
    tu_strand_create(rt, &s[i]);
  /* Block every started thread (one, or more if a post came before the
   * eager one parked and so started another). */
  unsigned n = 0;
  do {
    tu_assert_rc(weft_post(s[n], tu_gate_handler, &g), 0);
    n++;
    tu_wait_count(&g.entered, n, "the gated handler just posted inside");
  } while (n < threads_of(rt));
  assert_true(n + 2 <= w);
  failer f = {.rt = rt, .s = s[n], .g = &g};
  pthread_t th;
  tu_thread_start(&th, failer_main, &f);
  tu_thread_join(th, "the thread that may not create threads");
  assert_int_equal(f.rc, 0);
  weft_stats st;
  tu_stats(rt, &st);
  assert_true(st.thread_start_errors >= 1);
  assert_int_equal(st.threads, n);
  assert_int_equal(atomic_load(&g.entered), n);
  tu_assert_rc(weft_post(s[n + 1], tu_gate_handler, &g), 0);
  tu_wait_count(&g.entered, n + 2, "both later gated handlers inside");
  tu_gate_open(&g);
  for (unsigned i = 0; i < w; i++)
    weft_strand_release(s[i]);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_stats(rt, &st);
  assert_int_equal(st.total.handlers_run, n + 2);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------------------- stress */

#define NFOREIGN 3

typedef struct tally {
  tu_count ran, cancelled, accepted;
  tu_count t_fired, t_cancelled, t_started;
} tally;

typedef struct fctx {
  weft_rt *rt;
  weft_strand *s[4];
  weft_timer *t[4];
  tally *a;
  tu_barrier *b;
  unsigned n;
} fctx;

static void on_run(void *arg) { atomic_fetch_add(&((tally *)arg)->ran, 1); }
static void on_cancel(void *arg) {
  atomic_fetch_add(&((tally *)arg)->cancelled, 1);
}
static void on_stress_timer(void *arg, int status, uint64_t missed) {
  (void)missed;
  tally *a = arg;
  if (status == 0)
    atomic_fetch_add(&a->t_fired, 1);
  else
    atomic_fetch_add(&a->t_cancelled, 1);
}

static void *foreign_main(void *arg) {
  fctx *f = arg;
  tu_barrier_wait(f->b);
  for (unsigned i = 0; i < f->n; i++) {
    weft_strand *s = f->s[i % 4];
    if (weft_post_ex(s, on_run, on_cancel, f->a) == 0)
      atomic_fetch_add(&f->a->accepted, 1);
    if (i < 4 &&
        weft_timer_start(f->t[i], 20000 * i, 0, on_stress_timer, f->a) == 0)
      atomic_fetch_add(&f->a->t_started, 1);
  }
  return NULL;
}

static void stress_round(unsigned round) {
  const unsigned w = 8;
  int how = (round & 1) ? WEFT_SHUTDOWN_CANCEL : WEFT_SHUTDOWN_DRAIN;
  weft_rt *rt = create(w, 1, (round & 2) ? WEFT_CONFIG_NO_MONITOR : 0);
  tally a;
  memset(&a, 0, sizeof a);
  tu_barrier b;
  tu_barrier_init(&b, NFOREIGN + 1);
  fctx f[NFOREIGN];
  pthread_t th[NFOREIGN];
  for (unsigned k = 0; k < NFOREIGN; k++) {
    f[k] = (fctx){.rt = rt, .a = &a, .b = &b, .n = 1 + round % 40};
    for (unsigned j = 0; j < 4; j++) {
      tu_strand_create(rt, &f[k].s[j]);
      tu_assert_rc(weft_timer_create(rt, f[k].s[j], &f[k].t[j]), 0);
    }
    tu_thread_start(&th[k], foreign_main, &f[k]);
  }
  tu_barrier_wait(&b);
  if (round % 3 == 0)
    sched_yield();
  assert_int_equal(weft_rt_shutdown(rt, how), 0);
  for (unsigned k = 0; k < NFOREIGN; k++)
    tu_thread_join(th[k], "foreign poster");
  /* Every accepted post ran or (CANCEL) was cancelled, exactly once; every
   * started timer fired or was cancelled, exactly once. */
  uint64_t ran = atomic_load(&a.ran), can = atomic_load(&a.cancelled);
  assert_int_equal(ran + can, atomic_load(&a.accepted));
  if (how == WEFT_SHUTDOWN_DRAIN)
    assert_int_equal(can, 0);
  assert_int_equal(atomic_load(&a.t_fired) + atomic_load(&a.t_cancelled),
                   atomic_load(&a.t_started));
  for (unsigned k = 0; k < NFOREIGN; k++)
    for (unsigned j = 0; j < 4; j++) {
      weft_timer_destroy(f[k].t[j]);
      weft_strand_release(f[k].s[j]);
    }
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_barrier_destroy(&b);
}

static void test_stress(void **state) {
  (void)state;
  unsigned rounds = (unsigned)TU_SCALED(400, 24);
  for (unsigned r = 0; r < rounds; r++) {
    tu_phase("stress: a round of posts and timers against shutdown");
    stress_round(r);
  }
  /* Never needed: the dormant shards stay so through destroy. */
  for (unsigned r = 0; r < rounds; r++) {
    tu_phase("stress: create and destroy, nothing posted");
    weft_rt *rt = create(32, 1, 0);
    assert_int_equal(weft_rt_destroy(rt), 0);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counts),        cmocka_unit_test(test_inherits),
      cmocka_unit_test(test_timers),        cmocka_unit_test(test_first_socket),
      cmocka_unit_test(test_start_failure), cmocka_unit_test(test_stress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
