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
  /* The stuck thread's backtrace, innermost (the function it was in)
   * first, valid only during the callback; NULL and 0 when none was taken:
   * the thread was blocked (a signal would interrupt its system call), or
   * stall_signal is -1 or the application's, or the thread did not answer
   * within 20 ms, or another stall's was taken less than a second before.
   * Name them with dladdr, or with addr2line and the object's base. */
  void *const *frames;
  unsigned nframes;
} weft_stall;

/* Called on the runtime's monitor thread once per stall; it must return
 * quickly and must not call weft functions that wait. It may read the
 * runtime's statistics (weft_rt_stats), even while weft_rt_destroy runs:
 * destroy waits for a call in progress before it frees anything, and no
 * call starts after that. */
typedef void (*weft_stall_fn)(const weft_stall *stall, void *ctx);

/* Log levels, most severe first. */
#define WEFT_LOG_ERROR 1 /* weft could not do what it promised */
#define WEFT_LOG_WARN 2  /* a stall; a resource ran out and weft copes */
#define WEFT_LOG_INFO 3  /* a change of mode (backend fallback, ...) */
#define WEFT_LOG_DEBUG 4 /* some misuse, beside the error code returned */

/* Every message weft writes goes through this: msg is one line without
 * a newline, valid only during the call. Called from any of the
 * runtime's threads (and from a thread inside a weft call), possibly from
 * several at once; it must return quickly and must not call weft
 * functions that wait. */
typedef void (*weft_log_fn)(void *ctx, int level, const char *msg);

/* weft_config.flags */
#define WEFT_CONFIG_NO_MONITOR 1u    /* no monitor: no handoff, no reports */
#define WEFT_CONFIG_NO_TIMER_SPIN 2u /* always sleep: see timer_spin_ns */
#define WEFT_CONFIG_NO_TRACE 4u      /* no flight recorder: see trace_bytes */

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
   * 0: 2 * workers + 4. At least workers (with workers 0, a smaller value
   * is raised to the number chosen), at most 4 * WEFT_MAX_WORKERS. */
  unsigned max_threads;
  /* weft_blocking: most pool threads (0: 4 per CPU the process may run
   * on, at most 64) and most jobs waiting for a thread (0: 1024); the two
   * together under 2^20 (1048576). */
  unsigned blocking_threads;
  unsigned blocking_queue;
  /* Stall reports: NULL logs one line (WEFT_LOG_WARN) naming the handler,
   * at most once a second, followed by a line per frame of the stuck
   * thread's backtrace, or naming the system call it is blocked in
   * (stall_signal). */
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
   * pool of its own, apart from weft_blocking's (0: 8; under 2^20 - 1024).
   * Lookups beyond it wait (up to 1024 of them). */
  unsigned resolve_threads;
  /* The flight recorder (weft_rt_trace_dump): bytes of recent events each
   * thread of the runtime's shards keeps in a ring of its own, 32 bytes an
   * event, allocated when the thread starts (the monitor's and the
   * blocking pools' threads keep an eighth of it). 0: 262144 (8192
   * events); else at least 4096 and at most 2^34, rounded down to a power
   * of two.
   * WEFT_CONFIG_NO_TRACE, or the environment variable WEFT_TRACE=off, turns the
   * recorder off. */
  size_t trace_bytes;
  /* A directory into which the monitor writes a dump of the recorder
   * after it reports a stall, at most one every 10 seconds, named
   * weft-trace-PID-N.txt, and logs its name (WEFT_LOG_WARN). NULL: the
   * environment variable WEFT_TRACE_DIR, else no dumps. */
  const char *trace_dir;
  /* The signal the monitor sends a stuck thread that computes, to take its
   * backtrace for the stall report (weft_stall.frames, and a line per
   * frame after the log's stall line); a blocked thread is not signalled
   * (its system call would return EINTR), and its report names the system
   * call instead. 0: SIGRTMAX - 1; -1: no backtraces. Else SIGUSR1,
   * SIGUSR2 or SIGRTMIN..SIGRTMAX. weft_rt_create installs weft's handler
   * for it if its action is SIG_DFL, and leaves it installed for the life
   * of the process (runtimes share it; it ignores signals nobody asked
   * for). If the application has a handler of its own (or SIG_IGN), it is
   * left alone, and reports come without backtraces (one WEFT_LOG_INFO
   * message says so). The runtime's threads unblock this one signal. */
  int stall_signal;
  /* Nonzero: a simulated runtime, driven by a PRNG seeded with this (see
   * "Simulation" below). Only the weft_sim library simulates; others
   * fail weft_rt_create with -ENOTSUP. In the weft_sim library the
   * environment variable WEFT_SIM_SEED, if it is set (a nonzero number;
   * weft_rt_create fails with -EINVAL for another value), overrides this,
   * so that a run a crash line names replays whatever seed the program
   * sets, and seeds a runtime for which this is 0; 0 and no WEFT_SIM_SEED:
   * a real runtime. */
  uint64_t sim_seed;
  /* A simulation's faults: WEFT_SIM_FAULT_* bits (0: the environment
   * variable WEFT_SIM_FAULTS, a comma-separated list of refuse, break,
   * emfile, smallbuf, enomem, delay, stall, drop, or all; else none).
   * Each kind enabled strikes at one in sim_fault_odds of its chances,
   * drawn from the seed (0: 64; the environment's WEFT_SIM_FAULT_ODDS if
   * set). Ignored by real runtimes. */
  unsigned sim_faults;
  unsigned sim_fault_odds;
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
 * microseconds per shard). The first create of a process also times the
 * CPU's tick counter against the clock, for the latency histograms and
 * the flight recorder (200 us).
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
 * from a handler or a blocking job (weft_blocking) of this runtime without
 * WEFT_SHUTDOWN_NOWAIT: it would wait for itself). Any thread. */
WEFT_API int weft_rt_shutdown(weft_rt *rt, int how);

/* Waits at most timeout_ns for the runtime's shutdown to finish, one not
 * yet started included: a main thread can wait here for a shutdown that
 * a handler starts (on a signal, say: weft_signal_watch). 0 when it has
 * finished, -ETIMEDOUT if not yet, -EINVAL (rt NULL), -EDEADLK (called
 * from a handler or a blocking job of this runtime). Any thread. A simulated
 * runtime runs here, on the caller's thread, for timeout_ns of virtual time
 * (see "Simulation"). */
WEFT_API int weft_rt_wait(weft_rt *rt, uint64_t timeout_ns);

/* Joins every thread and frees the runtime and all its strands, released or
 * not. If no shutdown was started, it first does WEFT_SHUTDOWN_CANCEL; if a
 * NOWAIT shutdown is in progress it waits for it, and for other threads
 * still inside weft_rt_shutdown or weft_rt_wait of rt to return. No weft
 * object of this runtime may be used afterwards, nor rt passed to a call
 * that begins after destroy does.
 * Errors: -EINVAL (rt NULL), -EDEADLK (called from a handler or a blocking
 * job of this runtime; nothing is freed). Any thread but the runtime's
 * own. */
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
 * at shutdown), and so do the callbacks of operations still in flight that
 * complete on it (weft_blocking's done, weft_resolve, weft_fs_*) and of
 * the sockets and child processes made on it, their close and exit
 * callbacks included; the memory is reclaimed after the last of them.
 * Posting to a released strand is a bug: while its handlers are pending it
 * fails with -EBADF; after that, debug builds (WEFT_DEBUG) still catch it with
 * -EBADF and release builds have undefined behaviour. Releasing twice is a bug
 * of the same kind. Any thread, handlers of s included. */
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
 *                         up skips them instead of firing them in a burst;
 *                         the count stops at 4294967295, which a period of
 *                         a nanosecond passes in 4.3 s);
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
 * started by then never runs (see weft_timer_cancel); one whose call has
 * started goes on (from outside the strand it may be entered just after
 * this returns), with the fn and arg it fired with, and does not re-arm a
 * periodic timer.
 * Errors: -EINVAL (t or fn NULL, or the deadline or the first period
 * overflows), -EBADF (t destroyed, or its strand released: a misuse caught
 * while the strand's memory is not yet reused), -ESHUTDOWN, -EBUSY (65535
 * firings of t queued). Any thread. */
WEFT_API int weft_timer_start(weft_timer *t, uint64_t after_ns,
                              uint64_t period_ns, weft_timer_fn fn, void *arg);

/* As weft_timer_start with an absolute deadline (weft_now_ns clock). A
 * deadline in the past fires at once. */
WEFT_API int weft_timer_start_at(weft_timer *t, uint64_t deadline_ns,
                                 uint64_t period_ns, weft_timer_fn fn,
                                 void *arg);

/* Disarms t. Exactly one of "called" and "cancelled" happens to each
 * arming, and the return value says which: 0 when its handler will not be
 * called (the timer was armed, or it had fired and its handler had not
 * started: that firing is dropped); -EALREADY when its handler call has
 * started (called from outside the timer's strand, the handler may be
 * running on another thread, or about to be entered there) or was never
 * due (cancelled before, never started).
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
 * another runtime), -EBADF (done_strand released), -EAGAIN (blocking_queue jobs
 * already wait, or no pool thread could be started), -ESHUTDOWN, -ENOMEM. Any
 * thread. */
WEFT_API int weft_blocking(weft_rt *rt, weft_work_fn work, void *arg,
                           weft_strand *done_strand, weft_done_fn done,
                           weft_job *job);

/* Cancels a job that has not started: 0, and its done gets -ECANCELED;
 * -EALREADY if it has started, finished or is unknown. Any thread. */
WEFT_API int weft_blocking_cancel(weft_rt *rt, weft_job job);

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
 * (SA_RESTART) or return EINTR as the kernel decides; weft's own retry.
 * In a child forked from the process, each watched signal has the action
 * it had before weft's back (the watchers are the parent's). */
typedef struct weft_signal weft_signal;
typedef void (*weft_signal_fn)(void *arg, int signo, uint64_t count);

/* Watches signo: fn runs on strand s (NULL: a strand of the watcher's
 * own). *out (may be NULL: the watcher then lasts until weft_rt_destroy)
 * names it for weft_signal_unwatch. Errors: -EINVAL (rt or fn NULL; signo not
 * one a process can catch and be told of later: SIGKILL, SIGSTOP, or a fault
 * such as SIGSEGV), -EXDEV (s of another runtime), -EBADF (s released),
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

#include "weft/net.h" /* sockets: TCP, Unix, connecting by name, UDP */
#include "weft/sys.h" /* name resolution, files, child processes */

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
  /* In total.handlers_cancelled and total.timers_fired but in no shard's
   * counters: handlers cancelled by a thread after its shard was handed
   * off, timers fired by a thread that held no shard. */
  uint64_t handlers_cancelled_outside;
  uint64_t timers_fired_outside;
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

/* The runtime's counters as text for a monitoring system: as one JSON
 * object (each weft_stats field by its name, "total" and "per_shard" with
 * weft_shard_stats's fields), or in Prometheus's text exposition format
 * (0.0.4: a weft_<field>_total counter per weft_shard_stats field, one
 * series per shard labelled shard="i", plus shard="none" for the counts in
 * no shard's (handlers_run_after_handoff, handlers_cancelled_outside,
 * timers_fired_outside), so that a family's series add up to the total;
 * and a weft_<field> gauge or weft_<field>_total counter for each other
 * weft_stats field; times in seconds). Both also carry the runtime's
 * latency histograms (weft_rt_histogram): JSON's "latency" object has,
 * per kind (sched_delay, turn, timer_late, io_delay, pool_wait), count,
 * sum_ns, max_ns and p50_ns, p90_ns, p99_ns, p99.9_ns; Prometheus has a
 * summary weft_<kind>_seconds with those quantiles, _sum and _count.
 * Writes at most len bytes of it to buf,
 * NUL-terminated when len is not 0, and returns the length of the whole text
 * (not counting the NUL), as snprintf does: a result of len or more means buf
 * was too small (buf NULL and len 0 asks only for the length). The figures are
 * read as weft_rt_stats reads them. Errors: -EINVAL (rt NULL, an unknown
 * format, buf NULL with len not 0), -ENOMEM, -ECHILD. Any thread. */
#define WEFT_METRICS_JSON 1
#define WEFT_METRICS_PROMETHEUS 2
WEFT_API long weft_rt_metrics(weft_rt *rt, int format, char *buf, size_t len);

/* Latency histograms, always on. Kinds:
 *  SCHED_DELAY  from a strand becoming runnable (a post to it while idle,
 *               or its turn requeued after `batch` handlers) or a handler
 *               without strand being posted, to its turn starting: Go's
 *               runnable-to-running latency. Strands are sampled: one
 *               post in 16 (per posting thread) that finds its strand
 *               idle, and the requeues of sampled turns (below); handlers
 *               without strand all count. A socket's callbacks are
 *               measured by IO_DELAY instead.
 *  TURN         how long a run-queue item ran: a strand's turn (up to
 *               `batch` handlers) or a single handler; sampled, one
 *               item in 16 per thread.
 *  TIMER_LATE   how late a timer fired: from its deadline to its firing
 *               (the handler's own start is one SCHED_DELAY later).
 *  IO_DELAY     from the event that queued a socket's callback (a
 *               completion reaped, readiness reported, or weft's own
 *               wake of it) to that callback starting.
 *  POOL_WAIT    a weft_blocking or weft_fs job's wait for a pool thread.
 * Each shard keeps its own; the blocking pool's and what ran after a
 * handoff are the runtime's only. Times come from the CPU's tick counter
 * where it runs at a constant rate (else CLOCK_MONOTONIC), scaled to ns. */
#define WEFT_HIST_SCHED_DELAY 0
#define WEFT_HIST_TURN 1
#define WEFT_HIST_TIMER_LATE 2
#define WEFT_HIST_IO_DELAY 3
#define WEFT_HIST_POOL_WAIT 4
#define WEFT_HIST_KINDS 5

/* Log-linear buckets: bucket i < 16 holds the value i ns; above, eight
 * buckets to each power of two, so a bucket's width is at most an eighth
 * of its values; the last one also holds everything above (about 70 s).
 * weft_histogram_bucket_low(i) is the least value of bucket i. */
#define WEFT_HISTOGRAM_BUCKETS 352

typedef struct weft_histogram {
  uint64_t count;  /* values recorded */
  uint64_t sum_ns; /* their sum */
  uint64_t max_ns; /* the largest */
  uint64_t buckets[WEFT_HISTOGRAM_BUCKETS];
} weft_histogram;

/* Reads one kind's histogram: of one shard, or shard -1 for the whole
 * runtime (every shard's and the runtime's own). Read while it is
 * written: count and the buckets' sum may differ by a few values.
 * Errors: -EINVAL (rt or out NULL, unknown kind, shard out of range).
 * Any thread. */
WEFT_API int weft_rt_histogram_sized(weft_rt *rt, int kind, int shard,
                                     weft_histogram *out, size_t size);
static inline int weft_rt_histogram(weft_rt *rt, int kind, int shard,
                                    weft_histogram *out) {
  return weft_rt_histogram_sized(rt, kind, shard, out, sizeof(*out));
}
/* The q-quantile (0 <= q <= 1; 0.99: the 99th percentile) of h: the
 * highest value of the bucket that holds it, or the maximum if that is
 * less. 0 for an empty histogram. */
WEFT_API uint64_t weft_histogram_percentile(const weft_histogram *h, double q);
/* The least value of bucket i; UINT64_MAX past the last. */
WEFT_API uint64_t weft_histogram_bucket_low(unsigned i);

/* The flight recorder. Each thread of the runtime (the shards' threads
 * and spares, the monitor, the blocking pools' threads) keeps its latest
 * events in a ring of its own (weft_config.trace_bytes): when it starts
 * and ends a run-queue item (a strand's turn of up to `batch` handlers,
 * named by its first and last, or a single handler), parks and wakes,
 * steals, fires a timer, submits and completes I/O, runs a blocking job;
 * the monitor's stalls and handoffs. Single posts are not recorded (each
 * would cost about what running a handler does); a turn's handler count
 * is. Writing an event costs a read of the CPU's tick counter and six
 * stores, with no lock and no shared cache line.
 *
 * weft_rt_trace_dump writes every ring's events as text to fd, times in
 * CLOCK_MONOTONIC nanoseconds, code addresses with their names (the
 * format is in docs/design.md, "The flight recorder"); tools/weft-trace
 * turns a dump into a Chrome trace that Perfetto (ui.perfetto.dev) or
 * chrome://tracing opens, a track per thread and per shard. The rings are
 * read while they are written: an event being written meanwhile is left
 * out. Dumping costs the calling thread a few milliseconds; call it
 * from a blocking job, a signal watcher (weft_signal_watch) or a thread of
 * the application's, rather than from a handler on a busy strand. Any
 * thread. Errors: -EINVAL (rt NULL, fd < 0), -ENOTSUP (recorder off:
 * WEFT_CONFIG_NO_TRACE), -ENOMEM, a write's error. With
 * weft_config.trace_dir, the monitor also dumps after a stall report. */
WEFT_API int weft_rt_trace_dump(weft_rt *rt, int fd);

#include "weft/sim.h" /* simulation, for tests */

#ifdef __cplusplus
}
#endif

#endif /* WEFT_H */
