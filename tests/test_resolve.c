/*
 * test_resolve: weft_resolve and weft_resolve_cancel.
 *
 * getaddrinfo is wrapped at link time (-Wl,--wrap=getaddrinfo): names
 * under ".hang.test" block until the test opens a gate (a name server that
 * does not answer), "noname.test", "again.test", "fail.test" and
 * "emfile.test" return EAI_NONAME, EAI_AGAIN, EAI_FAIL and EAI_SYSTEM with
 * EMFILE; every other name goes to the real getaddrinfo (localhost and
 * numeric addresses: no network needed).
 *
 *  - Results: "localhost" port "80" as IPv4 gives 127.0.0.1:80; "::1"
 *    numeric gives ::1; a service alone gives the wildcard address; fn
 *    runs once, on the strand given, or on a worker with strand NULL.
 *  - Errors: each EAI_* code comes as its WEFT_EAI_* or errno, with a
 *    weft_strerror text; bad hints and arguments fail at the call.
 *  - Isolation: with resolve_threads 4, 64 lookups that hang hold 4 pool
 *    threads and no more; meanwhile 200 weft_blocking jobs all complete,
 *    and a numeric lookup queued behind them waits (the bound is real).
 *  - Cancel: a queued lookup and a running one both get -ECANCELED, at
 *    once, exactly once; when the hung lookup ends its result is dropped
 *    (no second call, and nothing posted to the lookup's strand, which
 *    is released as soon as fn has run); a cancel from inside fn, which the
 * result won, gives -EALREADY.
 *  - A strand released while its lookup hangs still gets the result.
 *  - Shutdown (CANCEL) with lookups queued behind hung ones: every fn runs
 *    exactly once (-ECANCELED for the queued) once the gate opens.
 */
#include "fake_gai.h"

#define NWORKERS 2

/* ------------------------------------------------------- the wrapped call */

int __wrap_getaddrinfo(const char *node, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res) {
  if (fg_hang(node))
    node = "127.0.0.1";
  if (node && strcmp(node, "noname.test") == 0)
    return EAI_NONAME;
  if (node && strcmp(node, "again.test") == 0)
    return EAI_AGAIN;
  if (node && strcmp(node, "fail.test") == 0)
    return EAI_FAIL;
  if (node && strcmp(node, "emfile.test") == 0) {
    errno = EMFILE;
    return EAI_SYSTEM;
  }
  return __real_getaddrinfo(node, service, hints, res);
}

/* --------------------------------------------------------------- results */

typedef struct res {
  weft_strand *want_strand;
  int status;
  unsigned calls;
  bool on_strand;
  struct sockaddr_storage addr; /* the first address */
  tu_event ev;
} res;

static void res_init(res *r, weft_strand *s) {
  memset(r, 0, sizeof *r);
  r->want_strand = s;
  r->status = 1;
  tu_event_init(&r->ev);
}

static void on_result(void *arg, int status, struct addrinfo *ai) {
  res *r = arg;
  r->calls++;
  r->status = status;
  r->on_strand = r->want_strand ? weft_strand_current() == r->want_strand
                                : weft_strand_current() == NULL;
  if (status == 0) {
    TU_CHECK(ai != NULL);
    if (ai)
      memcpy(&r->addr, ai->ai_addr, ai->ai_addrlen);
  } else {
    TU_CHECK(ai == NULL);
  }
  tu_event_add(&r->ev, 1);
}

static weft_rt *rt_make(unsigned resolve_threads) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = NWORKERS;
  cfg.resolve_threads = resolve_threads;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

static void rt_end(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static void test_results(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  res r;
  res_init(&r, s);
  tu_assert_rc(
      weft_resolve(rt, s, "localhost", "80", &hints, on_result, &r, NULL), 0);
  tu_event_wait(&r.ev, 1, "the localhost lookup");
  tu_assert_rc(r.status, 0);
  assert_true(r.on_strand);
  struct sockaddr_in *in = (struct sockaddr_in *)&r.addr;
  assert_int_equal(in->sin_family, AF_INET);
  assert_int_equal(ntohs(in->sin_port), 80);
  assert_int_equal(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);

  res r6;
  res_init(&r6, NULL);
  struct addrinfo h6 = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                        .ai_socktype = SOCK_STREAM};
  weft_lookup *lk = NULL;
  tu_assert_rc(weft_resolve(rt, NULL, "::1", "443", &h6, on_result, &r6, &lk),
               0);
  assert_non_null(lk);
  tu_event_wait(&r6.ev, 1, "the ::1 lookup");
  tu_assert_rc(r6.status, 0);
  assert_true(r6.on_strand); /* on a worker, on no strand */
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&r6.addr;
  assert_int_equal(in6->sin6_family, AF_INET6);
  assert_int_equal(ntohs(in6->sin6_port), 443);
  assert_true(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));

  res rp;
  res_init(&rp, s);
  struct addrinfo hp = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
                        .ai_family = AF_INET,
                        .ai_socktype = SOCK_STREAM};
  tu_assert_rc(weft_resolve(rt, s, NULL, "8080", &hp, on_result, &rp, NULL), 0);
  tu_event_wait(&rp.ev, 1, "the service-only lookup");
  tu_assert_rc(rp.status, 0);
  in = (struct sockaddr_in *)&rp.addr;
  assert_int_equal(ntohs(in->sin_port), 8080);
  assert_int_equal(in->sin_addr.s_addr, htonl(INADDR_ANY));

  /* Errors, as the wrapper makes them. */
  static const struct {
    const char *host;
    int want;
  } errs[] = {{"noname.test", WEFT_EAI_NONAME},
              {"again.test", WEFT_EAI_AGAIN},
              {"fail.test", WEFT_EAI_FAIL},
              {"emfile.test", -EMFILE}};
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
    res re;
    res_init(&re, s);
    tu_assert_rc(
        weft_resolve(rt, s, errs[i].host, NULL, NULL, on_result, &re, NULL), 0);
    tu_event_wait(&re.ev, 1, "a failing lookup");
    tu_assert_rc(re.status, errs[i].want);
    assert_int_equal(re.calls, 1);
    tu_event_destroy(&re.ev);
  }
  assert_string_equal(weft_strerror(WEFT_EAI_NONAME),
                      "Name or service not known");
  assert_string_equal(weft_strerror(WEFT_EAI_AGAIN),
                      "Temporary failure in name resolution");
  assert_string_equal(weft_strerror(WEFT_EAI_FAIL),
                      "Non-recoverable failure in name resolution");

  /* Bad hints reach getaddrinfo and come back as -EINVAL. */
  res rb;
  res_init(&rb, s);
  struct addrinfo bad = {.ai_family = 12345};
  tu_assert_rc(
      weft_resolve(rt, s, "localhost", NULL, &bad, on_result, &rb, NULL), 0);
  tu_event_wait(&rb.ev, 1, "a lookup with a bad family");
  tu_assert_rc(rb.status, -EINVAL);

  /* Bad arguments: refused at the call. */
  struct addrinfo filled = {.ai_addrlen = 4};
  weft_rt *other = rt_make(0);
  weft_strand *os;
  tu_strand_create(other, &os);
  tu_assert_rc(weft_resolve(NULL, s, "a", NULL, NULL, on_result, &r, NULL),
               -EINVAL);
  tu_assert_rc(weft_resolve(rt, s, "a", NULL, NULL, NULL, &r, NULL), -EINVAL);
  tu_assert_rc(weft_resolve(rt, s, NULL, NULL, NULL, on_result, &r, NULL),
               -EINVAL);
  tu_assert_rc(weft_resolve(rt, s, "a", NULL, &filled, on_result, &r, NULL),
               -EINVAL);
  tu_assert_rc(weft_resolve(rt, os, "a", NULL, NULL, on_result, &r, NULL),
               -EXDEV);
  tu_assert_rc(weft_resolve_cancel(NULL), -EINVAL);
  weft_strand_release(os);
  rt_end(other);
  weft_strand_release(s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(
      weft_resolve(rt, NULL, "localhost", NULL, NULL, on_result, &r, NULL),
      -ESHUTDOWN);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_int_equal(r.calls, 1);
  tu_event_destroy(&r.ev);
  tu_event_destroy(&r6.ev);
  tu_event_destroy(&rp.ev);
  tu_event_destroy(&rb.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------------- isolation */

#define NHANG 64
#define NJOBS 200

static long quick_job(void *arg) {
  (void)arg;
  return 7;
}

static void job_done(void *arg, long result) {
  TU_CHECK(result == 7);
  tu_event_add(arg, 1);
}

static void test_isolation(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make(4);
  static res hung[NHANG];
  char name[64];
  for (int i = 0; i < NHANG; i++) {
    res_init(&hung[i], NULL);
    snprintf(name, sizeof name, "h%d.hang.test", i);
    tu_assert_rc(
        weft_resolve(rt, NULL, name, "53", NULL, on_result, &hung[i], NULL), 0);
  }
  fg_wait_hung(4);
  /* The blocking pool is untouched: every job runs while lookups hang. */
  tu_event jobs;
  tu_event_init(&jobs);
  for (int i = 0; i < NJOBS; i++)
    tu_assert_rc(weft_blocking(rt, quick_job, &jobs, NULL, job_done, NULL), 0);
  tu_event_wait(&jobs, NJOBS, "blocking jobs while 64 lookups hang");
  /* A lookup needing no server still waits its turn behind the hung ones:
   * the bound holds (4 running, never more). */
  res quick;
  res_init(&quick, NULL);
  tu_assert_rc(
      weft_resolve(rt, NULL, "127.0.0.1", NULL, NULL, on_result, &quick, NULL),
      0);
  tu_sleep_ms(20);
  assert_int_equal(tu_event_get(&quick.ev), 0);
  assert_int_equal(fg_hung_most(), 4);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.blocking_done, NJOBS);

  fg_gate_open();
  for (int i = 0; i < NHANG; i++) {
    tu_event_wait(&hung[i].ev, 1, "a hung lookup, once the gate opened");
    tu_assert_rc(hung[i].status, 0);
  }
  tu_event_wait(&quick.ev, 1, "the quick lookup");
  rt_end(rt);
  for (int i = 0; i < NHANG; i++) {
    assert_int_equal(hung[i].calls, 1);
    tu_event_destroy(&hung[i].ev);
  }
  tu_event_destroy(&quick.ev);
  tu_event_destroy(&jobs);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------------------------------- cancel */

typedef struct cancel_ctx {
  weft_lookup *lk;
  int rc;
} cancel_ctx;

static void cancel_on_strand(void *arg) {
  cancel_ctx *c = arg;
  c->rc = weft_resolve_cancel(c->lk);
}

static weft_lookup *g_inside;
static int g_inside_rc = 1;

static void cancel_inside(void *arg, int status, struct addrinfo *ai) {
  g_inside_rc = weft_resolve_cancel(g_inside);
  on_result(arg, status, ai);
}

static void test_cancel(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make(1);
  weft_strand *s, *s2;
  tu_strand_create(rt, &s);
  tu_strand_create(rt, &s2);
  res running, queued;
  res_init(&running, s2);
  res_init(&queued, s);
  weft_lookup *lr, *lq;
  tu_assert_rc(
      weft_resolve(rt, s2, "r.hang.test", NULL, NULL, on_result, &running, &lr),
      0);
  fg_wait_hung(1);
  tu_assert_rc(
      weft_resolve(rt, s, "localhost", NULL, NULL, on_result, &queued, &lq), 0);
  /* Queued: cancelled from the test thread. */
  tu_assert_rc(weft_resolve_cancel(lq), 0);
  tu_event_wait(&queued.ev, 1, "the queued lookup's -ECANCELED");
  tu_assert_rc(queued.status, -ECANCELED);
  assert_true(queued.on_strand);
  /* Running: cancelled on its strand, answered while it still hangs. */
  cancel_ctx cc = {lr, 1};
  tu_on_strand(s2, cancel_on_strand, &cc);
  tu_assert_rc(cc.rc, 0);
  tu_event_wait(&running.ev, 1, "the running lookup's -ECANCELED");
  tu_assert_rc(running.status, -ECANCELED);
  /* Told -ECANCELED, the user may release the strand: the lookup that
   * ends later must not post to it (a debug build aborts on a post to a
   * reclaimed strand). */
  weft_strand_release(s2);
  /* A cancel from inside fn, which the result won: -EALREADY. The gate
   * holds the strand until the handle is stored. */
  fg_gate_open();
  res later;
  res_init(&later, s);
  tu_gate g;
  tu_gate_init(&g);
  tu_assert_rc(weft_post(s, tu_gate_handler, &g), 0);
  tu_wait_count(&g.entered, 1, "the gate handler on the strand");
  tu_assert_rc(weft_resolve(rt, s, "127.0.0.1", NULL, NULL, cancel_inside,
                            &later, &g_inside),
               0);
  tu_gate_open(&g);
  tu_event_wait(&later.ev, 1, "the later lookup");
  rt_end(rt);
  tu_assert_rc(later.status, 0);
  tu_assert_rc(g_inside_rc, -EALREADY);
  assert_int_equal(running.calls, 1);
  assert_int_equal(queued.calls, 1);
  assert_int_equal(later.calls, 1);
  tu_gate_destroy(&g);
  tu_event_destroy(&running.ev);
  tu_event_destroy(&queued.ev);
  tu_event_destroy(&later.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A lookup holds its strand: released while the name server hangs, the
 * strand still takes the result (no post to a reclaimed strand). */
static void test_release_pending(void **state) {
  (void)state;
  tu_reset_async_errors();
  fg_gate_reset();
  weft_rt *rt = rt_make(1);
  weft_strand *s;
  tu_strand_create(rt, &s);
  res r;
  res_init(&r, s);
  tu_assert_rc(
      weft_resolve(rt, s, "p.hang.test", "80", NULL, on_result, &r, NULL), 0);
  fg_wait_hung(1);
  weft_strand_release(s);
  fg_gate_open();
  tu_event_wait(&r.ev, 1, "the lookup on the released strand");
  rt_end(rt);
  assert_int_equal(r.calls, 1);
  tu_assert_rc(r.status, 0);
  assert_true(r.on_strand);
  tu_event_destroy(&r.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------------- shutdown */

#define NQUEUED 16

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
  weft_rt *rt = rt_make(2);
  static res r[2 + NQUEUED];
  for (int i = 0; i < 2 + NQUEUED; i++) {
    res_init(&r[i], NULL);
    tu_assert_rc(weft_resolve(rt, NULL, i < 2 ? "x.hang.test" : "localhost",
                              NULL, NULL, on_result, &r[i], NULL),
                 0);
    if (i == 1)
      fg_wait_hung(2);
  }
  pthread_t t;
  tu_thread_start(&t, open_later, NULL);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_thread_join(t, "the gate opener");
  for (int i = 0; i < 2 + NQUEUED; i++) {
    assert_int_equal(r[i].calls, 1);
    if (i < 2)
      tu_assert_rc(r[i].status, 0);
    else
      tu_assert_rc(r[i].status, -ECANCELED);
    tu_event_destroy(&r[i].ev);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_results),  cmocka_unit_test(test_isolation),
      cmocka_unit_test(test_cancel),   cmocka_unit_test(test_release_pending),
      cmocka_unit_test(test_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
