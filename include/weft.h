/*
 * weft.h - the one public header of weft, a multi-threaded asynchronous
 * runtime for servers on Linux.
 *
 * Promise: unrelated work never waits on unrelated work. A handler that runs
 * long delays only its own strand.
 *
 * Conventions
 *  - Every type is opaque unless it is a plain configuration or statistics
 *    struct. Every name starts with weft_ / WEFT_.
 *  - Every function that can fail returns 0 (or a non-negative value where
 *    documented) on success and a negative errno value on failure. weft never
 *    sets or reads errno for its own results; weft_strerror() names an error.
 *  - Thread-safety is stated beside each declaration. "Any thread" means any
 *    thread of the process, inside a handler of this runtime or not.
 *  - fork: in a child process, a runtime created before the fork has none
 *    of its threads, and its locks may be held by threads that are not
 *    there. Every call on it or its objects returns -ECHILD at once (calls
 *    that return nothing do nothing), weft_rt_destroy included, which
 *    frees nothing there. The child may create and use runtimes of its
 *    own. (exec, or _exit, is what a child usually does next anyway.)
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(WEFT_STATIC)
#define WEFT_API
#elif defined(WEFT_BUILDING)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 3
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION_HEX                                                       \
  ((WEFT_VERSION_MAJOR << 16) | (WEFT_VERSION_MINOR << 8) | WEFT_VERSION_PATCH)

/* The version of the library linked at run time, as WEFT_VERSION_HEX and as
 * "MAJOR.MINOR.PATCH". Any thread. */
WEFT_API unsigned weft_version(void);
WEFT_API const char *weft_version_string(void);

/* A static, human-readable description of a negative errno value returned by
 * weft (also accepts the positive value). Never NULL. Any thread. */
WEFT_API const char *weft_strerror(int err);

typedef struct weft_rt weft_rt;
typedef struct weft_strand weft_strand;

/* A handler: fn(arg). A cancel function has the same type and receives the
 * same arg; it runs instead of the handler, exactly once, when the handler
 * can no longer run (weft_rt_shutdown with WEFT_SHUTDOWN_CANCEL). */
typedef void (*weft_fn)(void *arg);

/* Largest accepted worker count. */
#define WEFT_MAX_WORKERS 1024
/* Largest accepted strand batch. */
#define WEFT_MAX_BATCH 65536

/* A stall: a handler that has run longer than the stall threshold. */
typedef struct weft_stall {
  unsigned shard;      /* the shard whose thread is inside the handler */
  weft_strand *strand; /* its strand, or NULL */
  void *handler;       /* the function it is in: the handler, or the timer,
                          socket or blocking-pool callback weft called */
  uint64_t running_ns; /* how long it had run when noticed */
  int handed_off;      /* 1: the shard was handed to another thread */
} weft_stall;

/* Called on the runtime's monitor thread once per stall; it must return
 * quickly and must not call weft functions that wait. */
typedef void (*weft_stall_fn)(const weft_stall *stall, void *ctx);

/* Log levels, most severe first. */
#define WEFT_LOG_ERROR 1 /* weft could not do what it promised */
#define WEFT_LOG_WARN 2  /* a stall; a resource ran out and weft copes */
#define WEFT_LOG_INFO 3  /* a change of mode (backend fallback, ...) */
#define WEFT_LOG_DEBUG 4 /* misuse a call also reports as an error code */

/* Every message weft writes goes through this: msg is one line without
 * a newline, valid only during the call. Called from any of the
 * runtime's threads (and from a thread inside a weft call), possibly from
 * several at once; it must return quickly and must not call weft
 * functions that wait. */
typedef void (*weft_log_fn)(void *ctx, int level, const char *msg);

/* weft_config.flags */
#define WEFT_CONFIG_NO_MONITOR 1u    /* no monitor: no handoff, no reports */
#define WEFT_CONFIG_NO_TIMER_SPIN 2u /* always sleep: see timer_spin_ns */

/* weft_config.backend: how the shards wait for sockets. AUTO takes
 * io_uring and falls back to epoll by itself when io_uring is refused
 * (kernel.io_uring_disabled, a seccomp filter, ENOSYS, a missing opcode);
 * the environment variable WEFT_BACKEND=uring|epoll|none overrides AUTO.
 * URING or EPOLL forces one: weft_rt_create fails if it cannot be set up.
 * A successful io_uring probe is remembered for the process: if io_uring
 * is refused later (a seccomp filter installed after it), the first
 * weft_tcp_listen or weft_tcp_connect of a runtime fails with the error.
 * NONE: no sockets (the weft_tcp_* functions return -ENOTSUP); shards
 * sleep on futexes. */
#define WEFT_BACKEND_AUTO 0
#define WEFT_BACKEND_URING 1
#define WEFT_BACKEND_EPOLL 2
#define WEFT_BACKEND_NONE 3

typedef struct weft_config {
  /* Number of shards, each with its own thread. 0: the number of CPUs
   * this process may run on (sched_getaffinity). 1..WEFT_MAX_WORKERS. */
  unsigned workers;
  /* Handlers a strand runs in one turn before it requeues itself at the back
   * of the run queue, so a busy strand cannot starve others. 0: 64. */
  unsigned batch;
  /* Timer slack of the runtime's threads (prctl PR_SET_TIMERSLACK), in
   * nanoseconds. 0: 1 ns, so sleeps end at the deadline (Linux's default of
   * 50 us would make every timer up to 50 us late). Larger values save
   * wakeups at the cost of lateness. */
  unsigned timer_slack_ns;
  /* A thread with nothing to run whose shard's next timer is due within
   * this many nanoseconds waits for it by polling the clock instead of
   * sleeping: the kernel takes longer than that to wake a thread (tens of
   * microseconds on a virtual machine), so the sleep would end late. It costs
   * CPU only in the last timer_spin_ns before a deadline, and stops as soon as
   * work is posted; socket events that arrive meanwhile wait for the end of the
   * spin. 0: 20000 (20 us); WEFT_CONFIG_NO_TIMER_SPIN turns it off. */
  unsigned timer_spin_ns;
  /* WEFT_CONFIG_* bits; others must be zero. */
  unsigned flags;
  /* A handler running longer than this is a stall: its shard (run queue,
   * timers) is handed to a spare thread and the stall is reported. The
   * monitor thread looks at the shards: while handlers are few enough that
   * a clock read each costs less than the looks it saves (the busiest
   * shard under about a million handlers a second where the clock is read
   * through the vDSO; the monitor times the read when it starts), and the
   * kernel has membarrier (4.14), the runtime's threads stamp each
   * handler's start and the monitor looks when a handler could be 1.4
   * thresholds old, at most that far apart; with more handlers it looks
   * every half threshold. Either way a blocked handler is noticed between
   * the threshold and 1.5 times it (one that computes, a look later; each
   * look up to a twentieth of a threshold late, its timer slack). Under
   * load each look costs the machine a thread wakeup, about 1 / (1.4
   * thresholds) a second while stamped, 2 / threshold while sampled
   * (docs/design.md, "Stamps and samples"). 0: 1 ms (1000000). At least
   * 50000 (50 us). */
  uint64_t stall_threshold_ns;
  /* Most threads the runtime may run for its shards, spares included.
   * 0: 2 * workers + 4. At least workers. */
  unsigned max_threads;
  /* weft_blocking: most pool threads (0: 4 per CPU the process may run
   * on, at most 64) and most jobs waiting for a thread (0: 1024). */
  unsigned blocking_threads;
  unsigned blocking_queue;
  /* Stall reports: NULL logs one line (WEFT_LOG_WARN) naming the handler,
   * at most once a second. */
  weft_stall_fn on_stall;
  void *on_stall_ctx;
  /* WEFT_BACKEND_*; 0: AUTO. */
  int backend;
  /* Stack size of the runtime's threads (shards, spares, monitor) in
   * bytes, rounded up to a page. 0: 512 KiB, as macOS gives its secondary
   * threads (glibc's default is 8 MiB): 66 threads then fit glibc's cache
   * of freed stacks, so creating a runtime again maps no new stack. A
   * handler that needs more (large arrays on the stack, deep recursion)
   * sets it; overflowing hits a guard page. At least 16384. Threads of
   * weft_blocking keep glibc's default. */
  size_t stack_size;
  /* Shards whose threads weft_rt_create starts. The thread of each other
   * shard starts the first time it is needed: work is queued and no
   * started thread is idle to take it, a timer is started on its shard,
   * or the runtime opens its first socket (which starts them all, since
   * every shard serves sockets). Such a start costs the call that needs
   * it one thread creation (tens of microseconds), once per shard, and
   * the thread then stays until shutdown; a first timer on such a shard
   * due sooner than that may be late by it. More threads than CPUs help only
   * handlers that block, so by default the runtime starts one per CPU and
   * the others when handlers do block. 0: the number of CPUs this process
   * may run on, at most workers; values above workers mean workers (all
   * started by weft_rt_create, as a runtime that must never pay a thread
   * start after it wants). A start that fails (a thread limit) is counted
   * in weft_stats.thread_start_errors and tried again by a later wakeup
   * that needs it (not within 10 ms of the failure) and by every socket
   * call; meanwhile the started threads take the work and fire that
   * shard's timers (waking for them as for their own), and a socket call
   * fails with -EAGAIN until every thread could be started. */
  unsigned eager_workers;
  /* Messages: log_fn(log_ctx, level, msg) for each of level log_level or
   * more severe. log_fn NULL: "weft: msg" lines on stderr. log_level 0:
   * WEFT_LOG_WARN (WEFT_LOG_DEBUG in a library built with WEFT_DEBUG),
   * or what the environment variable WEFT_LOG (error, warn, info, debug)
   * says. Stall reports go to on_stall if it is set, else here. */
  weft_log_fn log_fn;
  void *log_ctx;
  int log_level;
  /* weft_resolve: most lookups running at once, each on a thread of a
   * pool of its own, apart from weft_blocking's (0: 8). Lookups beyond it
   * wait (up to 1024 of them). */
  unsigned resolve_threads;
} weft_config;

/* Fills cfg with the defaults (all zero means "default"). */
WEFT_API void weft_config_init_sized(weft_config *cfg, size_t size);
static inline void weft_config_init(weft_config *cfg) {
  weft_config_init_sized(cfg, sizeof(*cfg));
}

/* Creates a runtime and starts its threads (eager_workers of them) and its
 * monitor. cfg may be NULL for defaults.
 * Every other one-time cost (queues, pools, timers) is paid here: the
 * first post costs what the millionth does. There are two exceptions. The
 * threads of shards beyond eager_workers start when first needed (see
 * weft_config.eager_workers). And for sockets, the kind of backend is
 * decided here (a probe ring, once per process), but the shards' backends
 * are set up by the first weft_tcp_listen or weft_tcp_connect (tens of
 * microseconds per shard).
 * Errors: -EINVAL (rt NULL, a field out of range, unknown flags, a bad
 * WEFT_BACKEND), -E2BIG (cfg comes from a newer weft.h and sets a field
 * this library does not know), -ENOMEM, -EAGAIN (a thread could not be
 * started), or the error setting up a forced backend (e.g. -EPERM,
 * -ENOSYS for io_uring). Any thread.
 *
 * Structs across versions: weft_rt_create, weft_config_init and the
 * statistics calls are inline wrappers that pass the size of the struct
 * the caller was compiled with to a _sized entry point, so a program built
 * against an older weft.h keeps working with a newer library: fields its
 * struct lacks take their defaults (configuration) or are not written
 * (statistics). New fields are only ever appended. Callers from other
 * languages call the _sized functions with the size of their struct. */
WEFT_API int weft_rt_create_sized(weft_rt **rt, const weft_config *cfg,
                                  size_t cfg_size);
static inline int weft_rt_create(weft_rt **rt, const weft_config *cfg) {
  return weft_rt_create_sized(rt, cfg, sizeof(weft_config));
}

/* Shutdown modes. DRAIN: run every handler already accepted. CANCEL: run
 * the cancel function of every handler not yet started instead. NOWAIT, a
 * flag to either: start the shutdown, do not wait for it. */
#define WEFT_SHUTDOWN_DRAIN 0
#define WEFT_SHUTDOWN_CANCEL 1
#define WEFT_SHUTDOWN_NOWAIT 2

/* Stops accepting work and finishes what was accepted: every handler ever
 * accepted runs exactly once, or (CANCEL) its cancel function runs exactly
 * once instead (a handler without one is dropped); every handler that did
 * not run is counted in weft_shard_stats.handlers_cancelled. Handlers already
 * running are never interrupted. From the moment it is called, every post fails
 * with -ESHUTDOWN, from any thread (handlers included). Without
 * WEFT_SHUTDOWN_NOWAIT it returns when all that work is done. Errors: -EINVAL
 * (rt NULL, bad how), -EALREADY (shutdown already started), -EDEADLK (called
 * from a handler of this runtime without WEFT_SHUTDOWN_NOWAIT: it would wait
 * for itself). Any thread. */
WEFT_API int weft_rt_shutdown(weft_rt *rt, int how);

/* Waits at most timeout_ns for the runtime's shutdown to finish, one not
 * yet started included: a main thread can wait here for a shutdown that
 * a handler starts (on a signal, say: weft_signal_watch). 0 when it has
 * finished, -ETIMEDOUT if not yet, -EINVAL (rt NULL), -EDEADLK (called
 * from a handler of this runtime). Any thread. */
WEFT_API int weft_rt_wait(weft_rt *rt, uint64_t timeout_ns);

/* Joins every thread and frees the runtime and all its strands, released or
 * not. If no shutdown was started, it first does WEFT_SHUTDOWN_CANCEL; if a
 * NOWAIT shutdown is in progress it waits for it. No weft object of this
 * runtime may be used afterwards.
 * Errors: -EINVAL (rt NULL), -EDEADLK (called from a handler of this
 * runtime; nothing is freed). Any thread but the runtime's own. */
WEFT_API int weft_rt_destroy(weft_rt *rt);

/* Number of shards (= worker threads) of the runtime. Any thread. */
WEFT_API unsigned weft_rt_workers(const weft_rt *rt);

/* The backend the runtime's shards use: WEFT_BACKEND_URING, _EPOLL or
 * _NONE (never AUTO), and its name ("uring", "epoll", "none"). */
WEFT_API int weft_rt_backend(const weft_rt *rt);
WEFT_API const char *weft_rt_backend_name(const weft_rt *rt);

/* Creates a strand: a serial executor. Its handlers run one at a time, in
 * the order they were posted (per posting thread; posts from different
 * threads are ordered by the moment they were accepted), never concurrently.
 * A strand is about 64 bytes and touches nothing shared with other strands.
 * Its handlers run on any worker; its timers are kept by one shard, its
 * home, chosen in turn over the shards (a timer without strand is homed
 * the same way).
 * Errors: -EINVAL, -ENOMEM, -ESHUTDOWN. Any thread. */
WEFT_API int weft_strand_create(weft_rt *rt, weft_strand **s);

/* Gives the strand up. Handlers already posted still run (or are cancelled
 * at shutdown); the memory is reclaimed after the last one. Posting to a
 * released strand is a bug: while its handlers are pending it fails with
 * -EBADF; after that, debug builds (WEFT_DEBUG) still catch it with -EBADF
 * and release builds have undefined behaviour. Releasing twice is a bug of
 * the same kind. Any thread, handlers of s included. */
WEFT_API void weft_strand_release(weft_strand *s);

/* Posts fn(arg) to run on strand s. Never runs fn before returning.
 * Errors: -EINVAL (s or fn NULL), -EBADF (s released), -ESHUTDOWN (the
 * runtime is shutting down), -ENOMEM. On error nothing was accepted and
 * nothing will run. Any thread. */
WEFT_API int weft_post(weft_strand *s, weft_fn fn, void *arg);

/* As weft_post, with a cancel function (may be NULL) that runs instead of fn,
 * exactly once, if the runtime is shut down with WEFT_SHUTDOWN_CANCEL before
 * fn has started. Any thread. */
WEFT_API int weft_post_ex(weft_strand *s, weft_fn fn, weft_fn cancel,
                          void *arg);

/* Posts fn(arg) to run on any worker, with no ordering against other posts.
 * Errors as weft_post (-EINVAL for rt or fn NULL). Any thread. */
WEFT_API int weft_post_rt(weft_rt *rt, weft_fn fn, void *arg);
WEFT_API int weft_post_rt_ex(weft_rt *rt, weft_fn fn, weft_fn cancel,
                             void *arg);

/* The strand whose handler the calling thread is running, or NULL (outside
 * any handler, or in a weft_post_rt handler). For assertions. Any thread. */
WEFT_API weft_strand *weft_strand_current(void);

/* The runtime whose handler the calling thread is running, or NULL. */
WEFT_API weft_rt *weft_rt_current(void);

/* ---- timers --------------------------------------------------------------
 * A timer fires once at a deadline, or periodically. Deadlines are
 * nanoseconds of CLOCK_MONOTONIC (weft_now_ns) and are never rounded down:
 * a timer never fires early, and late only by the time the kernel takes to
 * wake a thread (plus about 1 us of wheel granularity).
 *
 * The handler receives its arg, a status and a count:
 *   status 0:             the timer fired; missed is the number of whole
 *                         periods that passed unfired before this firing (a
 *                         periodic timer whose handler or strand was held
 *                         up skips them instead of firing them in a burst);
 *   status -ECANCELED:    the runtime is shutting down and the timer was
 *                         armed, or a firing was queued at a CANCEL
 *                         shutdown; missed is 0. It is the timer's last call.
 * On a strand it runs there, serialised with the strand's other handlers;
 * without one it runs on any worker.
 *
 * Periodic timers do not drift: the next deadline is the previous deadline
 * plus the period, counted from when the handler returns, so a handler that
 * runs long makes the following periods count as missed.
 *
 * A timer belongs to one runtime and one strand (or none) and is 64 bytes.
 * All timers of a strand live in one shard's timing wheel (O(1) start and
 * cancel); a shard with nothing else to do sleeps until its earliest
 * deadline exactly. A firing is queued from under the wheel's lock, so the
 * order of deadlines is the order in which handlers are queued. */
typedef struct weft_timer weft_timer;
typedef void (*weft_timer_fn)(void *arg, int status, uint64_t missed);

/* CLOCK_MONOTONIC now, in nanoseconds. Any thread. */
WEFT_API uint64_t weft_now_ns(void);

/* Creates an idle timer whose handler will run on strand s, or on any
 * worker if s is NULL. s must belong to rt and stay unreleased until the
 * timer is destroyed. Timers of one strand fire in deadline order, and
 * those with equal deadlines in the order they were started.
 * Errors: -EINVAL, -EXDEV (s belongs to another runtime), -EBADF (s
 * released), -ENOMEM, -ESHUTDOWN. Any thread. */
WEFT_API int weft_timer_create(weft_rt *rt, weft_strand *s, weft_timer **t);

/* Arms t to fire after after_ns (0: at once), then every period_ns if
 * period_ns is not 0. Starting an armed timer re-arms it (its pending firing
 * is replaced). A firing of the earlier arming whose handler has not
 * started by then never runs (see weft_timer_cancel); one already running
 * goes on, with the fn and arg it fired with, and does not re-arm a
 * periodic timer.
 * Errors: -EINVAL (t or fn NULL, or the deadline or the first period
 * overflows), -EBADF (t destroyed), -ESHUTDOWN, -EBUSY (65535 firings of t
 * queued). Any thread. */
WEFT_API int weft_timer_start(weft_timer *t, uint64_t after_ns,
                              uint64_t period_ns, weft_timer_fn fn, void *arg);

/* As weft_timer_start with an absolute deadline (weft_now_ns clock). A
 * deadline in the past fires at once. */
WEFT_API int weft_timer_start_at(weft_timer *t, uint64_t deadline_ns,
                                 uint64_t period_ns, weft_timer_fn fn,
                                 void *arg);

/* Disarms t: no handler call of its current arming starts after this
 * returns. Exactly one of "called" and "cancelled" happens to each arming,
 * and the return value says which: 0 when its handler will not be called
 * (the timer was armed, or it had fired and its handler had not started:
 * that firing is dropped); -EALREADY when its handler has started (it may
 * still be running: on another thread, when this is called from outside
 * the timer's strand) or was never due (cancelled before, never started).
 * A periodic timer is not re-armed after a cancel. So on the timer's own
 * strand, once cancel (or start) returns, no handler of an earlier arming
 * runs: nothing of it can be waiting in the strand's queue. Errors:
 * -EINVAL. Any thread. */
WEFT_API int weft_timer_cancel(weft_timer *t);

/* Cancels t (as weft_timer_cancel) and frees it once no firing of it is
 * queued or running; a firing that is queued but has not started is
 * dropped (its handler is not called). t must not be used afterwards. Any
 * thread, its own handler included. */
WEFT_API void weft_timer_destroy(weft_timer *t);

/* ---- the blocking pool -----------------------------------------------------
 * For calls that block (file I/O, a database client, DNS): work(arg) runs on
 * a pool thread, separate from the shards' threads, so a saturated pool
 * slows no strand; then done(arg, result) runs on done_strand (or on any
 * worker if it is NULL). Pool threads start on demand up to
 * weft_config.blocking_threads and exit after 10 s idle. */
typedef long (*weft_work_fn)(void *arg);
typedef void (*weft_done_fn)(void *arg, long result);

/* Names a job until its done has been called (ids are never reused). */
typedef uint64_t weft_job;

/* Queues a job. *job (if job is not NULL) receives its id. done is called
 * exactly once: with work's result, or with -ECANCELED if the job was
 * cancelled before it started (weft_blocking_cancel, or a CANCEL shutdown).
 * A job is accepted only when a pool thread will run it: when no pool
 * thread runs and none can be started, the call fails and done is not
 * called. Errors: -EINVAL (rt, work or done NULL), -EXDEV (done_strand of
 * another runtime), -EAGAIN (blocking_queue jobs already wait, or no pool
 * thread could be started), -ESHUTDOWN, -ENOMEM. Any thread. */
WEFT_API int weft_blocking(weft_rt *rt, weft_work_fn work, void *arg,
                           weft_strand *done_strand, weft_done_fn done,
                           weft_job *job);

/* Cancels a job that has not started: 0, and its done gets -ECANCELED;
 * -EALREADY if it has started, finished or is unknown. Any thread. */
WEFT_API int weft_blocking_cancel(weft_rt *rt, weft_job job);

/* ---- name resolution
 * --------------------------------------------------------- getaddrinfo(3) off
 * the shards' threads: a lookup runs on a pool of its own
 * (weft_config.resolve_threads), apart from weft_blocking's, so lookups that
 * wait on a slow or silent name server hold neither a shard nor the threads
 * other blocking work (files) needs; the system's resolver gives up on its own
 * after its timeouts (resolv.conf(5): timeout, attempts). A shutdown waits for
 * lookups already running; queued ones run (DRAIN) or complete with -ECANCELED
 * (CANCEL). */
struct addrinfo;
typedef struct weft_lookup weft_lookup;

/* Errors of a lookup, beyond errno values (weft_strerror names them):
 * the name or service is not known (EAI_NONAME, EAI_NODATA, EAI_SERVICE,
 * EAI_ADDRFAMILY); the name server did not answer, try later (EAI_AGAIN);
 * it failed for good (EAI_FAIL). Bad hints give -EINVAL, EAI_MEMORY
 * -ENOMEM, EAI_SYSTEM the errno. */
#define WEFT_EAI_NONAME (-3001)
#define WEFT_EAI_AGAIN (-3002)
#define WEFT_EAI_FAIL (-3003)

/* status 0: res is the list of addresses (never NULL), weft's until fn
 * returns (it is freed then: copy what you keep); otherwise res is NULL
 * and status is a WEFT_EAI_* code, -ECANCELED (weft_resolve_cancel, or a
 * CANCEL shutdown before the lookup started), or a negative errno. */
typedef void (*weft_resolve_fn)(void *arg, int status, struct addrinfo *res);

/* Looks up host and service (either may be NULL, not both) as
 * getaddrinfo(host, service, hints) would; hints may be NULL (any family,
 * AI_ADDRCONFIG | AI_V4MAPPED, as glibc) and is copied, as are the
 * strings. fn runs once on strand s (NULL: any worker). *out (may be
 * NULL) names the lookup until fn has been called. Errors (fn will not be
 * called): -EINVAL, -EXDEV (s of another runtime), -EBADF (s released),
 * -EAGAIN (1024 lookups already wait, or no pool thread could start),
 * -ESHUTDOWN, -ENOMEM. Any thread. */
WEFT_API int weft_resolve(weft_rt *rt, weft_strand *s, const char *host,
                          const char *service, const struct addrinfo *hints,
                          weft_resolve_fn fn, void *arg, weft_lookup **out);

/* Gives up on r: fn runs with -ECANCELED (queued after this returns),
 * whether the lookup had started or not; a lookup that is running goes on
 * to its end on its pool thread, and its result is dropped. Errors:
 * -EINVAL, -EALREADY (fn has started with the result: from inside fn,
 * or from another thread while fn runs),
 * -ESHUTDOWN (called from outside the runtime once its shutdown has
 * begun: fn still comes, with the result or -ECANCELED). Call it only
 * while fn has not returned: on fn's strand that is known before fn runs;
 * from elsewhere, hold a lock that fn also takes. Any thread. */
WEFT_API int weft_resolve_cancel(weft_lookup *r);

/* ---- files
 * ------------------------------------------------------------------- File
 * operations that never block a worker: each completes once with fn(arg,
 * result) on strand s (NULL: any worker), never inside the call. With the
 * io_uring backend they go through the calling shard's ring (the kernel runs
 * those that would block on its own threads); from a thread outside the
 * runtime, with epoll, or on a kernel without the opcodes, they run on the
 * blocking pool (weft_blocking's), with the same results. result is what the
 * system call returns: bytes, a descriptor, 0, or a negative errno; short reads
 * and writes come as the kernel makes them, and a read at the end of the file
 * gives 0. Buffers, iovec arrays' memory and *st must stay valid until fn runs
 * (paths and iovec arrays themselves are copied). An offset of -1 uses and
 * moves the file position (as read(2)), which concurrent operations on one
 * descriptor share: use offsets for those. At a CANCEL shutdown an operation
 * not yet started may complete with -ECANCELED; one in the kernel completes.
 * Errors of the calls themselves (fn will not run): -EINVAL (rt or fn
 * NULL, a bad argument), -EXDEV (s of another runtime), -EBADF (s
 * released), -ESHUTDOWN, -ENOMEM, -EAGAIN (the blocking pool's queue is
 * full). */
struct stat;
struct iovec;
typedef void (*weft_fs_fn)(void *arg, long result);

/* open(2) of path with flags (O_CLOEXEC is added) and mode; result: the
 * descriptor. */
WEFT_API int weft_fs_open(weft_rt *rt, weft_strand *s, const char *path,
                          int flags, unsigned mode, weft_fs_fn fn, void *arg);
/* close(2) of fd; result 0. fd must not be used by an operation in
 * flight. */
WEFT_API int weft_fs_close(weft_rt *rt, weft_strand *s, int fd, weft_fs_fn fn,
                           void *arg);
/* pread(2) / pwrite(2) of len bytes (at most 2 GiB - 4 KiB) at off (-1:
 * the file position); result: bytes. */
WEFT_API int weft_fs_read(weft_rt *rt, weft_strand *s, int fd, void *buf,
                          size_t len, int64_t off, weft_fs_fn fn, void *arg);
WEFT_API int weft_fs_write(weft_rt *rt, weft_strand *s, int fd, const void *buf,
                           size_t len, int64_t off, weft_fs_fn fn, void *arg);
/* preadv(2) / pwritev(2) of iovcnt (1..1024) buffers. */
WEFT_API int weft_fs_readv(weft_rt *rt, weft_strand *s, int fd,
                           const struct iovec *iov, int iovcnt, int64_t off,
                           weft_fs_fn fn, void *arg);
WEFT_API int weft_fs_writev(weft_rt *rt, weft_strand *s, int fd,
                            const struct iovec *iov, int iovcnt, int64_t off,
                            weft_fs_fn fn, void *arg);
/* fsync(2), or fdatasync(2) with datasync non-zero; result 0. */
WEFT_API int weft_fs_fsync(weft_rt *rt, weft_strand *s, int fd, int datasync,
                           weft_fs_fn fn, void *arg);
/* stat(2) of path, or fstat(2) of fd with path NULL, into *st; result 0.
 * (fd is ignored when path is given.) */
WEFT_API int weft_fs_stat(weft_rt *rt, weft_strand *s, const char *path, int fd,
                          struct stat *st, weft_fs_fn fn, void *arg);

/* ---- signals ----------------------------------------------------------------
 * A watcher runs fn(arg, signo, count) on a strand each time signo
 * arrives: count is how many arrivals it stands for (arrivals while a call
 * is queued add up, and the kernel may merge some before weft sees them).
 * Calls of one watcher never overlap. Any number of watchers, of any
 * number of runtimes in the process, may watch the same signal: each gets
 * every arrival. weft installs its own handler (sigaction) while a signal
 * is watched, and puts back the action it replaced when the last watcher
 * of that signal goes. The handler only counts the arrival and wakes a
 * thread of weft's; a signal that every thread blocks (main blocking
 * SIGTERM before starting threads, as sigwait needs) stays pending, and
 * that thread takes it from there (signalfd): either way it arrives.
 * System calls that the handler interrupts on other threads restart
 * (SA_RESTART) or return EINTR as the kernel decides; weft's own retry. */
typedef struct weft_signal weft_signal;
typedef void (*weft_signal_fn)(void *arg, int signo, uint64_t count);

/* Watches signo: fn runs on strand s (NULL: a strand of the watcher's
 * own). Errors: -EINVAL (rt or fn NULL; signo not one a process can
 * catch and be told of later: SIGKILL, SIGSTOP, or a fault such as
 * SIGSEGV), -EXDEV (s of another runtime), -EBADF (s released),
 * -ESHUTDOWN, -ENOMEM, -EAGAIN (weft's signal thread could not start).
 * Any thread. */
WEFT_API int weft_signal_watch(weft_rt *rt, weft_strand *s, int signo,
                               weft_signal_fn fn, void *arg, weft_signal **out);

/* Stops watching: no call of w starts after this returns on w's strand
 * (elsewhere, one already running may finish). w must not be used
 * afterwards. weft_rt_destroy stops every watcher of its runtime that is
 * left: w must not be unwatched after that. Errors: -EINVAL. Any
 * thread. */
WEFT_API int weft_signal_unwatch(weft_signal *w);

/* ---- TCP and Unix stream sockets
 * --------------------------------------------- Connections and listeners, over
 * TCP (IPv4, IPv6) or Unix domain stream sockets (AF_UNIX: weft_unix_addr makes
 * the address): the same weft_tcp and weft_listener calls serve both, and
 * everything below holds for both unless it says otherwise. Every callback of a
 * connection runs on its strand: the one given to weft_tcp_connect, or one weft
 * creates for it (accepted connections, or connect with strand NULL). Callbacks
 * are never called from inside the weft_tcp_* call that causes them.
 *
 * Threads: weft_tcp_read, _write, _writev, _shutdown, _set_watermarks,
 * _set_data and the option setters must be called on the connection's
 * strand (from one of its handlers or callbacks); elsewhere they fail with
 * -EPERM. weft_tcp_close may be called from any thread.
 *
 * Lifetime. A connection's first callback is its accept callback, or its
 * connect callback (whatever the result). Its last is its close callback,
 * set with weft_tcp_set_data, which runs exactly once whatever ends the
 * connection: weft_tcp_close, a failed or cancelled connect (the
 * connection closes itself once the connect callback returns), a timeout
 * (weft_tcp_set_timeouts), or the runtime's shutdown (any mode,
 * weft_rt_destroy included). It runs on the strand after every other
 * callback of the connection has returned and after every handler posted
 * to the strand before the connection finished closing, and after it weft
 * never touches the connection again: free what belongs to the
 * connection there, and nowhere else. A read or write error does not
 * close the connection: close it (a callback that sees an error may call
 * weft_tcp_close even when a close is under way; it returns -EALREADY).
 * The connection must not be used once its close callback has returned.
 *
 * Strands. A connection weft made a strand for (accepted, or connect with
 * strand NULL) keeps it until its close callback has returned, and as long
 * as another connection made on it (weft_tcp_connect with
 * weft_tcp_strand(conn)) is open: timers on the strand must be destroyed
 * by then, and the close callback is the place (weft_timer_destroy drops a
 * firing still queued).
 *
 * Buffers are the caller's: a read buffer must stay valid until the read
 * callback has been called, a write buffer (and, for writev, the memory the
 * iovecs point to; the iovec array itself is copied) until the write
 * callback has been called, whatever happens, including close and shutdown.
 *
 * Close: every operation in flight completes exactly once, with
 * -ECANCELED when the close ended it, before the close callback; the
 * kernel has released every buffer by then. weft_rt_shutdown closes every
 * listener and connection of the runtime in the same way (in both modes; in
 * CANCEL mode the callbacks still run, with -ECANCELED), and new ones fail
 * with -ESHUTDOWN.
 *
 * Writes are sent in the order they were made, each completed when all its
 * bytes are in the kernel; a partial send is continued, never reordered. A
 * write call, and each turn of the connection's strand, hands the kernel
 * at most 1 MiB by itself (the io_uring backend hands it none: its sends
 * go through the ring); a larger write goes on in later turns, so no
 * write holds its shard's other strands for longer than that takes.
 * Sends never raise SIGPIPE (MSG_NOSIGNAL); a closed peer gives -EPIPE or
 * -ECONNRESET. EINTR is retried inside weft. */
struct sockaddr;
struct iovec;
typedef struct weft_tcp weft_tcp;
typedef struct weft_listener weft_listener;

/* A new connection, on its own strand. Close it when done with it. */
typedef void (*weft_accept_fn)(void *arg, weft_tcp *conn);
/* status 0: connected; -ETIMEDOUT, -ECONNREFUSED, -ECANCELED (closed
 * before it connected), other negative errno: failed, and the connection
 * closes itself when this returns (the close callback set by then runs). */
typedef void (*weft_connect_fn)(void *arg, weft_tcp *conn, int status);
/* n > 0: bytes read into the buffer; 0: the peer closed its side (EOF);
 * n < 0: -ECONNRESET, -ECANCELED (closed), other negative errno. */
typedef void (*weft_read_fn)(void *arg, weft_tcp *conn, long n);
/* 0: every byte is in the kernel; -ECANCELED: closed before it was all
 * sent (part of it may have been); -EPIPE, -ECONNRESET, other negative
 * errno: the connection failed. */
typedef void (*weft_write_fn)(void *arg, weft_tcp *conn, int status);
/* The connection is closed: its descriptor is closed, every other callback
 * of it has returned, and its memory goes back to weft after this returns.
 * data: what weft_tcp_set_data gave. */
typedef void (*weft_close_fn)(void *data, weft_tcp *conn);
/* Queued write bytes fell to the low watermark after a write was refused
 * with -ENOBUFS: writing may resume. */
typedef void (*weft_drain_fn)(void *arg, weft_tcp *conn);

/* weft_listen_opts.flags */
/* One listening socket on one shard, instead of one per shard bound with
 * SO_REUSEPORT (the default: the kernel spreads connections over the shards'
 * sockets, so no lock is shared between shards on the accept path). */
#define WEFT_LISTEN_SINGLE 1u
/* Bind even where SO_REUSEPORT sockets of the same user already listen
 * (another process, say, taking over during a restart) and share the
 * connections with them. Without it an address already in use fails with
 * -EADDRINUSE, even when what holds it is a SO_REUSEPORT group. The kernel
 * decides who may join a group, not the listener bound first: a listener
 * made without the flag keeps out weft listeners made without it, not
 * those made with it nor other programs' SO_REUSEPORT sockets. */
#define WEFT_LISTEN_SHARE 2u

typedef struct weft_listen_opts {
  int backlog;    /* listen() backlog per socket; 0: SOMAXCONN */
  unsigned flags; /* WEFT_LISTEN_*; others must be zero */
} weft_listen_opts;

typedef struct weft_listener_stats {
  uint64_t accepted;      /* connections handed to the accept callback */
  uint64_t accept_calls;  /* accept attempts (syscalls or io_uring ops) */
  uint64_t fd_limit_hits; /* EMFILE / ENFILE / ENOBUFS / ENOMEM from accept */
  uint64_t dropped; /* connections closed at once while descriptors ran out */
  uint64_t paused;  /* times accepting paused (then resumed with backoff) */
} weft_listener_stats;

/* Listens on addr (IPv4 or IPv6; port 0 picks a free port, the same for
 * every shard's socket; or Unix, below) and calls fn(arg, conn) on each
 * new connection's strand. SO_REUSEADDR is set. An address in use by another
 * listening socket, weft's or not, fails with -EADDRINUSE unless
 * WEFT_LISTEN_SHARE is given; the check is made just before the shards' sockets
 * bind, so a socket bound by someone else in between can still be joined. When
 * descriptors run out (EMFILE, ENFILE) accepting pauses, backing off from 1 ms
 * to 100 ms, and resumes by itself; connections that arrive meanwhile are
 * accepted and closed at once with a spare descriptor kept for that, so clients
 * do not hang. opts may be NULL. Errors: -EINVAL (bad arguments, addrlen too
 * small for the family, WEFT_LISTEN_SHARE with Unix), -EAFNOSUPPORT
 * (neither IPv4, IPv6 nor Unix), -EADDRINUSE, -EACCES, -ENOENT (a Unix
 * path's directory does not exist), -EADDRNOTAVAIL, -EMFILE, -ENOMEM,
 * -ESHUTDOWN, -ENOTSUP (backend NONE), -EAGAIN (the runtime's first socket
 * could not start every shard's thread: weft_config.eager_workers). Any thread.
 */
WEFT_API int weft_tcp_listen(weft_rt *rt, const struct sockaddr *addr,
                             unsigned addrlen, const weft_listen_opts *opts,
                             weft_accept_fn fn, void *arg, weft_listener **out);

/* Unix domain listeners: one socket, served by one shard (the kernel has
 * no SO_REUSEPORT groups for them). A path names a socket file: a file
 * left there by a listener that is gone (a socket nobody listens on) is
 * replaced, while a live listener or a file that is not a socket gives
 * -EADDRINUSE; the listener removes its file when it closes (unless
 * another was bound there since). Two processes that bind the same stale
 * path at the same moment may both replace it: serialize such starts. An
 * abstract name (weft_unix_addr's "@name") has no file; an address of the
 * family alone (addrlen sizeof(sa_family_t)) has the kernel pick an
 * abstract name, which weft_listener_addr tells. */

/* The bound address (with the port picked for port 0). *addrlen is the
 * size of addr on entry, the address length on return. Any thread. */
WEFT_API int weft_listener_addr(weft_listener *l, struct sockaddr *addr,
                                unsigned *addrlen);
WEFT_API int weft_listener_stats_get(weft_listener *l,
                                     weft_listener_stats *out);

/* Stops accepting and closes the sockets. done(arg), if not NULL, runs on
 * any worker once no accept callback of l will start any more: connections
 * accepted before the close still get theirs (they run on each
 * connection's strand), and done runs after the last has returned. l must
 * not be used after this call. Connections already accepted are not
 * affected.
 * Errors: -EINVAL, -EALREADY (closed already, or by a shutdown that left no
 * accept callback to wait for: done is not called). Any thread. */
WEFT_API int weft_listener_close(weft_listener *l, weft_fn done, void *arg);

/* Connects to addr. *out receives the connection at once (so that it can
 * be closed to give up); fn runs on the strand (NULL: a new one of its own)
 * with the result. timeout_ns 0: the kernel's own (minutes). A Unix
 * connect is answered at once: -ENOENT (no such file), -ECONNREFUSED
 * (nobody listens there), -EAGAIN (the listener's backlog is full).
 * Errors (nothing was created): -EINVAL, -EXDEV (strand of another
 * runtime), -EAFNOSUPPORT, -EMFILE, -ENOMEM, -ESHUTDOWN, -ENOTSUP, -EAGAIN
 * (as weft_tcp_listen). Any thread. */
WEFT_API int weft_tcp_connect(weft_rt *rt, weft_strand *strand,
                              const struct sockaddr *addr, unsigned addrlen,
                              uint64_t timeout_ns, weft_connect_fn fn,
                              void *arg, weft_tcp **out);

/* Connects to host (a name, or a numeric address) and service (a port
 * number, or a name from /etc/services), looked up as weft_resolve does:
 * tries each address in turn, interleaving IPv6 and IPv4 as RFC 8305
 * orders them (at most 16 addresses), each attempt ending after
 * attempt_ns (0: the kernel's own timeout, minutes) or at its first
 * failure. fn runs once on strand s (NULL: a new strand of its own, which
 * becomes the connection's): with status 0 and the connection (as
 * weft_tcp_connect's callback: set its data and close callback there), or
 * with conn NULL and the last attempt's error (-ECONNREFUSED,
 * -ETIMEDOUT, ...), the lookup's (WEFT_EAI_*), or -ECANCELED. The failed
 * attempts' connections close by themselves. *out (may be NULL) names the
 * dial until fn has been called. Errors (fn will not be called): as
 * weft_resolve, and -EINVAL (host or service NULL). Any thread. */
typedef struct weft_dial weft_dial;
WEFT_API int weft_tcp_dial(weft_rt *rt, weft_strand *s, const char *host,
                           const char *service, uint64_t attempt_ns,
                           weft_connect_fn fn, void *arg, weft_dial **out);

/* Gives up on d: fn runs with -ECANCELED (a connection that got through
 * meanwhile is closed). Errors: -EINVAL, -EALREADY (fn has started, or d
 * was cancelled before). Only while fn has not returned (as
 * weft_resolve_cancel). Any thread. */
WEFT_API int weft_tcp_dial_cancel(weft_dial *d);

/* Reads up to len bytes (len is capped at 1 GiB) into buf; fn runs once
 * with the result: the bytes read, 0 at end of file, or a negative errno.
 * One read at a time. With io_uring, bytes that arrive between reads are
 * kept in the shard's 4 KiB receive buffers, about 8 per connection (its
 * receive stops there; what the socket had received by then comes on
 * top), then the kernel's socket buffer and TCP flow control hold the
 * rest; the next read gets them first. Errors: -EINVAL (buf or fn NULL, len 0),
 * -EBUSY (a read is in flight), -ENOTCONN (not connected yet), -EBADF
 * (closing), -EPERM (not on the strand), -ESHUTDOWN. */
WEFT_API int weft_tcp_read(weft_tcp *c, void *buf, size_t len, weft_read_fn fn,
                           void *arg);

/* Reads into buf until it holds the delimiter delim (dlen bytes), or len
 * bytes: for line and header protocols. buf already holds have bytes
 * (those left after the previous message; 0 at first). fn(arg, conn, n,
 * have) runs once: n > 0, buf[0, n) is a message ending with the
 * delimiter's first appearance, and buf holds have bytes in all (the
 * bytes after n are the start of what follows: move them to the front
 * and pass have - n to the next call); -EMSGSIZE, buf is full without
 * it; 0, end of file (have: the bytes received before it); n < 0, as
 * weft_tcp_read. A delimiter already among the have bytes is answered
 * without reading, after this call returns. delim must stay valid until
 * fn runs. Errors: as weft_tcp_read, and -EINVAL (delim NULL, dlen 0 or
 * above len, have above len, len above 1 GiB). */
typedef void (*weft_until_fn)(void *arg, weft_tcp *conn, long n, size_t have);
WEFT_API int weft_tcp_read_until(weft_tcp *c, void *buf, size_t len,
                                 size_t have, const void *delim, size_t dlen,
                                 weft_until_fn fn, void *arg);

/* Queues len bytes to send; fn (may be NULL) runs once when they are sent
 * or failed. The bytes are not copied: buf must stay valid and unchanged
 * until fn runs (with fn NULL: until the close callback). With io_uring
 * they leave at the thread's next entry into the kernel, which batches
 * the replies of a burst of requests (docs/design.md). A zero-length
 * write is accepted and completes in order.
 * Errors: -EINVAL, -ENOBUFS (queued bytes would exceed the high watermark;
 * a write into an empty queue is always accepted), -EPIPE (after
 * weft_tcp_shutdown or a failed write), -ENOTCONN, -EBADF, -EPERM,
 * -ESHUTDOWN, -ENOMEM. */
WEFT_API int weft_tcp_write(weft_tcp *c, const void *buf, size_t len,
                            weft_write_fn fn, void *arg);
/* The same for iovcnt buffers (1..1024) sent as one write. */
WEFT_API int weft_tcp_writev(weft_tcp *c, const struct iovec *iov, int iovcnt,
                             weft_write_fn fn, void *arg);

/* Bytes queued for sending and not yet in the kernel. On the strand. */
WEFT_API size_t weft_tcp_queued(const weft_tcp *c);

/* Write backpressure: a write that would take the queued bytes above high
 * fails with -ENOBUFS (unless the queue is empty), and fn(arg, c) runs once
 * the queue has drained to low or less. Defaults: low 64 KiB, high 1 MiB.
 * Errors: -EINVAL (low > high, high 0), -EPERM. */
WEFT_API int weft_tcp_set_watermarks(weft_tcp *c, size_t low, size_t high,
                                     weft_drain_fn fn, void *arg);

/* Half-close: sends FIN once the writes queued so far are sent; reading
 * continues. Later writes fail with -EPIPE. Errors: -ENOTCONN, -EBADF,
 * -EPERM, -EALREADY. */
WEFT_API int weft_tcp_shutdown(weft_tcp *c);

/* Closes c: in-flight operations complete with -ECANCELED (queued writes
 * not yet sent included), then the close callback runs (see "Lifetime"
 * above). With abortive non-zero the peer gets RST instead of FIN
 * (SO_LINGER 0). Errors: -EINVAL (c NULL), -EALREADY (already closing:
 * closed before, or closing by itself), -ESHUTDOWN (called from outside
 * the runtime once its shutdown has begun: the shutdown closes c, and the
 * close callback still comes). Any thread; but c may close by itself (a
 * timeout, a shutdown), and once its close callback has returned c is
 * gone: a thread other than c's strand must know that it has not, for
 * example by holding a lock that the close callback also takes. */
WEFT_API int weft_tcp_close(weft_tcp *c, int abortive);

/* Ties data to c: weft_tcp_data(c) returns it, and on_close(data, c)
 * (may be NULL) is c's close callback. Calling it in the accept or connect
 * callback is always in time: those come first, even for a connection a
 * close from another thread (or a shutdown) has already ended. Errors:
 * -EINVAL, -EPERM (not on the strand). */
WEFT_API int weft_tcp_set_data(weft_tcp *c, void *data, weft_close_fn on_close);
/* What weft_tcp_set_data gave c last (NULL before). On the strand. */
WEFT_API void *weft_tcp_data(const weft_tcp *c);

/* Timeouts of c, in nanoseconds (0: none): idle, no byte read (handed to
 * a read callback) or sent for that long; read, a read that gets nothing for
 * that long after it was made; write, queued bytes of which none could be sent
 * for that long (a peer that stopped reading). When one passes, c closes by
 * itself: operations in flight complete with -ETIMEDOUT (instead of
 * -ECANCELED), then the close callback runs. A deadline is kept by the
 * shard's timer wheel: c is closed when its timer fires, as late as a
 * timer can be (weft_timer_start), never early. Calling it again replaces
 * the settings and restarts the idle time; all 0 turns them off. The
 * first call allocates c's timer, once; reads and writes allocate nothing
 * for it. On the strand, connected. Errors: -EINVAL, -EPERM, -ENOTCONN,
 * -EBADF (closing), -ENOMEM, -ESHUTDOWN. */
WEFT_API int weft_tcp_set_timeouts(weft_tcp *c, uint64_t idle_ns,
                                   uint64_t read_ns, uint64_t write_ns);

/* Options; on the strand. Errors: -EINVAL, -EPERM, -EBADF, or the
 * setsockopt error (-EOPNOTSUPP on a Unix socket). keepalive: idle_s
 * (1..32767) seconds before probes. */
WEFT_API int weft_tcp_nodelay(weft_tcp *c, int on);
WEFT_API int weft_tcp_keepalive(weft_tcp *c, int on, unsigned idle_s);

/* The connection's strand. Any thread. */
WEFT_API weft_strand *weft_tcp_strand(const weft_tcp *c);
/* Local and peer addresses (as weft_listener_addr). On the strand. */
WEFT_API int weft_tcp_local_addr(weft_tcp *c, struct sockaddr *addr,
                                 unsigned *addrlen);
WEFT_API int weft_tcp_peer_addr(weft_tcp *c, struct sockaddr *addr,
                                unsigned *addrlen);

/* Fills *sa with the Unix domain address of path and returns its length
 * (for weft_tcp_listen and weft_tcp_connect's addrlen). A path starting
 * with '@' names the abstract namespace (Linux): the rest is the name, no
 * file is made, and the name goes away with the last socket bound to it.
 * Errors: -EINVAL (sa or path NULL, path empty), -ENAMETOOLONG (a path of
 * more than 107 bytes, an abstract name of more than 107 after the '@'). */
struct sockaddr_un;
WEFT_API int weft_unix_addr(struct sockaddr_un *sa, const char *path);

/* The peer process of a Unix connection, as the kernel recorded it when
 * the connection was made (SO_PEERCRED): its process id, user and group. */
typedef struct weft_cred {
  int32_t pid;
  uint32_t uid, gid;
} weft_cred;

/* The credentials of c's peer. On the strand. Errors: -EINVAL, -EPERM,
 * -EBADF (closing), -EAFNOSUPPORT (not a Unix connection). */
WEFT_API int weft_tcp_peer_cred(weft_tcp *c, weft_cred *out);

/* ---- UDP
 * ---------------------------------------------------------------------
 * Datagram sockets, IPv4 and IPv6. Every callback of a UDP socket runs on
 * its strand (the one given to weft_udp_open, or one of its own), never
 * inside the weft_udp_* call that causes it. weft_udp_close may be called
 * from any thread; every other call on its strand (elsewhere: -EPERM).
 *
 * Receiving: once weft_udp_recv_start is called, each datagram is handed
 * to the callback in weft's buffer, valid until the callback returns.
 * Datagrams are read in batches (recvmmsg), at most 64 per turn of the
 * strand, so a flood on one socket delays the other strands of its shard
 * by one batch, never more. A datagram longer than max_datagram is cut
 * to it and flagged WEFT_UDP_TRUNC.
 *
 * Sending: weft_udp_send copies the datagram, so its buffer may be reused
 * at once; datagrams queued in one turn of the strand leave together
 * (sendmmsg) at its end, in order. The queue holds at most send_queue
 * bytes (-ENOBUFS beyond); it fills only while the socket's send buffer
 * is full.
 *
 * Lifetime, as a TCP connection's: the close callback (weft_udp_set_data)
 * runs exactly once, last, whatever closes the socket (weft_udp_close,
 * or the runtime's shutdown), after every queued send's callback (with
 * -ECANCELED for those not sent). */
typedef struct weft_udp weft_udp;

/* weft_udp_recv_fn's flags */
#define WEFT_UDP_TRUNC 1u /* the datagram was longer than max_datagram */

/* n >= 0: a datagram of n bytes at data, from `from` (fromlen bytes; on
 * a connected socket, the peer); n < 0: an error the socket reported
 * (-ECONNREFUSED: an earlier datagram of a connected socket was refused),
 * data and from NULL. */
typedef void (*weft_udp_recv_fn)(void *arg, weft_udp *u, long n,
                                 const void *data, const struct sockaddr *from,
                                 unsigned fromlen, unsigned flags);
/* 0: the datagram is in the kernel; -ECANCELED: closed before it left;
 * other negative errno: the kernel refused it (-ENETUNREACH, -EACCES for
 * a broadcast without SO_BROADCAST, -ECONNREFUSED, ...). */
typedef void (*weft_udp_send_fn)(void *arg, weft_udp *u, int status);
typedef void (*weft_udp_close_fn)(void *data, weft_udp *u);

/* weft_udp_opts.flags */
#define WEFT_UDP_REUSEADDR                                                     \
  1u /* SO_REUSEADDR: share the address (multicast)                            \
      */
#define WEFT_UDP_BROADCAST                                                     \
  2u /* SO_BROADCAST: may send to broadcast addresses */

typedef struct weft_udp_opts {
  unsigned max_datagram; /* bytes read per datagram; 0: 2048 (65535 max) */
  unsigned send_queue;   /* bytes queued for sending at most; 0: 256 KiB */
  unsigned flags;        /* WEFT_UDP_*; others must be zero */
} weft_udp_opts;

/* Opens a UDP socket bound to addr (IPv4 or IPv6; port 0 picks one) on
 * strand s (NULL: a strand of its own, released with the socket). opts
 * may be NULL. Errors: -EINVAL, -EAFNOSUPPORT, -EADDRINUSE, -EACCES,
 * -EADDRNOTAVAIL, -EXDEV (s of another runtime), -EBADF (s released),
 * -EMFILE, -ENOMEM, -ESHUTDOWN, -ENOTSUP (backend NONE), -EAGAIN (as
 * weft_tcp_listen). Any thread. */
WEFT_API int weft_udp_open(weft_rt *rt, weft_strand *s,
                           const struct sockaddr *addr, unsigned addrlen,
                           const weft_udp_opts *opts, weft_udp **out);

/* Calls fn for each datagram from now on (replacing an earlier fn).
 * Errors: -EINVAL, -EPERM, -EBADF (closing). */
WEFT_API int weft_udp_recv_start(weft_udp *u, weft_udp_recv_fn fn, void *arg);
/* No call of the receive callback starts after this returns (datagrams
 * wait in the socket's buffer). Errors: -EINVAL, -EPERM. */
WEFT_API int weft_udp_recv_stop(weft_udp *u);

/* Sends len bytes (0..65507 for IPv4, 65527 for IPv6) to `to` (NULL on a
 * connected socket: its peer); the bytes are copied. fn (may be NULL)
 * runs once with the result. Errors (fn will not run): -EINVAL,
 * -EMSGSIZE, -EDESTADDRREQ (to NULL, not connected), -EAFNOSUPPORT (to of
 * another family), -ENOBUFS (the send queue is full), -EPERM, -EBADF,
 * -ENOMEM. */
WEFT_API int weft_udp_send(weft_udp *u, const void *buf, size_t len,
                           const struct sockaddr *to, unsigned tolen,
                           weft_udp_send_fn fn, void *arg);

/* Connects u to addr (the kernel then drops datagrams from anyone else
 * and reports the peer's refusals); addr NULL disconnects. Errors:
 * -EINVAL, -EAFNOSUPPORT, -EPERM, -EBADF, or connect(2)'s. */
WEFT_API int weft_udp_connect(weft_udp *u, const struct sockaddr *addr,
                              unsigned addrlen);

/* Joins (join non-zero) or leaves the multicast group (an IPv4 or IPv6
 * address; its port is ignored) on the interface of index ifindex (0:
 * the kernel's choice). Errors: -EINVAL, -EAFNOSUPPORT (a group of
 * another family than u's), -EPERM, -EBADF, or setsockopt(2)'s
 * (-EADDRNOTAVAIL: not joined, -ENODEV). */
WEFT_API int weft_udp_membership(weft_udp *u, const struct sockaddr *group,
                                 unsigned grouplen, unsigned ifindex, int join);

/* Ties data to u; on_close(data, u) (may be NULL) is its close callback.
 * Errors: -EINVAL, -EPERM. */
WEFT_API int weft_udp_set_data(weft_udp *u, void *data,
                               weft_udp_close_fn on_close);
WEFT_API void *weft_udp_data(const weft_udp *u);
/* u's strand. Any thread. */
WEFT_API weft_strand *weft_udp_strand(const weft_udp *u);
/* The bound address (as weft_listener_addr). On the strand. */
WEFT_API int weft_udp_local_addr(weft_udp *u, struct sockaddr *addr,
                                 unsigned *addrlen);

/* Closes u: queued sends complete with -ECANCELED, then the close
 * callback runs. Errors: -EINVAL, -EALREADY (closed before, or by the
 * shutdown), -ESHUTDOWN (as weft_tcp_close). Any thread, with the same
 * caution as weft_tcp_close: u is gone once its close callback has
 * returned. */
WEFT_API int weft_udp_close(weft_udp *u);

/* ---- child processes
 * ----------------------------------------------------------- weft_spawn starts
 * a program and calls fn once, on strand s, when it has ended; weft reaps it
 * (through a pidfd, Linux 5.3: no SIGCHLD handler is taken, and no zombie is
 * left). Its stdin, stdout and stderr can each be a stream to the parent: a
 * weft_tcp connection over a Unix socket pair, on strand s, with every call of
 * the TCP section (read, write, weft_tcp_shutdown to send EOF to the child's
 * stdin, a close callback of its own). A shutdown of the runtime kills
 * (SIGKILL) and reaps the children still running: their exit callbacks report
 * it. */
typedef struct weft_process weft_process;

/* exit_code: the program's exit status (term_signal 0), or 0 when
 * term_signal, the signal that ended it, is not 0. p is gone once fn
 * returns. */
typedef void (*weft_exit_fn)(void *arg, weft_process *p, int exit_code,
                             int term_signal);

/* weft_spawn_opts.stdio[i] */
#define WEFT_STDIO_INHERIT 0 /* the parent's own descriptor i */
#define WEFT_STDIO_NULL 1    /* /dev/null */
#define WEFT_STDIO_PIPE 2    /* a stream to the parent (*streams[i]) */

typedef struct weft_spawn_opts {
  const char *const *argv; /* argv[0]: the program, searched in PATH
                              when it has no '/'; NULL-terminated */
  const char *const *envp; /* NULL: the parent's environment */
  const char *cwd;         /* NULL: the parent's working directory */
  int stdio[3];            /* WEFT_STDIO_*, for stdin, stdout, stderr */
} weft_spawn_opts;

/* Starts o->argv. *out (may be NULL) names the process until fn has
 * returned; streams[i] receives the stream of each WEFT_STDIO_PIPE (NULL
 * for the others; streams may be NULL if there is none). The child starts
 * with no signal blocked and its streams blocking, as a program expects.
 * Must be called on strand s when it makes streams (their close callbacks
 * are set there: weft_tcp_set_data before the handler returns). Errors
 * (nothing started): -EINVAL, -EXDEV, -EBADF (s released), -EPERM (streams
 * asked for off strand s), -ENOENT and -EACCES (the program), -EMFILE,
 * -ENOMEM, -ESHUTDOWN, -ENOTSUP (backend NONE), -ENOSYS (no pidfd). */
WEFT_API int weft_spawn(weft_rt *rt, weft_strand *s, const weft_spawn_opts *o,
                        weft_exit_fn fn, void *arg, weft_process **out,
                        weft_tcp *streams[3]);

/* Sends signo to p (pidfd_send_signal: never to a process that reused
 * its pid). Errors: -EINVAL, -ESRCH (it has ended; its exit callback is
 * coming). Only until p's exit callback has returned. Any thread. */
WEFT_API int weft_process_kill(weft_process *p, int signo);
/* p's process id. Any thread, until its exit callback has returned. */
WEFT_API int weft_process_pid(const weft_process *p);

typedef struct weft_shard_stats {
  uint64_t handlers_run;       /* handlers run */
  uint64_t handlers_cancelled; /* handlers not run at CANCEL shutdown: their
                                  cancel function ran, or they had none */
  uint64_t strands_run;        /* strand turns (each at most one batch) */
  uint64_t steals;             /* run-queue items stolen by this shard */
  uint64_t parks;              /* times its thread went to sleep */
  uint64_t wakeups;            /* times a sleeping thread was woken for it */
  uint64_t injected;           /* items taken from the runtime inject queue */
  uint64_t timers_fired;       /* timer expirations (handlers queued) */
  uint64_t stalls;             /* handlers noticed running past the stall
                                  threshold on this shard */
  uint64_t handoffs;           /* times this shard moved to another thread */
  uint64_t io_events;          /* backend completions or readiness events */
  uint64_t io_enters;          /* io_uring_enter or epoll_wait calls */
  /* Room for counters added later without moving the fields of weft_stats
   * after its `total`; reads as 0. */
  uint64_t reserved[8];
} weft_shard_stats;

typedef struct weft_stats {
  unsigned shards;        /* number of shards */
  weft_shard_stats total; /* sum over the shards */
  uint64_t strands_live;  /* strands created and not yet reclaimed */
  unsigned threads;       /* threads running for shards, spares included;
                             not the shards' threads not yet started */
  /* Handlers that a thread finished after the monitor had handed its shard
   * to another thread: in total.handlers_run (and total.handlers_cancelled
   * for those cancelled), but in no shard's counters. */
  uint64_t handlers_run_after_handoff;
  uint64_t blocking_done; /* blocking jobs whose done has returned */
  uint64_t tcp_live; /* sockets (connections, listening, UDP) not yet freed */
  /* io_uring: provided receive buffers (4 KiB each, 128 per shard) that
   * hold bytes a connection has received and not yet been asked to read
   * (weft_tcp_read says how many one connection may hold). */
  uint64_t recv_bufs_held;
  /* io_uring: receives that found every buffer of their shard held, and
   * so read into the reader's own buffer instead. */
  uint64_t recv_nobufs;
  /* Starts of a shard's thread that failed after weft_rt_create
   * (weft_config.eager_workers). */
  uint64_t thread_start_errors;
  /* The blocking pool: time its threads have spent in work functions, in
   * total; threads alive now (idle ones exit after 10 s); jobs waiting for
   * a thread; jobs in their work function now. */
  uint64_t blocking_busy_ns;
  unsigned blocking_threads;
  unsigned blocking_queued;
  unsigned blocking_running;
  /* New fields are appended here. */
} weft_stats;

/* Counters of the runtime, summed over its shards. They are read without
 * stopping anything: each counter is exact, the set is not a snapshot.
 * Writes exactly size bytes (weft_rt_create says why). Errors: -EINVAL.
 * Any thread. */
WEFT_API int weft_rt_stats_sized(weft_rt *rt, weft_stats *out, size_t size);
static inline int weft_rt_stats(weft_rt *rt, weft_stats *out) {
  return weft_rt_stats_sized(rt, out, sizeof(*out));
}

/* Counters of one shard. Errors: -EINVAL, -ERANGE (shard >= shards). */
WEFT_API int weft_rt_shard_stats_sized(weft_rt *rt, unsigned shard,
                                       weft_shard_stats *out, size_t size);
static inline int weft_rt_shard_stats(weft_rt *rt, unsigned shard,
                                      weft_shard_stats *out) {
  return weft_rt_shard_stats_sized(rt, shard, out, sizeof(*out));
}

#ifdef __cplusplus
}
#endif

#endif /* WEFT_H */
