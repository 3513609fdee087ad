/*
 * test_model_park.c - the park protocol (src/park.c: searching, parking,
 * waking, starting a dormant thread, the end of a shutdown) under the
 * schedule explorer (model.h), on the real run and inject queues
 * (src/runq.c).
 *
 * A runtime is built by hand with only what park.c reads. Workers run a
 * copy of shard.c's main loop without timers or I/O (own ring, inject
 * queue, search and steal, park); a thread outside posts jobs as
 * weft_post_rt does (counted busy, inject push, notify), waits on a futex
 * until every job ran, and shuts the runtime down as weft_rt_shutdown
 * does. A job may post a follow-up on its worker's own ring. The steps of
 * park.c are the library's own; the loops around them are this file's.
 *
 * Checked: every job accepted runs exactly once, and none refused runs;
 * the poster is woken (a lost wakeup of a worker leaves a job queued and
 * everyone asleep, which the explorer reports); the shutdown completes,
 * with every worker returned, after every accepted job ran, also while
 * posts race it.
 */
#include "model.h"

#include "futex.h"
#include "io.h"
#include "monitor.h"
#include "park.h"
#include "rt.h"
#include "shard.h"
#include "thread.h"
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_W 3
#define JOBS 4

/* ----------------------------------------- what park.c calls outside */

_Thread_local struct weft__thread *weft__tls_self;
_Thread_local struct weft__ring *weft__tls_ring;
bool weft__trace_tsc;

static _Atomic uint32_t gate[MAX_W]; /* 1: started, 2: runtime done */
static bool spawn_fails;

bool weft__io_wake_thread(struct weft__thread *t) {
  (void)t;
  return false;
}

bool weft__io_wait(struct weft__thread *t, struct weft__io *io,
                   uint64_t deadline) {
  (void)t, (void)io, (void)deadline;
  model_fail(__FILE__, __LINE__, "no shard has a backend here");
  return false;
}

void weft__monitor_nudge(weft_rt *rt) { (void)rt; }

unsigned weft__shard_idx(const struct weft__shard *sh) { return sh->idx; }

void *weft__thread_entry(void *arg) { return arg; }

/* Starting a dormant thread opens its fiber's gate. */
int weft__spawn(pthread_t *tid, const pthread_attr_t *attr, void *(*fn)(void *),
                void *arg) {
  (void)tid, (void)attr, (void)fn;
  if (spawn_fails)
    return EAGAIN;
  struct weft__thread *t = arg;
  weft__store(&gate[t->idx], 1, WA_REL);
  weft__futex_wake(&gate[t->idx], 1);
  return 0;
}

/* At done: a thread never started leaves its gate. */
void weft__spares_wake_all(weft_rt *rt) {
  for (unsigned i = 0; i < rt->nshards; i++) {
    uint32_t zero = 0;
    if (weft__cas(&gate[i], &zero, 2, WA_AR, WA_RLX))
      weft__futex_wake(&gate[i], 1);
  }
}

/* -------------------------------------------------------- the runtime */

static weft_rt *rt;
static struct weft__link job[JOBS];
static unsigned ran[JOBS];
static bool accepted[JOBS];
/* jobs 0..posts-1 are posted from outside, the next ones up to njobs as
 * follow-ups, each by the one before */
static unsigned nworkers, neager, posts, njobs;
static unsigned split; /* poster posts jobs 0..split-1, poster_b the rest */
static unsigned jobs_ran, returned;
static _Atomic uint32_t all_ran; /* the poster's futex */

static void teardown(void);

static void build(unsigned workers, unsigned eager, bool fail, unsigned nposts,
                  unsigned jobs) {
  if (rt)
    teardown(); /* the last run failed before its check */
  posts = split = nposts;
  njobs = jobs;
  nworkers = workers;
  neager = eager;
  spawn_fails = fail;
  /* Static, cleared each run: a shard is large, and ASan maps memory
   * for each allocation that size. */
  static weft_rt rt_mem;
  static struct weft__shard shards[MAX_W];
  static struct weft__thread threads[MAX_W];
  memset(&rt_mem, 0, sizeof(rt_mem));
  memset(shards, 0, sizeof(shards));
  memset(threads, 0, sizeof(threads));
  rt = &rt_mem;
  rt->shards = shards;
  rt->threads = threads;
  rt->nshards = workers;
  rt->th.neager = eager;
  pthread_mutex_init(&rt->th.spare_lock, NULL);
  pthread_mutex_init(&rt->life.lock, NULL);
  pthread_cond_init(&rt->life.cond, NULL);
  for (unsigned i = 0; i < workers; i++) {
    struct weft__shard *sh = &rt->shards[i];
    struct weft__thread *t = &rt->threads[i];
    sh->rt = rt;
    sh->idx = i;
    sh->rng = i + 1;
    weft__runq_init(&sh->rq);
    weft__runq_init(&sh->prq);
    weft__store(&sh->tm.next, UINT64_MAX, WA_RLX);
    weft__store(&sh->owner, t, WA_RLX);
    t->rt = rt;
    t->shard = sh;
    t->idx = i;
    t->slot_state = WEFT_TH_LIVE;
    weft__store(&gate[i], i < eager, WA_RLX);
  }
  weft__inject_init(&rt->inject);
  weft__idle_init(&rt->idle, eager);
  if (weft__idle_alloc(&rt->idle, workers))
    abort();
  weft__idle_add_dormant(rt);
  memset(job, 0, sizeof(job));
  memset(ran, 0, sizeof(ran));
  for (unsigned i = 0; i < JOBS; i++)
    accepted[i] = i >= posts && i < njobs; /* follow-ups; posts: when taken */
  jobs_ran = returned = 0;
  weft__store(&all_ran, 0, WA_RLX);
}

static void teardown(void) {
  weft__idle_destroy(&rt->idle);
  weft__inject_destroy(&rt->inject);
  pthread_mutex_destroy(&rt->th.spare_lock);
  pthread_mutex_destroy(&rt->life.lock);
  pthread_cond_destroy(&rt->life.cond);
  rt = NULL;
}

/* ---------------------------- shard.c's and rt.c's loops, copied small */

static void notify_if_more(struct weft__shard *sh) {
  if (rt->nshards > 1 && weft__runq_len(&sh->rq) > 1)
    weft__notify_parked(rt);
}

/* weft__schedule from a worker: its ring, or half of it to the inject
 * queue when full. */
static void schedule_local(struct weft__shard *sh, weft__item it) {
  if (weft__runq_push(&sh->rq, it)) {
    notify_if_more(sh);
    return;
  }
  weft__item buf[WEFT_RUNQ_CAP / 2 + 1];
  uint32_t n = weft__runq_grab(&sh->rq, buf, WEFT_RUNQ_CAP / 2);
  buf[n++] = it;
  weft__inject_push(&rt->inject, buf, n);
  weft__notify_parked(rt);
}

static weft__item take_inject(struct weft__shard *sh) {
  weft__item buf[WEFT_RUNQ_CAP / 2];
  uint32_t room = WEFT_RUNQ_CAP - weft__runq_len(&sh->rq);
  uint32_t max = room / 2 > 0 ? room / 2 : 1;
  uint32_t n = weft__inject_take(&rt->inject, buf, max);
  if (!n)
    return 0;
  for (uint32_t i = 1; i < n; i++)
    weft__runq_push(&sh->rq, buf[i]);
  if (n > 1 || weft__load(&rt->inject.len, WA_RLX) > 0)
    weft__notify_parked(rt);
  return buf[0];
}

static weft__item steal(struct weft__shard *sh) {
  weft__item own = weft__runq_pop(&sh->rq);
  if (own)
    return own;
  for (unsigned i = 1; i < rt->nshards; i++) {
    struct weft__shard *v = &rt->shards[(sh->idx + i) % rt->nshards];
    uint32_t got = 0;
    weft__item it = weft__runq_steal(&v->rq, &sh->rq, &got);
    if (it)
      return it;
  }
  return take_inject(sh);
}

static void run_job(struct weft__shard *sh, weft__item it) {
  struct weft__link *l = (struct weft__link *)it;
  MODEL_CHECK(l >= job && l < job + JOBS, "a foreign item %p", (void *)it);
  unsigned i = (unsigned)(l - job);
  MODEL_CHECK(!ran[i], "job %u ran twice", i);
  ran[i]++;
  if (i + 1 >= posts && i + 1 < njobs) /* a local follow-up */
    schedule_local(sh, (weft__item)&job[i + 1]);
  if (++jobs_ran == njobs) {
    weft__store(&all_ran, 1, WA_REL);
    weft__futex_wake(&all_ran, 1);
  }
}

static void main_loop(struct weft__thread *t) {
  struct weft__shard *sh = t->shard;
  for (;;) {
    weft__item it = weft__runq_pop(&sh->rq);
    if (!it)
      it = take_inject(sh);
    if (!it) {
      if (weft__to_searching(rt, t))
        it = steal(sh);
      if (!it) {
        if (!weft__park(rt, t))
          return;
        continue;
      }
    }
    if (t->searching)
      weft__from_searching(rt, t);
    run_job(sh, it);
  }
}

static void worker(int id) {
  struct weft__thread *t = &rt->threads[id];
  /* A dormant slot waits for its start (weft__spawn) or for the end. */
  uint32_t g;
  while ((g = weft__load(&gate[id], WA_ACQ)) == 0)
    weft__futex_wait(&gate[id], 0);
  if (g == 1 && (!t->lazy || weft__park_resume(rt, t)))
    main_loop(t);
  returned++;
}

/* weft__busy_drop, _enter (rt.c). The back-out drops with a poke: the
 * last parker may have read the count with this post in it. */
static void busy_drop(void) {
  weft__fetch_sub(&rt->life.busy, 1, WA_SC);
  if (weft__load(&rt->life.closing, WA_SC))
    weft__poke(rt);
}

static int busy_enter(void) {
  weft__fetch_add(&rt->life.busy, 1, WA_SC);
  if (weft__load(&rt->life.closing, WA_SC)) {
    busy_drop();
    return -ESHUTDOWN;
  }
  return 0;
}

/* weft_post_rt: false if the shutdown refused it. */
static bool post(unsigned i) {
  if (busy_enter())
    return false;
  accepted[i] = true;
  weft__item it = (weft__item)&job[i];
  weft__inject_push(&rt->inject, &it, 1);
  weft__notify_parked(rt);
  busy_drop();
  return true;
}

/* weft_rt_shutdown without its parts (timers, sockets, pools). */
static void shutdown(int id) {
  (void)id;
  weft__fetch_add(&rt->life.busy, 1, WA_SC);
  weft__store(&rt->life.closing, 1, WA_SC);
  busy_drop();
}

/* Posts its outside jobs, waits for every job, then shuts down. */
static void poster(int id) {
  for (unsigned i = 0; i < split; i++)
    MODEL_CHECK(post(i), "a post refused before the shutdown");
  while (!weft__load(&all_ran, WA_ACQ))
    weft__futex_wait(&all_ran, 0);
  shutdown(id);
}

/* A second thread posting from outside. */
static void poster_b(int id) {
  (void)id;
  for (unsigned i = split; i < posts; i++)
    MODEL_CHECK(post(i), "a post refused before the shutdown");
}

/* Posts while another thread shuts down: each post is refused or runs. */
static void racer(int id) {
  (void)id;
  for (unsigned i = 0; i < posts; i++)
    post(i);
}

static void check(void) {
  for (unsigned i = 0; i < JOBS; i++)
    MODEL_CHECK(ran[i] == accepted[i], "job %u ran %u times, accepted: %d", i,
                ran[i], accepted[i]);
  MODEL_CHECK(weft__load(&rt->life.done, WA_RLX), "the shutdown never ended");
  MODEL_CHECK(returned == nworkers, "%u of %u workers returned", returned,
              nworkers);
  teardown();
}

/* Two started workers; three jobs posted, one follow-up. */
static void setup_two(void) { build(2, 2, false, 3, 4); }

/* Three started workers, two posted, two follow-ups. */
static void setup_three(void) { build(3, 3, false, 2, 4); }

/* One started worker, the second dormant until work needs it. */
static void setup_lazy(void) { build(2, 1, false, 3, 4); }

/* The same, and the dormant thread cannot be started. */
static void setup_lazy_fails(void) { build(2, 1, true, 3, 4); }

/* The same with two threads posting two jobs each: the posts of one
 * meet the failed start caused by the other's. */
static void setup_lazy_fails_posters(void) {
  build(2, 1, true, 4, 4);
  split = 2;
}

/* Two posts racing the shutdown, no follow-ups. */
static void setup_race(void) { build(2, 2, false, 2, 2); }

static const struct model_case cases[] = {
    {.name = "park_two",
     .nthreads = 3,
     .setup = setup_two,
     .thread = {worker, worker, poster},
     .check = check},
    {.name = "park_three",
     .nthreads = 4,
     .setup = setup_three,
     .thread = {worker, worker, worker, poster},
     .check = check},
    {.name = "park_lazy_start",
     .nthreads = 3,
     .setup = setup_lazy,
     .thread = {worker, worker, poster},
     .check = check},
    {.name = "park_lazy_start_fails",
     .nthreads = 3,
     .setup = setup_lazy_fails,
     .thread = {worker, worker, poster},
     .check = check},
    {.name = "park_lazy_start_fails_posters",
     .nthreads = 4,
     .setup = setup_lazy_fails_posters,
     .thread = {worker, worker, poster, poster_b},
     .check = check},
    {.name = "park_shutdown_race",
     .nthreads = 4,
     .setup = setup_race,
     .thread = {worker, worker, racer, shutdown},
     .check = check},
};

int main(int argc, char **argv) {
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
