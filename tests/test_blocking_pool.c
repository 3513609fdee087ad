/*
 * test_blocking_pool: weft_blocking runs blocking calls off the shards'
 * threads, bounded by blocking_threads and blocking_queue, and calls each
 * accepted job's done exactly once, on its done strand.
 *
 *  - blocking_threads=4, blocking_queue=16: 40 jobs that sleep 20 ms and
 *    then wait on a gate the test opens at the end. Nothing can finish
 *    before the gate opens, so the accepted ones are between 16 (the queue)
 *    and 20 (queue + threads) and the rest get -EAGAIN; the refused ones'
 *    work never runs. work runs outside the runtime (no current strand or
 *    runtime).
 *  - While the pool is saturated (4 jobs provably inside work), 10 strands
 *    run chains of handlers and a timer fires, before any job finishes.
 *  - weft_blocking_cancel: on a queued job 0, and its done gets -ECANCELED;
 *    again on it, on a running job, on a finished job and on an id never
 *    issued -EALREADY; NULL rt -EINVAL.
 *  - weft_blocking: -EINVAL for NULL rt/work/done, -EXDEV for a done strand
 *    of another runtime, -EBADF for a released one, -ESHUTDOWN after
 *    shutdown.
 *  - A done strand released while its job's work runs still gets done,
 *    once (the job holds it); many short jobs whose strands are released
 *    as soon as they are accepted each get done once, on a strand.
 *  - Every accepted job's done runs exactly once, with the job's result (or
 *    -ECANCELED), on the given strand (weft_strand_current() == it), or on
 *    a worker when none was given; stats.blocking_done counts the done
 *    calls.
 *  - Many short jobs from two threads (scaled): exactly once each.
 *  - The stats: while saturated, blocking_threads and blocking_running are
 *    the pool's size and blocking_queued the queue's; at the end nothing
 *    waits or runs, and blocking_busy_ns holds at least the 20 ms each job
 *    slept in work.
 *  - Default size (blocking_threads 0): 4 threads per CPU the process may
 *    run on, at most 64: with 100 jobs held in work, that many run and the
 *    rest wait.
 */
#include "testutil.h"

#include <sched.h>

#define NJOBS 40
#define NTOPUP (POOL_THREADS + POOL_QUEUE) /* most top-ups possible */
#define NALL (NJOBS + NTOPUP)
#define POOL_THREADS 4
#define POOL_QUEUE 16
#define NDONE_STRANDS 4

typedef struct job {
  unsigned idx;
  weft_rt *rt;
  weft_strand *done_strand; /* NULL: any worker */
  weft_job id;
  int rc; /* weft_blocking's */
  atomic_uint started;
  atomic_uint done_calls;
  atomic_long got;
} job;

static job g_jobs[NALL];
static tu_gate g_gate;
static tu_count g_running, g_done_total;

static long job_result(const job *j) { return 1000 + 7 * (long)j->idx; }

static long work_fn(void *arg) {
  job *j = arg;
  TU_CHECKF(atomic_fetch_add(&j->started, 1) == 0, "job %u started twice",
            j->idx);
  TU_CHECK(weft_rt_current() == NULL);
  TU_CHECK(weft_strand_current() == NULL);
  atomic_fetch_add(&g_running, 1);
  tu_sleep_ms(20);
  tu_gate_pass(&g_gate);
  return job_result(j);
}

static void done_fn(void *arg, long result) {
  job *j = arg;
  TU_CHECKF(weft_strand_current() == j->done_strand,
            "job %u: done ran on strand %p, not %p", j->idx,
            (void *)weft_strand_current(), (void *)j->done_strand);
  TU_CHECK(weft_rt_current() == j->rt);
  atomic_store(&j->got, result);
  TU_CHECKF(atomic_fetch_add(&j->done_calls, 1) == 0, "job %u: done twice",
            j->idx);
  atomic_fetch_add(&g_done_total, 1);
}

/* work on the side, while the pool is saturated */
typedef struct side {
  weft_strand *s;
  atomic_uint next;
} side;
#define NSIDE 10
#define SIDE_DEPTH 100
static side g_side[NSIDE];
static tu_count g_side_done, g_timer_fired;

static void side_link(void *arg) {
  side *sd = arg;
  unsigned k = atomic_fetch_add(&sd->next, 1);
  atomic_fetch_add(&g_side_done, 1);
  if (k + 1 < SIDE_DEPTH)
    TU_CHECK(weft_post(sd->s, side_link, sd) == 0);
}

static void side_timer(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECK(status == 0);
  atomic_fetch_add(&g_timer_fired, 1);
}

static void noop(void *arg) { (void)arg; }
static void quiet_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
}
static long work_never(void *arg) {
  (void)arg;
  TU_CHECKF(false, "work of a refused job ran");
  return 0;
}
static void done_never(void *arg, long result) {
  (void)arg;
  (void)result;
  TU_CHECKF(false, "done of a refused job ran");
}

static bool pred_blocking_done(void *ctx, char *buf, size_t len) {
  tu_stat_wait *w = ctx;
  weft_stats st;
  if (weft_rt_stats(w->rt, &st) != 0)
    return false;
  snprintf(buf, len, "blocking_done %" PRIu64 ", want %" PRIu64,
           st.blocking_done, w->value);
  return st.blocking_done >= w->value;
}

static void test_saturated_pool(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("blocking: setup");
  tu_gate_init(&g_gate);
  atomic_store(&g_running, 0);
  atomic_store(&g_done_total, 0);
  atomic_store(&g_side_done, 0);
  atomic_store(&g_timer_fired, 0);

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = quiet_stall;
  cfg.blocking_threads = POOL_THREADS;
  cfg.blocking_queue = POOL_QUEUE;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  weft_rt *other;
  tu_rt_create(&other, 1, 0);
  weft_strand *foreign;
  tu_strand_create(other, &foreign);

  weft_strand *ds[NDONE_STRANDS];
  for (unsigned i = 0; i < NDONE_STRANDS; i++)
    tu_strand_create(rt, &ds[i]);

  /* Bad arguments first: nothing accepted. */
  tu_assert_rc(weft_blocking(NULL, work_never, NULL, NULL, done_never, NULL),
               -EINVAL);
  tu_assert_rc(weft_blocking(rt, NULL, NULL, NULL, done_never, NULL), -EINVAL);
  tu_assert_rc(weft_blocking(rt, work_never, NULL, NULL, NULL, NULL), -EINVAL);
  tu_assert_rc(weft_blocking(rt, work_never, NULL, foreign, done_never, NULL),
               -EXDEV);
  tu_assert_rc(weft_blocking_cancel(NULL, 1), -EINVAL);
  tu_assert_rc(weft_blocking_cancel(rt, 0), -EALREADY);
  tu_assert_rc(weft_blocking_cancel(rt, 12345), -EALREADY);
  tu_assert_rc(weft_blocking_cancel(rt, ~(weft_job)0), -EALREADY);

  tu_phase("blocking: 40 jobs into 4 threads + 16 queued");
  unsigned accepted = 0, refused = 0;
  for (unsigned i = 0; i < NJOBS; i++) {
    job *j = &g_jobs[i];
    memset(j, 0, sizeof *j);
    j->idx = i;
    j->rt = rt;
    j->done_strand = (i % 5 == 4) ? NULL : ds[i % NDONE_STRANDS];
    j->rc = weft_blocking(rt, work_fn, j, j->done_strand, done_fn, &j->id);
    if (j->rc == 0)
      accepted++;
    else if (j->rc == -EAGAIN)
      refused++;
    else
      fail_msg("job %u: weft_blocking returned %d (%s)", i, j->rc,
               weft_strerror(j->rc));
  }
  /* Nothing can finish (the gate is shut), so no slot was freed. */
  print_message("blocking: %u accepted, %u refused\n", accepted, refused);
  assert_true(refused >= 1);
  if (accepted < POOL_QUEUE || accepted > POOL_QUEUE + POOL_THREADS)
    fail_msg("%u jobs accepted: expected %u..%u", accepted, POOL_QUEUE,
             POOL_QUEUE + POOL_THREADS);

  /* Every pool thread is taken: each is stuck in a job's work. */
  tu_wait_count(&g_running, POOL_THREADS, "pool threads to take jobs");
  /* Now exactly POOL_THREADS jobs run and the rest wait: top the queue up
   * until it refuses. Then exactly POOL_QUEUE wait and POOL_THREADS run. */
  unsigned njobs = NJOBS;
  for (;;) {
    assert_true(njobs < NALL);
    job *j = &g_jobs[njobs];
    memset(j, 0, sizeof *j);
    j->idx = njobs;
    j->rt = rt;
    j->done_strand = ds[njobs % NDONE_STRANDS];
    j->rc = weft_blocking(rt, work_fn, j, j->done_strand, done_fn, &j->id);
    njobs++;
    if (j->rc == -EAGAIN)
      break;
    if (j->rc != 0)
      fail_msg("top-up job: weft_blocking returned %d (%s)", j->rc,
               weft_strerror(j->rc));
    accepted++;
  }
  print_message("blocking: %u accepted after topping up\n", accepted);
  assert_int_equal(accepted, POOL_THREADS + POOL_QUEUE);
  for (unsigned i = 0; i < njobs; i++)
    for (unsigned k = i + 1; k < njobs; k++)
      if (g_jobs[i].rc == 0 && g_jobs[k].rc == 0)
        assert_true(g_jobs[i].id != g_jobs[k].id);
  tu_phase("blocking: strands and a timer while the pool is saturated");
  weft_timer *tm;
  assert_int_equal(weft_timer_create(rt, NULL, &tm), 0);
  assert_int_equal(weft_timer_start(tm, 2000000, 0, side_timer, NULL), 0);
  for (unsigned i = 0; i < NSIDE; i++) {
    tu_strand_create(rt, &g_side[i].s);
    atomic_store(&g_side[i].next, 0);
    assert_int_equal(weft_post(g_side[i].s, side_link, &g_side[i]), 0);
  }
  tu_wait_count(&g_side_done, NSIDE * SIDE_DEPTH, "strand work");
  tu_wait_count(&g_timer_fired, 1, "the timer");
  assert_int_equal(atomic_load(&g_done_total), 0);
  assert_int_equal(atomic_load(&g_gate.passed), 0);
  assert_int_equal(atomic_load(&g_running), POOL_THREADS);
  /* And the queue is still full: more jobs are refused. */
  tu_assert_rc(weft_blocking(rt, work_never, NULL, NULL, done_never, NULL),
               -EAGAIN);
  /* The stats see the same: every thread in work, a full queue. */
  weft_stats sat;
  tu_stats(rt, &sat);
  assert_int_equal(sat.blocking_threads, POOL_THREADS);
  assert_int_equal(sat.blocking_running, POOL_THREADS);
  assert_int_equal(sat.blocking_queued, POOL_QUEUE);

  tu_phase("blocking: cancel");
  job *queued = NULL, *running = NULL;
  for (unsigned i = 0; i < njobs; i++) {
    job *j = &g_jobs[i];
    if (j->rc != 0)
      continue;
    if (atomic_load(&j->started)) {
      if (!running)
        running = j;
    } else {
      queued = j; /* the last queued: no pool thread is free to take it */
    }
  }
  assert_non_null(running);
  assert_non_null(queued);
  tu_assert_rc(weft_blocking_cancel(rt, running->id), -EALREADY);
  tu_assert_rc(weft_blocking_cancel(rt, queued->id), 0);
  tu_assert_rc(weft_blocking_cancel(rt, queued->id), -EALREADY);
  tu_wait_count(&g_done_total, 1, "the cancelled job's done");
  assert_int_equal(atomic_load(&queued->done_calls), 1);
  assert_int_equal(atomic_load(&queued->got), -ECANCELED);
  /* Its slot is given back after done returns; blocking_done counts it. */
  tu_stat_wait w1 = {rt, 1};
  tu_wait_until(pred_blocking_done, &w1, "stats.blocking_done after cancel");
  /* A slot came free: one more job is accepted, and will run. */
  job extra_job;
  memset(&extra_job, 0, sizeof extra_job);
  extra_job.idx = NALL;
  extra_job.rt = rt;
  extra_job.done_strand = ds[0];
  tu_assert_rc(
      weft_blocking(rt, work_fn, &extra_job, ds[0], done_fn, &extra_job.id), 0);

  tu_phase("blocking: open the gate");
  tu_gate_open(&g_gate);
  tu_wait_count(&g_done_total, accepted + 1, "every accepted job's done");
  for (unsigned i = 0; i <= njobs; i++) {
    job *j = i < njobs ? &g_jobs[i] : &extra_job;
    if (j->rc != 0) {
      assert_int_equal(atomic_load(&j->started), 0);
      assert_int_equal(atomic_load(&j->done_calls), 0);
      continue;
    }
    assert_int_equal(atomic_load(&j->done_calls), 1);
    if (j == queued) {
      assert_int_equal(atomic_load(&j->started), 0);
      assert_int_equal(atomic_load(&j->got), -ECANCELED);
    } else {
      assert_int_equal(atomic_load(&j->started), 1);
      assert_int_equal(atomic_load(&j->got), job_result(j));
    }
    /* Finished: cancelling it now is too late. */
    tu_assert_rc(weft_blocking_cancel(rt, j->id), -EALREADY);
  }
  tu_stat_wait w = {rt, accepted + 1};
  tu_wait_until(pred_blocking_done, &w, "stats.blocking_done");

  tu_phase("blocking: shutdown");
  weft_timer_destroy(tm);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_blocking(rt, work_never, NULL, NULL, done_never, NULL),
               -ESHUTDOWN);
  tu_assert_rc(weft_blocking(rt, work_never, NULL, ds[1], done_never, NULL),
               -ESHUTDOWN);
  tu_assert_rc(weft_blocking_cancel(rt, extra_job.id), -EALREADY);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.blocking_done, accepted + 1);
  assert_int_equal(st.blocking_queued, 0);
  assert_int_equal(st.blocking_running, 0);
  /* Each job that ran slept 20 ms in work. */
  uint64_t ran = 0;
  for (unsigned i = 0; i < njobs; i++)
    ran += g_jobs[i].rc == 0 && atomic_load(&g_jobs[i].started);
  assert_true(st.blocking_busy_ns >= ran * 20000000u);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(weft_rt_destroy(other), 0);
  /* Nothing else ran afterwards. */
  assert_int_equal(atomic_load(&g_done_total), accepted + 1);
  tu_gate_destroy(&g_gate);
  (void)noop;
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------- the default pool size */

static tu_gate g_dgate;
static tu_count g_din;

static long gated_work(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_din, 1);
  tu_gate_pass(&g_dgate);
  return 0;
}

static void gated_done(void *arg, long result) {
  (void)arg;
  (void)result;
}

/* blocking_threads 0: 4 per CPU the process may run on, at most 64. 100
 * jobs that wait on a gate: that many threads take one each, the rest
 * wait in the queue. */
static void test_default_threads(void **state) {
  (void)state;
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof(set), &set), 0);
  unsigned want = 4u * (unsigned)CPU_COUNT(&set);
  want = want < 64 ? want : 64;
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  tu_gate_init(&g_dgate);
  atomic_store(&g_din, 0);
  for (unsigned i = 0; i < 100; i++)
    tu_assert_rc(weft_blocking(rt, gated_work, NULL, NULL, gated_done, NULL),
                 0);
  tu_wait_count(&g_din, want, "pool threads in work");
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(st.blocking_threads, want);
  assert_int_equal(st.blocking_running, want);
  assert_int_equal(st.blocking_queued, 100 - want);
  tu_gate_open(&g_dgate);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_stats(rt, &st);
  assert_int_equal(st.blocking_done, 100);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_gate_destroy(&g_dgate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------- many short jobs */

typedef struct sjob {
  weft_strand *s;
  unsigned poster, seq;
  atomic_uint ran, done;
} sjob;

static sjob *g_sjobs;
static tu_count g_sdone;
static weft_rt *g_srt;

static long short_work(void *arg) {
  sjob *j = arg;
  TU_CHECK(atomic_fetch_add(&j->ran, 1) == 0);
  return (long)j->seq;
}

static void short_done(void *arg, long result) {
  sjob *j = arg;
  TU_CHECK(result == (long)j->seq);
  TU_CHECK(weft_strand_current() == j->s);
  TU_CHECK(atomic_fetch_add(&j->done, 1) == 0);
  atomic_fetch_add(&g_sdone, 1);
}

typedef struct sposter {
  unsigned id;
  uint64_t from, n;
  weft_strand *s;
  tu_count eagain;
} sposter;

static void *sposter_main(void *p) {
  sposter *a = p;
  for (uint64_t i = 0; i < a->n; i++) {
    sjob *j = &g_sjobs[a->from + i];
    j->s = a->s;
    j->poster = a->id;
    j->seq = (unsigned)i;
    uint64_t dl = tu_deadline_ns(TU_WAIT_S);
    int rc;
    while ((rc = weft_blocking(g_srt, short_work, j, a->s, short_done, NULL)) ==
               -EAGAIN &&
           tu_now_ns() < dl) {
      atomic_fetch_add(&a->eagain, 1);
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
    if (rc != 0) {
      TU_CHECKF(false, "weft_blocking: %d (%s)", rc, weft_strerror(rc));
      return NULL;
    }
  }
  return NULL;
}

static void test_many_short_jobs(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("blocking: many short jobs");
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = quiet_stall;
  cfg.blocking_threads = 3;
  cfg.blocking_queue = 8;
  assert_int_equal(weft_rt_create(&g_srt, &cfg), 0);
  uint64_t per = TU_SCALED(5000, 200);
  g_sjobs = calloc(2 * per, sizeof *g_sjobs);
  assert_non_null(g_sjobs);
  atomic_store(&g_sdone, 0);
  sposter ps[2];
  pthread_t th[2];
  for (unsigned i = 0; i < 2; i++) {
    ps[i].id = i;
    ps[i].from = i * per;
    ps[i].n = per;
    atomic_init(&ps[i].eagain, 0);
    if (i == 0)
      ps[i].s = NULL;
    else
      tu_strand_create(g_srt, &ps[i].s);
    tu_thread_start(&th[i], sposter_main, &ps[i]);
  }
  for (unsigned i = 0; i < 2; i++)
    tu_thread_join(th[i], "job poster");
  tu_wait_count(&g_sdone, 2 * per, "short jobs' done");
  assert_int_equal(weft_rt_shutdown(g_srt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(g_srt, &st);
  assert_int_equal(st.blocking_done, 2 * per);
  assert_int_equal(weft_rt_destroy(g_srt), 0);
  for (uint64_t i = 0; i < 2 * per; i++) {
    assert_int_equal(atomic_load(&g_sjobs[i].ran), 1);
    assert_int_equal(atomic_load(&g_sjobs[i].done), 1);
  }
  print_message("many short jobs: %" PRIu64 " jobs, %" PRIu64 "+%" PRIu64
                " EAGAIN retries\n",
                2 * per, (uint64_t)atomic_load(&ps[0].eagain),
                (uint64_t)atomic_load(&ps[1].eagain));
  free(g_sjobs);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------ jobs submitted from handlers
 * weft_blocking from handlers, some of which first sleep past the stall
 * threshold (so they submit from a thread that has lost its shard): each
 * job's done runs once, on the submitting strand, with its result; inside
 * done, cancelling the job itself is too late (-EALREADY). */
#define NSUB 64
typedef struct sub {
  weft_rt *rt;
  weft_strand *s;
  weft_job id;
  atomic_uint ran, done;
  atomic_int submit_rc, self_cancel_rc;
  long got;
} sub;
static sub g_sub[NSUB];
static tu_count g_sub_done;

static long sub_work(void *arg) {
  sub *x = arg;
  TU_CHECK(atomic_fetch_add(&x->ran, 1) == 0);
  return 77 + (long)(x - g_sub);
}

static void sub_done(void *arg, long result) {
  sub *x = arg;
  TU_CHECK(weft_strand_current() == x->s);
  x->got = result; /* read after g_sub_done */
  atomic_store(&x->self_cancel_rc, weft_blocking_cancel(x->rt, x->id));
  TU_CHECK(atomic_fetch_add(&x->done, 1) == 0);
  atomic_fetch_add(&g_sub_done, 1);
}

static void submitter(void *arg) {
  sub *x = arg;
  if ((x - g_sub) % 2) {
    struct timespec ts = {0, 300000}; /* 300 us: past the threshold */
    nanosleep(&ts, NULL);
  }
  /* The id is written before done can run: done runs on this strand,
   * after this handler returns. */
  atomic_store(&x->submit_rc,
               weft_blocking(x->rt, sub_work, x, x->s, sub_done, &x->id));
}

static void test_submit_from_handlers(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("blocking: submitted from handlers");
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 50000;
  cfg.on_stall = quiet_stall;
  cfg.blocking_threads = 2;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  atomic_store(&g_sub_done, 0);
  memset(g_sub, 0, sizeof g_sub);
  for (unsigned i = 0; i < NSUB; i++) {
    g_sub[i].rt = rt;
    atomic_store(&g_sub[i].submit_rc, 1);
    atomic_store(&g_sub[i].self_cancel_rc, 1);
    tu_strand_create(rt, &g_sub[i].s);
  }
  for (unsigned i = 0; i < NSUB; i++)
    assert_int_equal(weft_post(g_sub[i].s, submitter, &g_sub[i]), 0);
  tu_wait_count(&g_sub_done, NSUB, "jobs submitted from handlers");
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(rt, &st);
  assert_int_equal(weft_rt_destroy(rt), 0);
  for (unsigned i = 0; i < NSUB; i++) {
    sub *x = &g_sub[i];
    assert_int_equal(atomic_load(&x->submit_rc), 0);
    assert_int_equal(atomic_load(&x->ran), 1);
    assert_int_equal(atomic_load(&x->done), 1);
    assert_int_equal(x->got, 77 + (long)i);
    assert_int_equal(atomic_load(&x->self_cancel_rc), -EALREADY);
  }
  assert_int_equal(st.blocking_done, NSUB);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A job holds its done strand: released while work runs, the strand
 * still takes done (no post to a reclaimed strand), and meanwhile a new
 * job for it is refused with -EBADF. */
typedef struct held {
  tu_gate gate;
  weft_strand *s;
  tu_count calls;
  atomic_bool on_strand;
  atomic_long got;
} held;

static long held_work(void *arg) {
  held *h = arg;
  tu_gate_pass(&h->gate);
  return 42;
}

static void held_done(void *arg, long result) {
  held *h = arg;
  atomic_store(&h->on_strand, weft_strand_current() == h->s);
  atomic_store(&h->got, result);
  atomic_fetch_add(&h->calls, 1);
}

typedef struct churn {
  tu_count done;
  atomic_uint off_strand;
} churn;

static long churn_work(void *arg) {
  (void)arg;
  return 7;
}

static void churn_done(void *arg, long result) {
  churn *ch = arg;
  if (!weft_strand_current() || result != 7)
    atomic_fetch_add(&ch->off_strand, 1);
  atomic_fetch_add(&ch->done, 1);
}

static void test_release_pending(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("blocking: done strand released while work runs");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  static held h;
  memset(&h, 0, sizeof h);
  tu_gate_init(&h.gate);
  tu_strand_create(rt, &h.s);
  assert_int_equal(weft_blocking(rt, held_work, &h, h.s, held_done, NULL), 0);
  tu_wait_count(&h.gate.entered, 1, "the job inside work");
  weft_strand_release(h.s);
  assert_int_equal(weft_blocking(rt, held_work, &h, h.s, held_done, NULL),
                   -EBADF);
  tu_gate_open(&h.gate);
  tu_wait_count(&h.calls, 1, "done on the released strand");
  /* The race of the release with done's post: each of many short jobs'
   * strands is released as soon as the job is accepted, so the last
   * reference goes now on this thread, now on a pool thread. */
  unsigned n = TU_SCALED(4000, 200);
  static churn ch;
  memset(&ch, 0, sizeof ch);
  for (unsigned i = 0; i < n; i++) {
    weft_strand *s;
    tu_strand_create(rt, &s);
    int rc;
    while ((rc = weft_blocking(rt, churn_work, &ch, s, churn_done, NULL)) ==
           -EAGAIN)
      sched_yield(); /* the queue is full: let it drain */
    assert_int_equal(rc, 0);
    weft_strand_release(s);
  }
  tu_wait_count(&ch.done, n, "the churned jobs' dones");
  assert_int_equal(atomic_load(&ch.off_strand), 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&h.calls), 1);
  assert_true(atomic_load(&h.on_strand));
  assert_int_equal(atomic_load(&h.got), 42);
  tu_gate_destroy(&h.gate);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_saturated_pool),
      cmocka_unit_test(test_many_short_jobs),
      cmocka_unit_test(test_submit_from_handlers),
      cmocka_unit_test(test_release_pending),
      cmocka_unit_test(test_default_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
