/*
 * rt.h, rt.c - the runtime: its settings, and each part's runtime-wide
 * state in a sub-struct of its own; the life of a runtime (create,
 * shutdown, destroy) and its statistics. The parts' per-shard state is in
 * struct weft__shard (shard.h).
 */
#ifndef WEFT_RT_H
#define WEFT_RT_H

#include "core.h"
#include "hist.h"
#include "log.h"
#include "park.h"
#include "pool.h"
#include "runq.h"
#include "trace.h"

#include <pthread.h>

/* Lifecycle; closing and cancelling only go 0 -> 1. busy counts what may
 * still push work or hold a descriptor from outside the run loop (rt.c,
 * "Work outside the run loop"). */
struct weft__life {
  _Atomic uint32_t closing WEFT_ALIGNED;
  _Atomic uint32_t cancelling;
  _Atomic uint32_t done; /* all accepted work finished */
  _Atomic int64_t busy;
  pthread_mutex_t lock; /* guards the fields below */
  pthread_cond_t cond;
  unsigned started; /* eager threads that reached their loop */
  /* threads inside weft_rt_shutdown or weft_rt_wait: weft_rt_destroy
   * frees nothing until none is (rt.c, caller_enter) */
  unsigned callers;
  bool shutdown_called;
};

struct weft_rt {
  /* Set at create, read by every thread. */
  uint32_t fork_gen; /* weft__fork_gen at create (weft__forked) */
  unsigned nshards;
  unsigned batch;
  struct weft__shard *shards;   /* in arena */
  struct weft__thread *threads; /* in arena */
  void *arena; /* one mapping: shards, threads, the pools' first objects */
  size_t arena_bytes;
  struct {
    unsigned slack_ns; /* of every runtime thread */
    unsigned spin_ns;  /* 0: never spin (shard.c, spin_to_timer) */
  } tm;
  /* The monitor (monitor.c). stamp: handlers record their start. */
  struct {
    _Atomic uint32_t stamp;
    bool membarrier_ok; /* registered in create, before our threads */
    uint64_t stall_ns;
    weft_stall_fn on_stall;
    void *on_stall_ctx;
    int bt_sig; /* the stall signal, with weft's handler; 0: none */
    struct weft__monitor *m;
  } mon;
  struct weft__log log;

  struct weft__inject inject;
  struct weft__idle idle;
  struct weft__pool node_pool;

  /* Threads: the shards' own and spares (thread.c, park.c, monitor.c). */
  struct {
    pthread_attr_t attr;      /* stack size of every runtime thread */
    pthread_attr_t lazy_attr; /* the same and the creator's CPU affinity */
    unsigned max;             /* most threads, spares included */
    unsigned neager;          /* shards whose threads weft_rt_create starts */
    unsigned n;               /* slots in use in threads[] */
    pthread_mutex_t spare_lock;
    unsigned nspares;
    struct weft__thread **spares;
    _Atomic uint64_t start_errors; /* lazy starts that failed (park.c) */
    _Atomic uint32_t start_failed; /* 1 once a lazy start failed */
    _Atomic uint32_t all_started;  /* 1 once no shard's thread is dormant */
  } th;

  /* I/O backends (io.c). */
  struct {
    int backend;          /* WEFT_BACKEND_URING, _EPOLL or _NONE */
    bool ring_accept;     /* uring: listeners accept with multishot requests */
    bool ring_files;      /* uring: file operations are ring requests */
    struct weft__io *ios; /* one per shard, NULL for NONE */
    _Atomic uint32_t all; /* every shard's backend is set up */
    pthread_mutex_t lock; /* setting them up (weft__io_ensure) */
  } io;

  /* Sockets (sock.c, tcp.c, tcp_recv.c, listen.c, udp.c). */
  struct {
    struct weft__pool conn_pool;     /* connections */
    struct weft__pool lsock_pool;    /* listening sockets */
    struct weft__pool udp_pool;      /* UDP sockets (udp.c) */
    struct weft__pool proc_pool;     /* child processes (process.c) */
    struct weft__pool send_pool;     /* uring: sends in the kernel */
    struct weft__pool wstate_pool;   /* connections' writes (tcp_send.c) */
    _Atomic uint64_t live;           /* sockets not yet freed */
    _Atomic uint32_t rr;             /* home shard of sockets made outside */
    _Atomic uint32_t no_poll_first;  /* the kernel refused POLL_FIRST */
    _Atomic uint32_t no_multishot;   /* it refused a multishot receive */
    _Atomic uint64_t recv_nobufs;    /* multishot receives that found none */
    struct weft_listener *listeners; /* under life.lock; freed at destroy */
    /* The spare descriptor of Unix listeners' drops (listen.c,
     * drop_with_spare; spare_open and spare under limit_lock), opened by
     * the first Unix listener, closed at destroy. */
    pthread_mutex_t limit_lock;
    bool spare_open;
    int spare;
  } net;

  struct weft__life life;

  /* Counts made outside any shard (a thread outside the runtime, or one
   * that lost its shard to a handoff); the shards count the rest. */
  struct {
    _Atomic uint32_t home_rr; /* home of strands, timers made outside */
    _Atomic uint64_t strands_created, strands_freed;
    _Atomic uint64_t handlers_run, handlers_cancelled; /* after a handoff */
    _Atomic uint64_t timers_fired;
    struct weft__hist hist[WEFT_HIST_KINDS]; /* any thread (hist.h) */
  } outside;

  struct weft__trace trace; /* the flight recorder (trace.c) */

  struct weft__blocking *blocking;
  struct weft__blocking *resolver; /* weft_resolve's pool (resolve.c) */

#ifdef WEFT_SIM
  /* Simulation (sim.c): NULL for a real runtime. sim_claim: which count
   * of sim.c's this runtime holds (0 none, 1 real, 2 simulated). */
  struct weft__sim *sim;
  int sim_claim;
#endif
};

/* Whether rt is simulated (sim.h); false outside the weft_sim library. */
static inline bool weft__simulated(const weft_rt *rt) {
#ifdef WEFT_SIM
  return rt->sim != NULL;
#else
  (void)rt;
  return false;
#endif
}

/* Work outside the run loop (rt.c has the argument): a post or a timer
 * start from a thread outside the runtime enters (0, or -ESHUTDOWN once
 * closing, having counted nothing); a job of the blocking pool, an open
 * socket, a handler bypassed by a handoff add themselves; each drops
 * itself once it pushed all it will push. */
int weft__busy_enter(weft_rt *rt);

/* fork: the count of forks this process descends from, bumped in the
 * child (pthread_atfork, registered by the first weft_rt_create). A
 * runtime made before a fork has no threads in the child, and its locks
 * may be held by threads that are not there: every call on it fails with
 * -ECHILD there. Only the child writes, while it is single-threaded, so
 * a relaxed load sees it. */
extern _Atomic uint32_t weft__fork_gen;
static inline bool weft__forked(const weft_rt *rt) {
  return weft__load(&weft__fork_gen, WA_RLX) != rt->fork_gen;
}
void weft__busy_add(weft_rt *rt, int64_t n);
void weft__busy_drop(weft_rt *rt, int64_t n);

#endif
