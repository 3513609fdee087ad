/*
 * blocking.c - the blocking pool: elastic threads for calls that block,
 * separate from the shards' threads. Owns the pools (weft_blocking's, and
 * name resolution's: resolve.c), their job tables and threads.
 *
 * A job is a slot in a fixed table (allocated in weft_rt_create, so the
 * queue bound is also the memory bound). Its id is (generation << 20) |
 * slot and generations are never reused, so weft_blocking_cancel on a
 * finished job's id is answered -EALREADY, never misapplied. Everything
 * here is under one mutex: a job costs a thread handoff anyway, and no
 * shard thread ever waits for this lock while a job runs (work() is called
 * without it).
 *
 * done is delivered as an ordinary handler (on done_strand, or on any
 * worker), queued before the job stops counting as busy work outside the
 * run loop (rt.c), so a shutdown cannot finish between the two. An
 * accepted job holds done_strand (strand.h) until its done is queued, so
 * a strand released meanwhile still takes it.
 */
#include "blocking.h"

#include "clock.h"
#include "rt.h"
#include "shard.h"
#include "sim.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define SLOT_BITS 20
#define POOL_IDLE_NS (10ull * 1000000000u)
#define DEFAULT_QUEUE 1024

enum { J_FREE, J_QUEUED, J_RUNNING, J_DONE };

struct job {
  weft_job id;
  struct weft__blocking *pool;
  weft_work_fn work;
  void *arg;
  weft_strand *strand;
  weft_done_fn done;
  long result;
  int state;
  weft_rt *rt;
  struct job *prev, *next; /* queue, or free list (next only) */
  uint64_t queued_ns;      /* when it was queued (WEFT_HIST_POOL_WAIT) */
};

struct pool_thread {
  pthread_t tid;
  int state; /* WEFT_TH_* */
};

struct weft__blocking {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct job *jobs, *free, *head, *tail;
  unsigned nslots, queued, queue_max;
  struct pool_thread *threads;
  unsigned max_threads, live, idle;
  uint64_t gen;
  bool stopping;
  unsigned running; /* jobs in work() */
  uint64_t done_count;
  uint64_t busy_ns; /* time spent in work(), summed */
};

static int pool_new(struct weft__blocking **out, unsigned max_threads,
                    unsigned queue_max) {
  /* Each in 64 bits: the sum of two unsigned may wrap in 32. */
  if ((uint64_t)queue_max + max_threads >= (1u << SLOT_BITS))
    return -EINVAL;
  struct weft__blocking *b = calloc(1, sizeof(*b));
  if (!b)
    return -ENOMEM;
  b->max_threads = max_threads;
  b->queue_max = queue_max;
  b->nslots = b->queue_max + b->max_threads;
  b->jobs = calloc(b->nslots, sizeof(*b->jobs));
  b->threads = calloc(b->max_threads, sizeof(*b->threads));
  if (!b->jobs || !b->threads) {
    free(b->jobs);
    free(b->threads);
    free(b);
    return -ENOMEM;
  }
  for (unsigned i = b->nslots; i-- > 0;) {
    b->jobs[i].next = b->free;
    b->free = &b->jobs[i];
  }
  /* Held for a few dozen instructions at a time, by the submitters and
   * by several pool threads per CPU: it spins before it sleeps (glibc's
   * adaptive mutex). As a plain mutex, short jobs (reads from the page
   * cache) spent more CPU in its futex sleeps and wakeups than in work. */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
#ifdef __GLIBC__ /* an enum there, not a macro to test; musl has none */
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
  pthread_mutex_init(&b->lock, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cond, &ca);
  pthread_condattr_destroy(&ca);
  *out = b;
  return 0;
}

int weft__blocking_init(weft_rt *rt, const weft_config *c) {
  /* Both thread bounds are resolved by weft_rt_create. */
  int r = pool_new(&rt->blocking, c->blocking_threads,
                   c->blocking_queue ? c->blocking_queue : DEFAULT_QUEUE);
  if (!r)
    r = pool_new(&rt->resolver, c->resolve_threads, DEFAULT_QUEUE);
  return r;
}

_Thread_local weft_rt *weft__job_rt;

/* Returns j's slot to the free list; lock held. */
static void slot_put(struct weft__blocking *b, struct job *j) {
  j->id = 0;
  j->state = J_FREE;
  j->next = b->free;
  b->free = j;
}

static void done_handler(void *arg) {
  struct job *j = arg;
  struct weft__blocking *b = j->pool;
  weft__calling((void *)j->done);
  j->done(j->arg, j->result);
  pthread_mutex_lock(&b->lock);
  slot_put(b, j);
  b->done_count++;
  pthread_mutex_unlock(&b->lock);
}

/* Queues j's done (j is J_DONE with its result), then lets the runtime
 * stop counting the job. Called without the lock. */
static void deliver(weft_rt *rt, struct job *j) {
  struct weft__shard *local = weft__local_begin(rt);
  struct weft__node *n;
  /* A finished job reports its result even at a CANCEL shutdown: done is
   * its own cancel function. Out of memory: retry, never lose it. */
  while (!(n = weft__node_new(rt, local, done_handler, done_handler, j))) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  /* the hold: weft__blocking_submit's */
  weft__node_post_unhold(rt, local, j->strand, n);
  weft__local_end(local);
  weft__busy_drop(rt, 1);
}

static void unlink_job(struct weft__blocking *b, struct job *j) {
  if (j->prev)
    j->prev->next = j->next;
  else
    b->head = j->next;
  if (j->next)
    j->next->prev = j->prev;
  else
    b->tail = j->prev;
  b->queued--;
}

struct pool_arg {
  weft_rt *rt;
  struct weft__blocking *b;
  struct pool_thread *self;
};

/* Runs queued job j and delivers its done; called and returns with
 * b->lock held, which it drops meanwhile. */
static void run_locked(weft_rt *rt, struct weft__blocking *b, struct job *j) {
  unlink_job(b, j);
  j->state = J_RUNNING;
  b->running++;
  uint64_t queued = j->queued_ns;
  weft_work_fn work = j->work;
  pthread_mutex_unlock(&b->lock);
  uint64_t t0 = weft__now_ns();
  uint64_t wait = t0 > queued ? t0 - queued : 0;
  weft__hist_add_shared(&rt->outside.hist[WEFT_HIST_POOL_WAIT], wait);
  weft__trace(WEFT_EV_JOB, WEFT_TRACE_NO_SHARD, (uintptr_t)work, wait);
#ifdef WEFT_SIM
  if (rt->sim)
    weft__sim_note(rt, -1, (const void *)work, NULL);
#endif
  weft_rt *outer = weft__job_rt; /* a simulation's job runs on its driver */
  weft__job_rt = rt;
  long result = work(j->arg);
  weft__job_rt = outer;
  uint64_t t1 = weft__now_ns();
  weft__trace(WEFT_EV_JOB_END, WEFT_TRACE_NO_SHARD, (uintptr_t)work, 0);
  pthread_mutex_lock(&b->lock);
  j->result = result;
  j->state = J_DONE;
  b->running--;
  b->busy_ns += t1 - t0;
  pthread_mutex_unlock(&b->lock);
  deliver(rt, j);
  pthread_mutex_lock(&b->lock);
}

static void *pool_loop(void *p) {
  struct pool_arg a = *(struct pool_arg *)p;
  free(p);
  struct weft__blocking *b = a.b;
  weft__trace_attach(a.rt, WEFT_RING_POOL, (unsigned)(a.self - b->threads));
  pthread_mutex_lock(&b->lock);
  for (;;) {
    if (!b->head) {
      if (b->stopping)
        break;
      uint64_t dl = weft__now_ns() + POOL_IDLE_NS;
      struct timespec ts = {.tv_sec = (time_t)(dl / 1000000000u),
                            .tv_nsec = (long)(dl % 1000000000u)};
      b->idle++;
      int r = pthread_cond_timedwait(&b->cond, &b->lock, &ts);
      b->idle--;
      if (r == ETIMEDOUT && !b->head)
        break; /* idle for long: exit */
      continue;
    }
    run_locked(a.rt, b, b->head);
  }
  b->live--;
  a.self->state = WEFT_TH_EXITED;
  pthread_mutex_unlock(&b->lock);
  weft__trace_detach();
  return NULL;
}

/* Starts a pool thread if none is idle and the limit allows; lock held.
 * Returns 0, or why no thread could start (-ENOMEM, -EAGAIN): then a
 * live thread, if there is one, takes the job when it is done with its
 * own. */
static int maybe_spawn(weft_rt *rt, struct weft__blocking *b) {
  if (b->idle >= b->queued || b->live >= b->max_threads)
    return 0;
  struct pool_thread *slot = NULL; /* one is not live: live < max */
  for (unsigned i = 0; i < b->max_threads && !slot; i++)
    if (b->threads[i].state != WEFT_TH_LIVE)
      slot = &b->threads[i];
  struct pool_arg *a = malloc(sizeof(*a));
  if (!a)
    return -ENOMEM;
  if (slot->state == WEFT_TH_EXITED)
    pthread_join(slot->tid, NULL);
  a->rt = rt;
  a->b = b;
  a->self = slot;
  int r = weft__spawn(&slot->tid, NULL, pool_loop, a);
  if (r) {
    slot->state = WEFT_TH_FREE;
    free(a);
    return -r;
  }
  slot->state = WEFT_TH_LIVE;
  b->live++;
  return 0;
}

int weft_blocking(weft_rt *rt, weft_work_fn work, void *arg,
                  weft_strand *done_strand, weft_done_fn done, weft_job *job) {
  if (!rt || !work || !done)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  int sr = weft__strand_usable(rt, done_strand);
  if (sr)
    return sr;
  return weft__blocking_submit(rt, rt->blocking, work, arg, done_strand, done,
                               job);
}

int weft__blocking_submit(weft_rt *rt, struct weft__blocking *b,
                          weft_work_fn work, void *arg,
                          weft_strand *done_strand, weft_done_fn done,
                          weft_job *job) {
  /* Busy while the job is accepted, so a shutdown either refuses it or
   * counts it (rt.c). */
  int r = weft__busy_enter(rt);
  if (r)
    return r;
  pthread_mutex_lock(&b->lock);
  /* A CANCEL shutdown's sweep of the queue (pool_shutdown) came between
   * the busy check and the lock: refused, as it would have been a moment
   * later, rather than queued behind the sweep to run after all. */
  if (b->stopping && weft__load(&rt->life.cancelling, WA_ACQ))
    r = -ESHUTDOWN;
  else if (b->queued >= b->queue_max || !b->free)
    r = -EAGAIN;
  if (r) {
    pthread_mutex_unlock(&b->lock);
    weft__busy_drop(rt, 1);
    return r;
  }
  struct job *j = b->free;
  b->free = j->next;
  j->id = (++b->gen << SLOT_BITS) | (weft_job)(j - b->jobs);
  j->work = work;
  j->arg = arg;
  j->strand = done_strand;
  j->done = done;
  j->rt = rt;
  j->pool = b;
  j->state = J_QUEUED;
  j->queued_ns = weft__now_ns();
  j->next = NULL;
  j->prev = b->tail;
  if (b->tail)
    b->tail->next = j;
  else
    b->head = j;
  b->tail = j;
  b->queued++;
  if (b->idle)
    pthread_cond_signal(&b->cond);
  /* A simulation runs jobs itself (weft__blocking_sim_step). */
  r = weft__simulated(rt) ? 0 : maybe_spawn(rt, b);
  /* Accepted only if some thread will run it: a live one (each takes the
   * queue's head whenever it is free, and exits only with the queue empty,
   * both under the lock) or the one just started. */
  if (r && !b->live) {
    unlink_job(b, j);
    slot_put(b, j);
  } else {
    r = 0;
    weft__busy_add(rt, 1);          /* dropped by deliver */
    weft__strand_hold(done_strand); /* dropped by deliver */
    if (job)
      *job = j->id;
  }
  pthread_mutex_unlock(&b->lock);
  weft__busy_drop(rt, 1);
  return r;
}

int weft_blocking_cancel(weft_rt *rt, weft_job id) {
  if (!rt)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  return weft__blocking_cancel_in(rt, rt->blocking, id);
}

int weft__blocking_cancel_in(weft_rt *rt, struct weft__blocking *b,
                             weft_job id) {
  weft_job slot = id & ((1u << SLOT_BITS) - 1);
  pthread_mutex_lock(&b->lock);
  struct job *j = slot < b->nslots ? &b->jobs[slot] : NULL;
  if (!j || j->id != id || j->state != J_QUEUED) {
    pthread_mutex_unlock(&b->lock);
    return -EALREADY;
  }
  unlink_job(b, j);
  j->state = J_DONE;
  j->result = -ECANCELED;
  pthread_mutex_unlock(&b->lock);
  deliver(rt, j);
  return 0;
}

static void pool_shutdown(weft_rt *rt, struct weft__blocking *b) {
  bool cancel = weft__load(&rt->life.cancelling, WA_ACQ);
  for (;;) {
    pthread_mutex_lock(&b->lock);
    b->stopping = true;
    pthread_cond_broadcast(&b->cond);
    struct job *j = cancel ? b->head : NULL;
    if (j) {
      unlink_job(b, j);
      j->state = J_DONE;
      j->result = -ECANCELED;
    }
    pthread_mutex_unlock(&b->lock);
    if (!j)
      return;
    deliver(rt, j);
  }
}

void weft__blocking_shutdown(weft_rt *rt) {
  pool_shutdown(rt, rt->blocking);
  pool_shutdown(rt, rt->resolver);
}

#ifdef WEFT_SIM
unsigned weft__blocking_sim_queued(weft_rt *rt) {
  unsigned n = 0;
  struct weft__blocking *pools[] = {rt->blocking, rt->resolver};
  for (int i = 0; i < 2; i++) {
    pthread_mutex_lock(&pools[i]->lock);
    n += pools[i]->queued;
    pthread_mutex_unlock(&pools[i]->lock);
  }
  return n;
}

void weft__blocking_sim_step(weft_rt *rt, unsigned k) {
  struct weft__blocking *pools[] = {rt->blocking, rt->resolver};
  for (int i = 0; i < 2; i++) {
    struct weft__blocking *b = pools[i];
    pthread_mutex_lock(&b->lock);
    struct job *j = b->head;
    for (; j && k; j = j->next)
      k--;
    if (j)
      run_locked(rt, b, j);
    pthread_mutex_unlock(&b->lock);
    if (j)
      return;
  }
}
#endif

void weft__blocking_stats(weft_rt *rt, weft_stats *out) {
  struct weft__blocking *b = rt->blocking;
  pthread_mutex_lock(&b->lock);
  out->blocking_done = b->done_count;
  out->blocking_busy_ns = b->busy_ns;
  out->blocking_threads = b->live;
  out->blocking_queued = b->queued;
  out->blocking_running = b->running;
  pthread_mutex_unlock(&b->lock);
}

static void pool_free(struct weft__blocking *b) {
  if (!b)
    return;
  pthread_mutex_lock(&b->lock);
  b->stopping = true;
  pthread_cond_broadcast(&b->cond);
  pthread_mutex_unlock(&b->lock);
  for (unsigned i = 0; i < b->max_threads; i++) {
    pthread_mutex_lock(&b->lock);
    bool started = b->threads[i].state != WEFT_TH_FREE;
    pthread_t tid = b->threads[i].tid;
    pthread_mutex_unlock(&b->lock);
    if (started)
      pthread_join(tid, NULL);
  }
  pthread_mutex_destroy(&b->lock);
  pthread_cond_destroy(&b->cond);
  free(b->jobs);
  free(b->threads);
  free(b);
}

void weft__blocking_destroy(weft_rt *rt) {
  pool_free(rt->blocking);
  pool_free(rt->resolver);
  rt->blocking = rt->resolver = NULL;
}
