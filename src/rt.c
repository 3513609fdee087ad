/*
 * rt.c - the runtime's life: configuration, create, shutdown, destroy, and
 * statistics. Owns the weft_rt struct, its shards and threads.
 *
 * Every one-time cost is paid in weft_rt_create: shards, queues, the
 * sleeper list, one batch of pooled objects per shard, and the eager
 * threads, which have all reached their loop when it returns. The other
 * shards' threads are dormant until first needed (park.c). Threads wait
 * for each other only on a condition variable, never by spinning.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_BATCH 64

void weft_config_init(weft_config *cfg) {
  if (cfg)
    memset(cfg, 0, sizeof(*cfg));
}

static unsigned cpus_allowed(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0)
      return (unsigned)n;
  }
  return 1;
}

static size_t line_up(size_t bytes) {
  return (bytes + WEFT_CACHELINE - 1) & ~(size_t)(WEFT_CACHELINE - 1);
}

static void *zalloc_aligned(size_t bytes) {
  bytes = line_up(bytes);
  void *p = aligned_alloc(WEFT_CACHELINE, bytes);
  if (p)
    memset(p, 0, bytes);
  return p;
}

/* The shards, the thread slots and one batch per shard of each pool that
 * prefill fills live in one anonymous mapping, populated by the mmap call
 * itself and zero already. From malloc, the same 1.4 MB for 64 shards cost
 * one page fault per page on every create (glibc gives the heap's top back
 * at free), about 320 faults or 0.3 ms of the create's one thread. The
 * shards' own pools (strands, timers) get their batch each, one shard's
 * after the other's. */
static int arena_map(weft_rt *rt, unsigned workers, unsigned max_threads) {
  size_t shards = line_up(workers * sizeof(*rt->shards));
  size_t threads = line_up(max_threads * sizeof(*rt->threads));
  size_t node = (size_t)workers * WEFT_POOL_BATCH * rt->node_pool.objsize;
  size_t strand = WEFT_POOL_BATCH * (size_t)WEFT_CACHELINE;
  size_t timer = WEFT_POOL_BATCH * line_up(sizeof(struct weft_timer));
  size_t bytes = shards + threads + node + workers * (strand + timer);
  void *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (a == MAP_FAILED)
    return -ENOMEM;
  rt->arena = a;
  rt->arena_bytes = bytes;
  char *p = a;
  rt->shards = (struct weft__shard *)p;
  rt->threads = (struct weft__thread *)(p += shards);
  weft__pool_reserve(&rt->node_pool, p += threads, node);
  p += node;
  for (unsigned i = 0; i < workers; i++) {
    struct weft__shard *sh = &rt->shards[i];
    weft__pool_init(&sh->strand_pool, WEFT_CACHELINE);
    weft__pool_init(&sh->timer_pool, sizeof(struct weft_timer));
    weft__pool_reserve(&sh->strand_pool, p, strand);
    weft__pool_reserve(&sh->timer_pool, p += strand, timer);
    p += timer;
  }
  return 0;
}

static void arena_unmap(weft_rt *rt) {
  if (rt->arena)
    munmap(rt->arena, rt->arena_bytes);
}

/* Fills a shard's pool caches with one batch each, so the first posts do
 * not take the depot lock or carve slabs. */
static void prefill(weft_rt *rt, struct weft__shard *sh) {
  void *n = weft__pool_alloc(&rt->node_pool, &sh->node_cache);
  if (n)
    weft__pool_free(&rt->node_pool, &sh->node_cache, n);
  void *s = weft__pool_alloc(&sh->strand_pool, &sh->strand_cache);
  if (s)
    weft__pool_free(&sh->strand_pool, &sh->strand_cache, s);
  void *t = weft__pool_alloc(&sh->timer_pool, &sh->timer_cache);
  if (t)
    weft__pool_free(&sh->timer_pool, &sh->timer_cache, t);
}

static void rt_free(weft_rt *rt) {
  weft__tcp_destroy(rt);
  weft__io_destroy(rt);
  for (unsigned i = 0; i < rt->nshards; i++) {
    pthread_mutex_destroy(&rt->shards[i].tcp_lock);
    weft__pool_destroy(&rt->shards[i].strand_pool);
    weft__pool_destroy(&rt->shards[i].timer_pool);
  }
  weft__pool_destroy(&rt->sock_pool);
  weft__pool_destroy(&rt->node_pool);
  weft__inject_destroy(&rt->inject);
  weft__blocking_destroy(rt); /* no-op if destroy already did it */
  weft__idle_destroy(&rt->idle);
  pthread_mutex_destroy(&rt->life_lock);
  pthread_cond_destroy(&rt->life_cond);
  pthread_mutex_destroy(&rt->spare_lock);
  pthread_mutex_destroy(&rt->io_lock);
  pthread_attr_destroy(&rt->thread_attr);
  pthread_attr_destroy(&rt->lazy_attr);
  free(rt->spares);
  arena_unmap(rt);
  free(rt);
}

#define DEFAULT_TIMER_SPIN_NS 20000u
#define DEFAULT_STACK_SIZE ((size_t)512 * 1024)
#define MIN_STACK_SIZE ((size_t)16384)
#define DEFAULT_STALL_NS 1000000u
#define MIN_STALL_NS 50000u

/* Checks cfg (NULL: defaults) and resolves its zeros. */
static int resolve(const weft_config *in, weft_config *out) {
  weft_config_init(out);
  if (in)
    *out = *in;
  if ((out->flags & ~(WEFT_CONFIG_NO_MONITOR | WEFT_CONFIG_NO_TIMER_SPIN)) ||
      out->workers > WEFT_MAX_WORKERS || out->batch > WEFT_MAX_BATCH ||
      (out->stall_threshold_ns && out->stall_threshold_ns < MIN_STALL_NS) ||
      (out->max_threads && out->max_threads < out->workers) ||
      out->max_threads > 4 * WEFT_MAX_WORKERS || out->backend < 0 ||
      (out->stack_size && out->stack_size < MIN_STACK_SIZE) ||
      out->stack_size > ((size_t)1 << 40) || out->backend > WEFT_BACKEND_NONE)
    return -EINVAL;
  if (!out->workers)
    out->workers = cpus_allowed();
  if (out->workers > WEFT_MAX_WORKERS)
    out->workers = WEFT_MAX_WORKERS;
  if (!out->batch)
    out->batch = DEFAULT_BATCH;
  if (!out->timer_slack_ns)
    out->timer_slack_ns = 1;
  if (!out->timer_spin_ns)
    out->timer_spin_ns = DEFAULT_TIMER_SPIN_NS;
  if (!out->stack_size)
    out->stack_size = DEFAULT_STACK_SIZE;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  out->stack_size = (out->stack_size + page - 1) / page * page;
  if (!out->stall_threshold_ns)
    out->stall_threshold_ns = DEFAULT_STALL_NS;
  if (!out->max_threads)
    out->max_threads = 2 * out->workers + 4;
  if (out->max_threads < out->workers)
    out->max_threads = out->workers;
  if (!out->eager_workers)
    out->eager_workers = cpus_allowed();
  if (out->eager_workers > out->workers)
    out->eager_workers = out->workers;
  return 0;
}

/* Joins every thread that ever started: shard threads, spares (the done
 * wakeup made them exit) and threads that exited idle. slot_state is read
 * under spare_lock; the joins happen outside it (exiting threads take it). */
static void join_all(weft_rt *rt) {
  for (unsigned i = 0;; i++) {
    pthread_mutex_lock(&rt->spare_lock);
    bool more = i < rt->nthreads;
    int st = more ? rt->threads[i].slot_state : WEFT_TH_FREE;
    bool started = st == WEFT_TH_LIVE || st == WEFT_TH_EXITED;
    pthread_t tid = more ? rt->threads[i].tid : (pthread_t)0;
    pthread_mutex_unlock(&rt->spare_lock);
    if (!more)
      return;
    if (started)
      pthread_join(tid, NULL);
  }
}

/* Every runtime thread starts with asynchronous signals blocked (threads
 * they start inherit the mask), so that the application's signals go to
 * its own threads and a SIGPIPE raised inside a handler never kills the
 * process. */
static void block_async_signals(sigset_t *old) {
  sigset_t all;
  sigfillset(&all);
  const int sync_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL,
                           SIGTRAP, SIGSYS, SIGABRT};
  for (size_t i = 0; i < sizeof(sync_sigs) / sizeof(sync_sigs[0]); i++)
    sigdelset(&all, sync_sigs[i]);
  pthread_sigmask(SIG_SETMASK, &all, old);
}

/* Any thread may start a dormant one (the one that needs it): the signal
 * mask is set here, and the CPU affinity and scheduling policy are
 * weft_rt_create's caller's, as the eager threads inherit them
 * (lazy_attr). Where those cannot be given (EPERM: a real-time policy and
 * a waker without the privilege; EINVAL: the process's cpuset no longer
 * has those CPUs) the thread inherits the waker's instead. */
int weft__thread_create_dormant(weft_rt *rt, struct weft__thread *t) {
  sigset_t old;
  block_async_signals(&old);
  int err = pthread_create(&t->tid, &rt->lazy_attr, weft__thread_entry, t);
  if (err == EPERM || err == EINVAL)
    err = pthread_create(&t->tid, &rt->thread_attr, weft__thread_entry, t);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err)
    return -err;
  t->slot_state = WEFT_TH_LIVE;
  weft__store(&t->dormant, 0, WA_REL);
  weft__store(&t->shard->thread_dormant, 0, WA_REL);
  return 0;
}

/* Starts the eager shards' threads, one spare and the monitor. */
static int start_threads(weft_rt *rt, bool monitor) {
  sigset_t old;
  block_async_signals(&old);
  int err = 0;
  unsigned i;
  for (i = 0; i < rt->neager; i++) {
    rt->threads[i].slot_state = WEFT_TH_LIVE;
    err = pthread_create(&rt->threads[i].tid, &rt->thread_attr,
                         weft__thread_entry, &rt->threads[i]);
    if (err) {
      rt->threads[i].slot_state = WEFT_TH_FREE;
      break;
    }
  }
  if (!err && monitor) {
    err = -weft__spare_prestart(rt);
    if (!err)
      err = -weft__monitor_start(rt);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!err) {
    pthread_mutex_lock(&rt->life_lock);
    while (rt->started < rt->neager)
      pthread_cond_wait(&rt->life_cond, &rt->life_lock);
    pthread_mutex_unlock(&rt->life_lock);
    return 0;
  }
  /* Stop the ones that started: nothing was accepted yet. */
  weft__store(&rt->closing, 1, WA_SC);
  /* Threads that did not start are counted as parked for completion,
   * under idle.lock like every change of the unparked count (park.c). */
  pthread_mutex_lock(&rt->idle.lock);
  weft__fetch_sub(&rt->idle.state, (uint64_t)(rt->neager - i) << 32, WA_SC);
  pthread_mutex_unlock(&rt->idle.lock);
  weft__poke(rt);
  pthread_mutex_lock(&rt->life_lock);
  while (!weft__load(&rt->done, WA_ACQ) && i > 0)
    pthread_cond_wait(&rt->life_cond, &rt->life_lock);
  pthread_mutex_unlock(&rt->life_lock);
  weft__monitor_stop(rt);
  join_all(rt);
  return -EAGAIN;
}

static int rt_init(weft_rt *rt, const weft_config *c) {
  rt->nshards = c->workers;
  rt->batch = c->batch;
  rt->timer_slack_ns = c->timer_slack_ns;
  rt->timer_spin_ns =
      (c->flags & WEFT_CONFIG_NO_TIMER_SPIN) ? 0 : c->timer_spin_ns;
  rt->stall_ns = c->stall_threshold_ns;
  rt->max_threads = c->max_threads;
  rt->nthreads = c->workers;
  rt->neager = c->eager_workers;
  rt->on_stall = c->on_stall;
  rt->on_stall_ctx = c->on_stall_ctx;
  /* EINVAL: below this platform's PTHREAD_STACK_MIN */
  int r = pthread_attr_setstacksize(&rt->thread_attr, c->stack_size);
  if (r)
    return -r;
  pthread_attr_setstacksize(&rt->lazy_attr, c->stack_size);
  if (rt->neager < rt->nshards) {
    cpu_set_t set;
    if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0)
      pthread_attr_setaffinity_np(&rt->lazy_attr, sizeof(set), &set);
    int policy;
    struct sched_param sp;
    /* Explicit only if glibc takes both (it refuses SCHED_DEADLINE and
     * may refuse others): else inherited, as before. */
    if (pthread_getschedparam(pthread_self(), &policy, &sp) == 0 &&
        pthread_attr_setschedpolicy(&rt->lazy_attr, policy) == 0 &&
        pthread_attr_setschedparam(&rt->lazy_attr, &sp) == 0)
      pthread_attr_setinheritsched(&rt->lazy_attr, PTHREAD_EXPLICIT_SCHED);
  }
  rt->spares = calloc(c->max_threads, sizeof(*rt->spares));
  weft__pool_init(&rt->node_pool, sizeof(struct weft__node));
  weft__pool_init(&rt->sock_pool, weft__sock_size());
  int ar = arena_map(rt, c->workers, c->max_threads);
  weft__inject_init(&rt->inject);
  pthread_mutex_init(&rt->life_lock, NULL);
  pthread_condattr_t ca; /* weft_rt_wait measures CLOCK_MONOTONIC */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rt->life_cond, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&rt->spare_lock, NULL);
  pthread_mutex_init(&rt->io_lock, NULL);
  weft__idle_init(&rt->idle, c->eager_workers);
  if (ar || !rt->spares || weft__idle_alloc(&rt->idle, c->workers) != 0)
    return -ENOMEM;
  return weft__blocking_init(rt, c);
}

int weft_rt_create(weft_rt **out, const weft_config *cfg) {
  weft_config c;
  if (!out)
    return -EINVAL;
  *out = NULL;
  int r = resolve(cfg, &c);
  if (r)
    return r;
  weft_rt *rt = zalloc_aligned(sizeof(*rt));
  if (!rt)
    return -ENOMEM;
  pthread_attr_init(&rt->thread_attr);
  pthread_attr_init(&rt->lazy_attr);
  r = rt_init(rt, &c);
  if (r) {
    pthread_attr_destroy(&rt->thread_attr);
    pthread_attr_destroy(&rt->lazy_attr);
    arena_unmap(rt);
    free(rt->spares);
    free(rt);
    return r;
  }
  /* The first clock read maps the vDSO data page: pay it here. */
  uint64_t now = weft__now_ns();
  for (unsigned i = 0; i < c.workers; i++) {
    struct weft__shard *sh = &rt->shards[i];
    struct weft__thread *t = &rt->threads[i];
    weft__runq_init(&sh->rq);
    weft__runq_init(&sh->prq);
    weft__lock_init(&sh->tlock);
    pthread_mutex_init(&sh->tcp_lock, NULL);
    weft__wheel_init(&sh->wheel, now);
    weft__store(&sh->timer_next, UINT64_MAX, WA_RLX);
    sh->rt = rt;
    sh->idx = i;
    sh->rng = 0x9e3779b9u * (i + 1);
    sh->peek = i; /* shards look at the others from different places */
    sh->home_next = i;
    t->rt = rt;
    t->idx = i;
    t->shard = sh;
    weft__store(&sh->owner, t, WA_RLX);
    prefill(rt, sh);
  }
  weft__idle_add_dormant(rt);
  /* Before the first thread of ours exists: with other threads of the
   * process running, registering costs a grace period (synchronize_rcu:
   * create took a median 15 ms here, 0.4-0.5 ms without it;
   * shared/context/glommio-first-sleep-*). A process
   * that has threads already pays it here, in create, once. */
  if (!(c.flags & WEFT_CONFIG_NO_MONITOR))
    rt->membarrier_ok = weft__membarrier_register();
  /* Rings or epoll sets, eventfds: before any thread can sleep in them. */
  r = weft__io_init(rt, c.backend);
  if (!r)
    r = start_threads(rt, !(c.flags & WEFT_CONFIG_NO_MONITOR));
  if (r) {
    rt_free(rt);
    return r;
  }
  *out = rt;
  return 0;
}

unsigned weft_rt_workers(const weft_rt *rt) { return rt ? rt->nshards : 0; }

int weft__foreign_enter(weft_rt *rt) {
  /* seq_cst: against shutdown_complete's reads (park.c). If the runtime
   * saw no post in flight, this load of closing sees 1 and we back out. */
  weft__fetch_add(&rt->foreign_inflight, 1, WA_SC);
  if (weft__load(&rt->closing, WA_SC)) {
    weft__foreign_exit(rt);
    return -ESHUTDOWN;
  }
  return 0;
}

void weft__foreign_exit(weft_rt *rt) {
  weft__fetch_sub(&rt->foreign_inflight, 1, WA_SC);
  if (weft__load(&rt->closing, WA_SC))
    weft__poke(rt); /* the last parker may have counted us: recheck */
}

static void wait_done(weft_rt *rt) {
  pthread_mutex_lock(&rt->life_lock);
  while (!weft__load(&rt->done, WA_ACQ))
    pthread_cond_wait(&rt->life_cond, &rt->life_lock);
  pthread_mutex_unlock(&rt->life_lock);
}

static bool on_own_thread(weft_rt *rt) {
  struct weft__thread *t = weft__self();
  return t && t->rt == rt;
}

int weft_rt_shutdown(weft_rt *rt, int how) {
  if (!rt || (how & ~(WEFT_SHUTDOWN_CANCEL | WEFT_SHUTDOWN_NOWAIT)))
    return -EINVAL;
  bool nowait = how & WEFT_SHUTDOWN_NOWAIT;
  if (!nowait && on_own_thread(rt))
    return -EDEADLK;
  pthread_mutex_lock(&rt->life_lock);
  bool again = rt->shutdown_called;
  rt->shutdown_called = true;
  pthread_mutex_unlock(&rt->life_lock);
  if (again)
    return -EALREADY;
  /* Counted as a post in flight while it queues the armed timers'
   * cancellations, so the runtime cannot finish before they are queued. */
  weft__fetch_add(&rt->foreign_inflight, 1, WA_SC);
  if (how & WEFT_SHUTDOWN_CANCEL)
    weft__store(&rt->cancelling, 1, WA_SC);
  weft__store(&rt->closing, 1, WA_SC);
  weft__timers_flush(rt);
  weft__tcp_shutdown(rt);
  weft__blocking_shutdown(rt);
  weft__foreign_exit(rt); /* pokes: an idle runtime has nobody awake */
  if (!nowait)
    wait_done(rt);
  return 0;
}

int weft_rt_wait(weft_rt *rt, uint64_t timeout_ns) {
  if (!rt)
    return -EINVAL;
  if (on_own_thread(rt))
    return -EDEADLK;
  pthread_mutex_lock(&rt->life_lock);
  bool started = rt->shutdown_called;
  pthread_mutex_unlock(&rt->life_lock);
  if (!started)
    return -EINVAL;
  uint64_t deadline = weft__now_ns() + timeout_ns;
  if (deadline < timeout_ns)
    deadline = UINT64_MAX / 2;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                        .tv_nsec = (long)(deadline % 1000000000u)};
  int r = 0;
  pthread_mutex_lock(&rt->life_lock);
  while (!weft__load(&rt->done, WA_ACQ) && r != ETIMEDOUT)
    r = pthread_cond_timedwait(&rt->life_cond, &rt->life_lock, &ts);
  bool done = weft__load(&rt->done, WA_ACQ);
  pthread_mutex_unlock(&rt->life_lock);
  return done ? 0 : -ETIMEDOUT;
}

int weft_rt_destroy(weft_rt *rt) {
  if (!rt)
    return -EINVAL;
  if (on_own_thread(rt))
    return -EDEADLK;
  weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL); /* -EALREADY is fine */
  wait_done(rt);
  /* Nothing runs after done: the monitor's thread exits while the others
   * do. Threads that finish a job or a bypassed handler poke the idle state
   * and nudge the monitor after the count that let the shutdown finish:
   * join them all before the monitor's state and the idle state go away. */
  weft__monitor_stop_soon(rt);
  weft__blocking_destroy(rt);
  join_all(rt);
  weft__monitor_stop(rt);
  rt_free(rt);
  return 0;
}

static void add_shard(weft_shard_stats *o, struct weft__shard *sh) {
  o->handlers_run += weft__load(&sh->st_handlers_run, WA_RLX);
  o->handlers_cancelled += weft__load(&sh->st_handlers_cancelled, WA_RLX);
  o->strands_run += weft__load(&sh->st_strands_run, WA_RLX);
  o->steals += weft__load(&sh->st_steals, WA_RLX);
  o->parks += weft__load(&sh->st_parks, WA_RLX);
  o->wakeups += weft__load(&sh->st_wakeups, WA_RLX);
  o->injected += weft__load(&sh->st_injected, WA_RLX);
  o->timers_fired += weft__load(&sh->st_timers_fired, WA_RLX);
  o->stalls += weft__load(&sh->st_stalls, WA_RLX);
  o->handoffs += weft__load(&sh->st_handoffs, WA_RLX);
  o->io_events += weft__load(&sh->st_io_events, WA_RLX);
  o->io_enters += weft__load(&sh->st_io_enters, WA_RLX);
}

int weft_rt_stats(weft_rt *rt, weft_stats *out) {
  if (!rt || !out)
    return -EINVAL;
  memset(out, 0, sizeof(*out));
  out->shards = rt->nshards;
  uint64_t created = weft__load(&rt->foreign_strands_created, WA_RLX);
  uint64_t freed = weft__load(&rt->foreign_strands_freed, WA_RLX);
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    add_shard(&out->total, sh);
    created += weft__load(&sh->st_strands_created, WA_RLX);
    freed += weft__load(&sh->st_strands_freed, WA_RLX);
  }
  out->strands_live = created >= freed ? created - freed : 0;
  out->handlers_run_after_handoff =
      weft__load(&rt->orphan_handlers_run, WA_RLX);
  out->total.handlers_run += out->handlers_run_after_handoff;
  out->total.handlers_cancelled +=
      weft__load(&rt->orphan_handlers_cancelled, WA_RLX);
  pthread_mutex_lock(&rt->spare_lock);
  for (unsigned i = 0; i < rt->nthreads; i++)
    out->threads += rt->threads[i].slot_state == WEFT_TH_LIVE;
  pthread_mutex_unlock(&rt->spare_lock);
  out->thread_start_errors = weft__load(&rt->thread_start_errors, WA_RLX);
  weft__blocking_stats(rt, out);
  out->total.timers_fired += weft__load(&rt->foreign_timers_fired, WA_RLX);
  out->tcp_live = weft__load(&rt->tcp_live, WA_RLX);
  out->recv_nobufs = weft__load(&rt->recv_nobufs, WA_RLX);
  weft__io_stats(rt, out);
  return 0;
}

int weft_rt_shard_stats(weft_rt *rt, unsigned shard, weft_shard_stats *out) {
  if (!rt || !out)
    return -EINVAL;
  if (shard >= rt->nshards)
    return -ERANGE;
  memset(out, 0, sizeof(*out));
  add_shard(out, &rt->shards[shard]);
  return 0;
}
