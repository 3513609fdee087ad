/*
 * rt.c - the runtime's life: configuration, create, shutdown, destroy, the
 * count of work outside the run loop, and statistics. Owns the weft_rt
 * struct and the arena that holds its shards and thread slots.
 *
 * Every one-time cost is paid in weft_rt_create: shards, queues, the
 * sleeper list, one batch of pooled objects per shard, and the eager
 * threads, which have all reached their loop when it returns. The other
 * shards' threads are dormant until first needed (park.c). Threads wait
 * for each other only on a condition variable, never by spinning.
 *
 * Work outside the run loop. A shutdown finishes when every thread is
 * parked and nothing else can still queue work or hold a descriptor
 * (park.c, shutdown_complete_locked). The things outside the run loop
 * that can are counted in one word, life.busy: a post or timer start from
 * a thread outside the runtime while it is in progress (weft__busy_enter),
 * a blocking job from its acceptance to the post of its done
 * (blocking.c), an open socket descriptor (sock.c; an io_uring close until
 * an enter has taken it), and a handler whose shard the monitor handed on,
 * until it returns (monitor.c, strand.c). Each counts itself before it can
 * push anything and drops its count after its last push, and a drop while
 * closing pokes a sleeper to check again. One word, so the check reads one
 * count: a drop of one thing cannot pass a rise of another between two
 * reads.
 */
#include "rt.h"

#include "backtrace.h"
#include "blocking.h"
#include "clock.h"
#include "io.h"
#include "listen.h"
#include "monitor.h"
#include "park.h"
#include "process.h"
#include "shard.h"
#include "signal.h"
#include "sim.h"
#include "sock.h"
#include "strand.h"
#include "tcp.h"
#include "thread.h"
#include "timer.h"
#include "udp.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEFAULT_BATCH 64

void weft_config_init_sized(weft_config *cfg, size_t size) {
  if (cfg)
    memset(cfg, 0, size);
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
 * itself and zero already. From malloc, the same memory cost one page
 * fault per page on every create (glibc gives the heap's top back at
 * free), all on the creating thread. The shards' own pools (strands,
 * timers) get their batch each, one shard's after the other's. */
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

/* Fills a shard's pool caches with one batch each, so the first posts do
 * not take the depot lock or carve slabs. */
static void prefill(weft_rt *rt, struct weft__shard *sh) {
  void *n = weft__pool_alloc(&rt->node_pool, &sh->cache.node);
  if (n)
    weft__pool_free(&rt->node_pool, &sh->cache.node, n);
  void *s = weft__pool_alloc(&sh->strand_pool, &sh->cache.strand);
  if (s)
    weft__pool_free(&sh->strand_pool, &sh->cache.strand, s);
  void *t = weft__pool_alloc(&sh->timer_pool, &sh->cache.timer);
  if (t)
    weft__pool_free(&sh->timer_pool, &sh->cache.timer, t);
}

/* Frees what rt_init and create made; safe on a runtime whose init failed
 * part way (every field it reads is zero or initialized). */
static void rt_free(weft_rt *rt) {
  weft__listen_destroy(rt);
  weft__udp_destroy(rt);
  weft__process_destroy(rt);
  weft__tcp_destroy(rt);
  weft__io_destroy(rt);
  if (rt->arena) {
    for (unsigned i = 0; i < rt->nshards; i++) {
      weft__pool_destroy(&rt->shards[i].strand_pool);
      weft__pool_destroy(&rt->shards[i].timer_pool);
    }
    munmap(rt->arena, rt->arena_bytes);
  }
  weft__pool_destroy(&rt->node_pool);
  weft__inject_destroy(&rt->inject);
  weft__blocking_destroy(rt); /* no-op if destroy already did it */
  weft__idle_destroy(&rt->idle);
  pthread_mutex_destroy(&rt->life.lock);
  pthread_cond_destroy(&rt->life.cond);
  pthread_mutex_destroy(&rt->th.spare_lock);
  pthread_mutex_destroy(&rt->io.lock);
  pthread_attr_destroy(&rt->th.attr);
  pthread_attr_destroy(&rt->th.lazy_attr);
  free(rt->th.spares);
  weft__trace_free(rt);
#ifdef WEFT_SIM
  weft__sim_detach(rt);
#endif
  free(rt);
}

#define DEFAULT_TIMER_SPIN_NS 20000u
#define DEFAULT_STACK_SIZE ((size_t)512 * 1024)
#define MIN_STACK_SIZE ((size_t)16384)
#define DEFAULT_STALL_NS 1000000u
#define MIN_STALL_NS 50000u

/* The caller's configuration, size bytes of it (its header's struct),
 * into a weft_config of this library's: a shorter one is zero-extended
 * (the fields it lacks take their defaults), a longer one must be zero
 * beyond this library's struct (fields this library does not know). */
static int config_copy(const weft_config *in, size_t size, weft_config *out) {
  memset(out, 0, sizeof(*out));
  if (!in)
    return 0;
  if (size > sizeof(*out)) {
    const unsigned char *tail = (const unsigned char *)in + sizeof(*out);
    for (size_t i = 0; i < size - sizeof(*out); i++)
      if (tail[i])
        return -E2BIG;
    size = sizeof(*out);
  }
  memcpy(out, in, size);
  return 0;
}

/* Checks cfg and resolves its zeros. */
static int resolve(weft_config *out) {
  if ((out->flags & ~(WEFT_CONFIG_NO_MONITOR | WEFT_CONFIG_NO_TIMER_SPIN |
                      WEFT_CONFIG_NO_TRACE)) ||
      (out->trace_bytes && out->trace_bytes < WEFT_TRACE_MIN_BYTES) ||
      out->trace_bytes > ((size_t)1 << 34) || out->workers > WEFT_MAX_WORKERS ||
      out->batch > WEFT_MAX_BATCH ||
      (out->stall_threshold_ns && out->stall_threshold_ns < MIN_STALL_NS) ||
      (out->max_threads && out->max_threads < out->workers) ||
      out->max_threads > 4 * WEFT_MAX_WORKERS || out->backend < 0 ||
      (out->stack_size && out->stack_size < MIN_STACK_SIZE) ||
      out->stack_size > ((size_t)1 << 40) || out->backend > WEFT_BACKEND_NONE ||
      out->log_level < 0 || out->log_level > WEFT_LOG_DEBUG ||
      weft__backtrace_resolve(&out->stall_signal))
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
  /* Blocking calls mostly wait (on a disk, a name server), so the pool
   * may run more threads than CPUs, but not one per job of a burst: 4 per
   * CPU, at most 64, overlap the waits without crowding the CPUs. */
  if (!out->blocking_threads) {
    unsigned n = 4 * cpus_allowed();
    out->blocking_threads = n < 64 ? n : 64;
  }
  if (!out->resolve_threads)
    out->resolve_threads = 8;
  if (!out->eager_workers)
    out->eager_workers = cpus_allowed();
  if (out->eager_workers > out->workers || out->sim_seed)
    out->eager_workers = out->workers; /* a simulation's never sleep */
  return 0;
}

/* Joins every thread that ever started: shard threads, spares (the done
 * wakeup made them exit) and threads that exited idle. slot_state is read
 * under spare_lock; the joins happen outside it (exiting threads take it). */
static void join_all(weft_rt *rt) {
  for (unsigned i = 0;; i++) {
    pthread_mutex_lock(&rt->th.spare_lock);
    bool more = i < rt->th.n;
    int st = more ? rt->threads[i].slot_state : WEFT_TH_FREE;
    bool started = st == WEFT_TH_LIVE || st == WEFT_TH_EXITED;
    pthread_t tid = more ? rt->threads[i].tid : (pthread_t)0;
    pthread_mutex_unlock(&rt->th.spare_lock);
    if (!more)
      return;
    if (started)
      pthread_join(tid, NULL);
  }
}

static void wait_done(weft_rt *rt) {
#ifdef WEFT_SIM
  if (rt->sim) {
    weft__sim_run(rt, UINT64_MAX);
    return;
  }
#endif
  pthread_mutex_lock(&rt->life.lock);
  while (!weft__load(&rt->life.done, WA_ACQ))
    pthread_cond_wait(&rt->life.cond, &rt->life.lock);
  pthread_mutex_unlock(&rt->life.lock);
}

/* Starts the eager shards' threads, one spare and the monitor. */
static int start_threads(weft_rt *rt, bool monitor) {
  int err = 0;
  unsigned i;
  for (i = 0; i < rt->th.neager; i++) {
    rt->threads[i].slot_state = WEFT_TH_LIVE;
    err = weft__spawn(&rt->threads[i].tid, &rt->th.attr, weft__thread_entry,
                      &rt->threads[i]);
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
  if (!err) {
    pthread_mutex_lock(&rt->life.lock);
    while (rt->life.started < rt->th.neager)
      pthread_cond_wait(&rt->life.cond, &rt->life.lock);
    pthread_mutex_unlock(&rt->life.lock);
    return 0;
  }
  /* Stop the ones that started: nothing was accepted yet. */
  weft__store(&rt->life.closing, 1, WA_SC);
  /* Threads that did not start are counted as parked for completion,
   * under idle.lock like every change of the unparked count (park.c). */
  pthread_mutex_lock(&rt->idle.lock);
  weft__fetch_sub(&rt->idle.state, (uint64_t)(rt->th.neager - i) << 32, WA_SC);
  pthread_mutex_unlock(&rt->idle.lock);
  weft__poke(rt);
  if (i > 0)
    wait_done(rt);
  weft__monitor_stop(rt);
  join_all(rt);
  return -EAGAIN;
}

/* The attributes of lazily started threads: the creator's CPU affinity and
 * scheduling policy, as the eager threads inherit them (park.c). */
static void lazy_attr_init(weft_rt *rt) {
  cpu_set_t set;
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0)
    pthread_attr_setaffinity_np(&rt->th.lazy_attr, sizeof(set), &set);
  int policy;
  struct sched_param sp;
  /* Explicit only if glibc takes both (it refuses SCHED_DEADLINE and may
   * refuse others): else inherited. */
  if (pthread_getschedparam(pthread_self(), &policy, &sp) == 0 &&
      pthread_attr_setschedpolicy(&rt->th.lazy_attr, policy) == 0 &&
      pthread_attr_setschedparam(&rt->th.lazy_attr, &sp) == 0)
    pthread_attr_setinheritsched(&rt->th.lazy_attr, PTHREAD_EXPLICIT_SCHED);
}

static int rt_init(weft_rt *rt, const weft_config *c) {
  weft__hist_calibrate();          /* before the recorder reads ticks */
  int r = weft__trace_init(rt, c); /* first: rt_free destroys its lock */
  if (r)
    return r;
  rt->nshards = c->workers;
  rt->batch = c->batch;
  rt->tm.slack_ns = c->timer_slack_ns;
  rt->tm.spin_ns =
      (c->flags & WEFT_CONFIG_NO_TIMER_SPIN) ? 0 : c->timer_spin_ns;
  rt->mon.stall_ns = c->stall_threshold_ns;
  rt->mon.on_stall = c->on_stall;
  rt->mon.on_stall_ctx = c->on_stall_ctx;
  weft__log_init(&rt->log, c);
  rt->th.max = c->max_threads;
  rt->th.n = c->workers;
  rt->th.neager = c->eager_workers;
  pthread_attr_init(&rt->th.attr);
  pthread_attr_init(&rt->th.lazy_attr);
  weft__pool_init(&rt->node_pool, sizeof(struct weft__node));
  weft__inject_init(&rt->inject);
  pthread_mutex_init(&rt->life.lock, NULL);
  pthread_condattr_t ca; /* weft_rt_wait measures CLOCK_MONOTONIC */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rt->life.cond, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&rt->th.spare_lock, NULL);
  pthread_mutex_init(&rt->io.lock, NULL);
  weft__idle_init(&rt->idle, c->eager_workers);
  r = weft__idle_alloc(&rt->idle, c->workers);
  if (r)
    return r;
  weft__tcp_init(rt);
  weft__listen_init(rt);
  weft__udp_init(rt);
  weft__process_init(rt);
  /* EINVAL: below this platform's PTHREAD_STACK_MIN */
  r = pthread_attr_setstacksize(&rt->th.attr, c->stack_size);
  if (r)
    return -r;
  pthread_attr_setstacksize(&rt->th.lazy_attr, c->stack_size);
  if (rt->th.neager < rt->nshards)
    lazy_attr_init(rt);
  rt->th.spares = calloc(c->max_threads, sizeof(*rt->th.spares));
  if (!rt->th.spares || arena_map(rt, c->workers, c->max_threads))
    return -ENOMEM;
  return weft__blocking_init(rt, c);
}

static void shards_init(weft_rt *rt) {
  /* The first clock read maps the vDSO data page: pay it here. */
  uint64_t now = weft__now_ns();
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    struct weft__thread *t = &rt->threads[i];
    weft__runq_init(&sh->rq);
    weft__runq_init(&sh->prq);
    weft__timers_init(&sh->tm, now);
    sh->rt = rt;
    sh->idx = i;
    sh->rng = 0x9e3779b9u * (i + 1);
#ifdef WEFT_SIM
    if (rt->sim)
      sh->rng = weft__sim_shard_seed(rt, i);
#endif
    sh->peek = i; /* shards look at the others from different places */
    sh->home_next = i;
    t->rt = rt;
    t->idx = i;
    t->shard = sh;
    weft__store(&sh->owner, t, WA_RLX);
    prefill(rt, sh);
  }
}

_Atomic uint32_t weft__fork_gen;

static void forked_child(void) { weft__fetch_add(&weft__fork_gen, 1, WA_RLX); }

static void atfork_register(void) { pthread_atfork(NULL, NULL, forked_child); }

int weft_rt_create_sized(weft_rt **out, const weft_config *cfg,
                         size_t cfg_size) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  weft_config c;
  if (!out)
    return -EINVAL;
  pthread_once(&once, atfork_register);
  *out = NULL;
  int r = config_copy(cfg, cfg_size, &c);
#ifdef WEFT_SIM
  if (!r)
    r = weft__sim_config(&c);
#else
  if (!r && c.sim_seed)
    r = -ENOTSUP; /* a simulation needs the weft_sim library */
#endif
  if (!r)
    r = resolve(&c);
  if (r)
    return r;
  weft_rt *rt = zalloc_aligned(sizeof(*rt));
  if (!rt)
    return -ENOMEM;
  rt->fork_gen = weft__load(&weft__fork_gen, WA_RLX);
  r = rt_init(rt, &c);
#ifdef WEFT_SIM
  if (!r) /* after rt_init, which times the ticks against the real clock */
    r = weft__sim_attach(rt, &c);
#else
  if (!r && getenv("WEFT_SIM_SEED"))
    weft__log(rt, WEFT_LOG_WARN,
              "WEFT_SIM_SEED is set, but only the weft_sim library "
              "simulates: this runtime is real");
#endif
  if (r) {
    rt_free(rt);
    return r;
  }
  shards_init(rt);
  weft__idle_add_dormant(rt);
  /* Before the first thread of ours exists: with other threads of the
   * process running, registering costs an RCU grace period, tens of
   * milliseconds (docs/cases.md, "Glommio's first sleep"). A process that
   * has threads already pays it here, in create, once. */
  if (!(c.flags & WEFT_CONFIG_NO_MONITOR) && !weft__simulated(rt)) {
    rt->mon.membarrier_ok = weft__membarrier_register();
    /* Before the first thread too: each unblocks the signal at its start,
     * and it must find weft's handler there. */
    weft__backtrace_install(rt, c.stall_signal);
  }
  /* Rings or epoll sets, eventfds: before any thread can sleep in them. */
  r = weft__io_init(rt, c.backend);
  if (!r && !weft__simulated(rt)) /* a simulation's run where it is waited */
    r = start_threads(rt, !(c.flags & WEFT_CONFIG_NO_MONITOR));
  if (r) {
    rt_free(rt);
    return r;
  }
  *out = rt;
  return 0;
}

unsigned weft_rt_workers(const weft_rt *rt) { return rt ? rt->nshards : 0; }

int weft__busy_enter(weft_rt *rt) {
  /* seq_cst: against shutdown_complete_locked's reads (park.c). If that
   * check read busy before this add, this load of closing sees 1 and we
   * back out. */
  weft__fetch_add(&rt->life.busy, 1, WA_SC);
  if (weft__load(&rt->life.closing, WA_SC)) {
    weft__busy_drop(rt, 1);
    return -ESHUTDOWN;
  }
  return 0;
}

void weft__busy_add(weft_rt *rt, int64_t n) {
  weft__fetch_add(&rt->life.busy, n, WA_SC);
}

void weft__busy_drop(weft_rt *rt, int64_t n) {
  weft__fetch_sub(&rt->life.busy, n, WA_SC);
  if (weft__load(&rt->life.closing, WA_SC))
    weft__poke(rt); /* the last parker may have counted us: recheck */
}

static bool on_own_thread(weft_rt *rt) {
  struct weft__thread *t = weft__self();
  return (t && t->rt == rt) || weft__job_rt == rt;
}

/* Around weft_rt_shutdown and weft_rt_wait: a thread inside either may
 * still be waking from the done broadcast, or finishing a NOWAIT
 * shutdown's pokes, when weft_rt_destroy's own wait ends; destroy waits for
 * the count to fall to 0, and a caller touches nothing of rt after its
 * leave unlocks. */
static void caller_enter(weft_rt *rt) {
  pthread_mutex_lock(&rt->life.lock);
  rt->life.callers++;
  pthread_mutex_unlock(&rt->life.lock);
}

static void caller_leave(weft_rt *rt) {
  pthread_mutex_lock(&rt->life.lock);
  if (--rt->life.callers == 0)
    pthread_cond_broadcast(&rt->life.cond);
  pthread_mutex_unlock(&rt->life.lock);
}

/* The shutdown's start: 0, or -EALREADY. */
static int shutdown_begin(weft_rt *rt, int how) {
  pthread_mutex_lock(&rt->life.lock);
  bool again = rt->life.shutdown_called;
  rt->life.shutdown_called = true;
  pthread_mutex_unlock(&rt->life.lock);
  if (again)
    return -EALREADY;
  /* Busy while it queues the armed timers' cancellations and signals the
   * sockets, so the runtime cannot finish before they are queued. */
  weft__busy_add(rt, 1);
  if (how & WEFT_SHUTDOWN_CANCEL)
    weft__store(&rt->life.cancelling, 1, WA_SC);
  weft__store(&rt->life.closing, 1, WA_SC);
  weft__timers_flush(rt);
  weft__socks_shutdown(rt);
  weft__blocking_shutdown(rt);
  weft__busy_drop(rt, 1); /* pokes: an idle runtime has nobody awake */
  return 0;
}

int weft_rt_shutdown(weft_rt *rt, int how) {
  if (!rt || (how & ~(WEFT_SHUTDOWN_CANCEL | WEFT_SHUTDOWN_NOWAIT)))
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  bool nowait = how & WEFT_SHUTDOWN_NOWAIT;
  if (!nowait && on_own_thread(rt))
    return -EDEADLK;
  caller_enter(rt);
  int r = shutdown_begin(rt, how);
  if (!r && !nowait)
    wait_done(rt);
  caller_leave(rt);
  return r;
}

int weft_rt_wait(weft_rt *rt, uint64_t timeout_ns) {
  if (!rt)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (on_own_thread(rt))
    return -EDEADLK;
  uint64_t deadline = weft__now_ns() + timeout_ns;
#ifdef WEFT_SIM
  if (rt->sim) { /* virtual time; an overflow is for ever (sim.c) */
    caller_enter(rt);
    int r = weft__sim_run(rt, deadline < timeout_ns ? UINT64_MAX : deadline);
    caller_leave(rt);
    return r;
  }
#endif
  if (deadline < timeout_ns)
    deadline = UINT64_MAX / 2;
  struct timespec ts = weft__timespec(deadline);
  int r = 0;
  pthread_mutex_lock(&rt->life.lock);
  rt->life.callers++;
  while (!weft__load(&rt->life.done, WA_ACQ) && r != ETIMEDOUT)
    r = pthread_cond_timedwait(&rt->life.cond, &rt->life.lock, &ts);
  bool done = weft__load(&rt->life.done, WA_ACQ);
  if (--rt->life.callers == 0) /* caller_leave */
    pthread_cond_broadcast(&rt->life.cond);
  pthread_mutex_unlock(&rt->life.lock);
  return done ? 0 : -ETIMEDOUT;
}

int weft_rt_destroy(weft_rt *rt) {
  if (!rt)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD; /* its threads are not here to join, nor to unlock */
  if (on_own_thread(rt))
    return -EDEADLK;
  shutdown_begin(rt, WEFT_SHUTDOWN_CANCEL); /* -EALREADY is fine */
  wait_done(rt);
  pthread_mutex_lock(&rt->life.lock);
  while (rt->life.callers)
    pthread_cond_wait(&rt->life.cond, &rt->life.lock);
  pthread_mutex_unlock(&rt->life.lock);
  weft__signals_forget(rt);
  /* Nothing runs after done, but the monitor may be inside a scan that
   * saw a handler still running and reports it now: its on_stall may read
   * the runtime's statistics, the blocking pools' included, so the
   * monitor's thread is joined before anything goes away. Threads that
   * finish a job or a bypassed handler poke the idle state and nudge the
   * monitor after the count that let the shutdown finish: join them all
   * before the monitor's state and the idle state go away. */
  weft__monitor_join(rt);
  weft__blocking_destroy(rt);
  join_all(rt);
  weft__monitor_stop(rt);
  rt_free(rt);
  return 0;
}

/* ---- statistics --------------------------------------------------------- */

static void add_shard(weft_shard_stats *o, struct weft__shard *sh) {
  struct weft__shard_counters *c = &sh->st;
  o->handlers_run += weft__load(&c->handlers_run, WA_RLX);
  o->handlers_cancelled += weft__load(&c->handlers_cancelled, WA_RLX);
  o->strands_run += weft__load(&c->strands_run, WA_RLX);
  o->steals += weft__load(&c->steals, WA_RLX);
  o->parks += weft__load(&c->parks, WA_RLX);
  o->wakeups += weft__load(&c->wakeups, WA_RLX);
  o->injected += weft__load(&c->injected, WA_RLX);
  o->timers_fired += weft__load(&c->timers_fired, WA_RLX);
  o->stalls += weft__load(&c->stalls, WA_RLX);
  o->handoffs += weft__load(&c->handoffs, WA_RLX);
  o->io_events += weft__load(&c->io_events, WA_RLX);
  o->io_enters += weft__load(&c->io_enters, WA_RLX);
}

/* Gives the caller size bytes of *src (its header's struct): a shorter one
 * gets the fields it knows, a longer one zeros beyond ours. */
static void copy_out(void *dst, size_t size, const void *src, size_t ours) {
  memcpy(dst, src, size < ours ? size : ours);
  if (size > ours)
    memset((char *)dst + ours, 0, size - ours);
}

int weft_rt_stats_sized(weft_rt *rt, weft_stats *out, size_t size) {
  if (!rt || !out)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  weft_stats s;
  memset(&s, 0, sizeof(s));
  s.shards = rt->nshards;
  uint64_t created = weft__load(&rt->outside.strands_created, WA_RLX);
  uint64_t freed = weft__load(&rt->outside.strands_freed, WA_RLX);
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    add_shard(&s.total, sh);
    created += weft__load(&sh->st.strands_created, WA_RLX);
    freed += weft__load(&sh->st.strands_freed, WA_RLX);
  }
  s.strands_live = created >= freed ? created - freed : 0;
  s.handlers_run_after_handoff = weft__load(&rt->outside.handlers_run, WA_RLX);
  s.total.handlers_run += s.handlers_run_after_handoff;
  s.handlers_cancelled_outside =
      weft__load(&rt->outside.handlers_cancelled, WA_RLX);
  s.total.handlers_cancelled += s.handlers_cancelled_outside;
  s.timers_fired_outside = weft__load(&rt->outside.timers_fired, WA_RLX);
  s.total.timers_fired += s.timers_fired_outside;
  pthread_mutex_lock(&rt->th.spare_lock);
  for (unsigned i = 0; i < rt->th.n; i++)
    s.threads += rt->threads[i].slot_state == WEFT_TH_LIVE;
  pthread_mutex_unlock(&rt->th.spare_lock);
  s.thread_start_errors = weft__load(&rt->th.start_errors, WA_RLX);
  weft__blocking_stats(rt, &s);
  weft__net_stats(rt, &s);
  weft__io_stats(rt, &s);
  copy_out(out, size, &s, sizeof(s));
  return 0;
}

int weft_rt_shard_stats_sized(weft_rt *rt, unsigned shard,
                              weft_shard_stats *out, size_t size) {
  if (!rt || !out)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (shard >= rt->nshards)
    return -ERANGE;
  weft_shard_stats s;
  memset(&s, 0, sizeof(s));
  add_shard(&s, &rt->shards[shard]);
  copy_out(out, size, &s, sizeof(s));
  return 0;
}
