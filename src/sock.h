/*
 * sock.h, sock.c - the socket object that every kind of socket starts with
 * (a connection, tcp.h; a listening socket, listen.c; a UDP socket,
 * udp.c): its memory, its
 * event word and strand handler, its registration with the backend and
 * with the shutdown sweep, and closing its descriptor.
 *
 * A socket's state is touched only on its strand, with one exception of
 * the base: the event word `ev`, which the backends' reapers, closes from
 * other threads and the shutdown sweep update by CAS (a kind may share
 * more with its reaper: tcp_recv.c). ev packs the socket's generation
 * (high 32 bits) and event bits (low 32 bits), one of which, EV_QUEUED,
 * says that one of the socket's two embedded nodes is queued on its
 * strand. The protocol (bit-test-and-set, writing only on change):
 *   signal:  CAS ev: cur -> cur | bits | EV_QUEUED, unless the generation
 *            differs (a stale readiness event: dropped) or every bit is
 *            already set with EV_QUEUED (nothing changes: no write at all).
 *            The signaller that turned EV_QUEUED on pushes node[post_idx].
 *   run:     (on the strand) post_idx ^= 1, then fetch_and clears every low
 *            bit (acq_rel) and hands the bits it read to the kind.
 * So at most one node of a socket is queued at any time, no bit is lost (a
 * bit set after the clear is either seen by a later run or it queued one),
 * and a node is never pushed while its previous run is still in progress:
 * the node pushed after a run cleared EV_QUEUED is the other one, and the
 * run before it (which used that one) had finished, since one strand runs
 * one node at a time. post_idx is written by the run before its release
 * RMW on ev and read by the signaller after its acquire CAS.
 *
 * EV_LIVE marks a socket registered and not yet freed: set by
 * weft__sock_register, kept by every run, gone with the generation's bump
 * at the free. The shutdown sweep, which finds sockets by walking their
 * pools (pool.h, weft__pool_each) rather than a list, raises only where it
 * is set (weft__sock_ev_raise_live): the same CAS then both checks that
 * the memory holds a live socket and queues its node, and a queued node
 * keeps the free from bumping the generation until it has run.
 *
 * Completions: the reaper stores an operation's result in the socket,
 * then signals (release); the strand reads it after its acquire.
 *
 * Memory: sockets come from pools (one per kind) whose slabs live until
 * the runtime is destroyed; a pool overwrites only the first 16 bytes of a
 * free object (node[0]), so ev and its generation survive a free, and a
 * kind's memory is only ever reused by the same kind. Freeing bumps the
 * generation by CAS, only while EV_QUEUED is clear.
 */
#ifndef WEFT_SOCK_H
#define WEFT_SOCK_H

#include "io.h"
#include "strand.h"
#include "thread.h"

#include <pthread.h>

/* Event bits of every kind; a kind's own start at EV_KIND. */
#define EV_QUEUED (1u << 0)
#define EV_IN (1u << 1)       /* readiness: readable, hang-up or error */
#define EV_OUT (1u << 2)      /* readiness: writable, hang-up or error */
#define EV_HUP (1u << 3)      /* readiness: peer closed its side, or error */
#define EV_KICK (1u << 4)     /* run the state machine again */
#define EV_CLOSE (1u << 5)    /* the user closes it */
#define EV_SHUTDOWN (1u << 6) /* the runtime shuts down */
#define EV_LIVE (1u << 7)     /* registered, not freed: never taken by a run */
#define EV_PRI (1u << 8)      /* readiness (epoll): urgent data arrived */
#define EV_KIND (1u << 9)
#define EV_LOW 0xffffffffull

/* a tag for signals that need no generation check */
#define WEFT_GEN_ANY UINT32_MAX

enum { SK_CONN = 0, SK_LISTEN = 1, SK_UDP = 2, SK_PROC = 3 };
/* state: only forward */
enum {
  ST_NEW = 0,    /* accepted, callback not yet delivered */
  ST_CONNECTING, /* weft_tcp_connect: not connected yet */
  ST_OPEN,       /* connected, or listening */
  ST_CLOSING,    /* closing: waiting for operations in the kernel */
  ST_CLOSED,     /* descriptor closed; the close callback not yet run */
  ST_DONE        /* close callback delivered; freed when no node queued */
};

/* 72 bytes, all every kind needs: its generation is the event word's, its
 * runtime its strand's (weft__sock_gen, weft__sock_rt). */
struct weft__sock {
  struct weft__nhead node[2]; /* node[0] first: the pool may overwrite it */
  _Atomic uint64_t ev;        /* see the top of this file */
  struct weft__ioh ioh;       /* its operations' and readiness's handle */
  int fd;
  uint8_t kind, state; /* kind: which strand handler runs it (sock.c) */
  bool free_pending;   /* freed once the queued node has run */
  uint8_t post_idx;
  /* when the event that queued the socket's node came (weft__ticks), for
   * WEFT_HIST_IO_DELAY: written before the post, read by the node's run
   * (one node is queued at a time: EV_QUEUED) */
  uint64_t queued_at;
  weft_strand *strand;
};

/* The generation of s's current life: the event word's high half, which
 * only the free moves on (weft__sock_ev_retire, weft__sock_discard). Any
 * thread; read off the strand, it is the life s had at some moment of the
 * call. */
static inline uint32_t weft__sock_gen(const struct weft__sock *s) {
  return (uint32_t)(weft__load(&s->ev, WA_RLX) >> 32);
}

/* Its runtime: its strand's, which outlives it. */
static inline weft_rt *weft__sock_rt(const struct weft__sock *s) {
  return s->strand->rt;
}

/* The event word's steps (the protocol at the top of this file), here so
 * that the model tests (tests/model/) drive the same code. */

/* Any thread: sets bits on s unless gen_tag is stale. True: this caller
 * turned EV_QUEUED on, and pushes node[post_idx]. */
static inline bool weft__sock_ev_raise(struct weft__sock *s, uint64_t bits,
                                       uint32_t gen_tag) {
  uint64_t cur = weft__load(&s->ev, WA_ACQ);
  for (;;) {
    if (gen_tag != WEFT_GEN_ANY && (uint16_t)(cur >> 32) != (uint16_t)gen_tag)
      return false; /* an event for an earlier life of this memory */
    if ((cur & bits) == bits && (cur & EV_QUEUED))
      return false; /* nothing would change: do not write */
    if (weft__cas(&s->ev, &cur, cur | bits | EV_QUEUED, WA_AR, WA_ACQ))
      return !(cur & EV_QUEUED);
  }
}

/* Sets bits on s if it holds a live socket (EV_LIVE) of life gen_tag
 * (WEFT_GEN_ANY: any): the shutdown sweep's raise, and a signal from a
 * thread that holds s by the user's handle only. True: this caller turned
 * EV_QUEUED on. */
static inline bool weft__sock_ev_raise_live(struct weft__sock *s, uint64_t bits,
                                            uint32_t gen_tag) {
  /* seq_cst, against weft__sock_register's (sock.c has the argument) */
  uint64_t cur = weft__load(&s->ev, WA_SC);
  for (;;) {
    if (!(cur & EV_LIVE))
      return false; /* free, never registered, or not yet */
    if (gen_tag != WEFT_GEN_ANY && (uint32_t)(cur >> 32) != gen_tag)
      return false;
    if ((cur & bits) == bits && (cur & EV_QUEUED))
      return false;
    if (weft__cas(&s->ev, &cur, cur | bits | EV_QUEUED, WA_SC, WA_ACQ))
      return !(cur & EV_QUEUED);
  }
}

/* On the strand, running node[idx]: the next push takes the other node;
 * returns the word's low bits, now cleared (all but EV_LIVE). */
static inline uint32_t weft__sock_ev_take(struct weft__sock *s, unsigned idx) {
  s->post_idx = idx ^ 1;
  return (uint32_t)weft__fetch_and(&s->ev, ~EV_LOW | EV_LIVE, WA_AR) & ~EV_LIVE;
}

/* On the strand, freeing s: the next generation, if no node is queued
 * (true); false: the queued node's run frees s. */
static inline bool weft__sock_ev_retire(struct weft__sock *s) {
  uint64_t cur = weft__load(&s->ev, WA_ACQ);
  uint64_t next = (uint64_t)((uint32_t)(cur >> 32) + 1) << 32;
  return !(cur & EV_QUEUED) && weft__cas(&s->ev, &cur, next, WA_AR, WA_ACQ);
}

static inline struct weft__sock *weft__sock_of(struct weft__ioh *h) {
  return (struct weft__sock *)((char *)h - offsetof(struct weft__sock, ioh));
}

/* *out: a socket of a kind (its memory from that kind's pool, everything
 * zero but the generation), on strand (NULL: a new strand of its own,
 * released once no socket is on it: strand.h, socks),
 * with the kind's completion handler; counted as an open descriptor
 * (rt.c, busy).
 * Returns 0, -ENOMEM, or -ESHUTDOWN (its own strand refused: the runtime
 * is shutting down); on error fd is left open. */
int weft__sock_new(struct weft__sock **out, weft_rt *rt, int kind, int fd,
                   weft_strand *strand,
                   void (*done)(struct weft__ioh *, struct weft__shard *,
                                unsigned, const struct weft__cqe *));
/* The kinds' strand handlers, each with the bits the run cleared: a
 * connection's (tcp.c), a listening socket's (listen.c), a UDP socket's
 * (udp.c), a child process's (process.c). sock.c calls the one of the
 * socket's kind. */
void weft__conn_run(struct weft__sock *s, uint32_t bits);
void weft__lsock_run(struct weft__sock *s, uint32_t bits);
void weft__udp_run(struct weft__sock *s, uint32_t bits);
void weft__proc_run(struct weft__sock *s, uint32_t bits);
/* The strand's runner (strand.c) found node h of a socket at its queue's
 * head: takes the socket's bits and calls its kind's handler. */
void weft__sock_node_run(struct weft__nhead *h);
/* Publishes s (every field set before this call), registers it with its
 * home shard's backend (watching output too if out), marks it live for
 * the shutdown sweep and raises bits (0: none) on it, from any thread.
 * -ESHUTDOWN once the runtime shuts down, or the backend's error: the
 * caller then discards s, which nobody has seen. A runtime that starts to
 * shut down during the call may shut s down instead, after a return of 0:
 * s may be freed by then, so the caller signals it only through bits. */
int weft__sock_register(struct weft__sock *s, unsigned home, bool out,
                        uint64_t bits);
/* The same in two steps, for a caller that makes several sockets and may
 * still discard them all (a listener): weft__sock_watch publishes and
 * watches s (the backend's error; it does not check for a shutdown), and
 * later weft__sock_live marks it live and raises bits, for the generation
 * s had when it was watched, and has it shut down if the runtime began to
 * meanwhile. Between the two the shutdown sweep does not see s, so the
 * caller may discard it as long as no event of the watch has queued it. */
int weft__sock_watch(struct weft__sock *s, unsigned home, bool out);
void weft__sock_live(struct weft__sock *s, uint32_t gen, uint64_t bits);
/* Frees a socket that was never registered or never seen by the user. */
void weft__sock_discard(struct weft__sock *s);
/* Frees s (on its strand) once no node of it is queued. */
void weft__sock_free(struct weft__sock *s);
/* Closes the descriptor (through the calling thread's ring if it has one:
 * io.h); every operation on it has completed. */
void weft__sock_close_fd(struct weft__sock *s);

/* Sets bits on s and queues its handler if it was not; gen_tag: the
 * generation the event was registered with (readiness), or WEFT_GEN_ANY.
 * local: the calling thread's shard, or NULL. */
void weft__sock_signal(struct weft__shard *local, struct weft__sock *s,
                       uint64_t bits, uint32_t gen_tag);
/* The same from any thread, for s's life gen (weft__sock_gen, read while
 * the caller knew that life was going on) of runtime rt, once s is live:
 * a signal for a life that ended since is dropped before anything but the
 * event word is read. */
void weft__sock_notify(weft_rt *rt, struct weft__sock *s, uint64_t bits,
                       uint32_t gen);
/* From the socket's strand: raise bits on it. */
void weft__sock_raise(struct weft__sock *s, uint64_t bits);
/* From the socket's strand: run its state machine again soon. */
void weft__sock_kick(struct weft__sock *s);
/* The same, after the other strands queued on this shard: the kick goes
 * on s's strand and that strand's turn ends with the running handler
 * (a handler that spent its budget and has more to do). */
void weft__sock_yield(struct weft__sock *s);
/* A readiness report (io_epoll.c) for s, whose memory may have been reused
 * since: signalled with the report's generation, so a stale one is
 * dropped before anything but the event word is read. */
void weft__sock_ready(struct weft__shard *local, struct weft__sock *s,
                      const struct weft__cqe *c);
/* Whether the calling thread runs s's strand now (the verbs' check). */
static inline bool weft__sock_on_strand(const struct weft__sock *s) {
  return weft__current_strand() == s->strand;
}
/* The home shard of a socket made by the calling thread: its own shard,
 * or the shards in turn for threads outside the runtime. */
unsigned weft__sock_home(weft_rt *rt);

/* The runtime's side: the shutdown sweep (every live socket gets
 * EV_SHUTDOWN) and counters. Each kind's pool is its own file's (tcp.c,
 * listen.c, udp.c). */
void weft__socks_shutdown(weft_rt *rt);
void weft__net_stats(weft_rt *rt, weft_stats *out);

#endif
