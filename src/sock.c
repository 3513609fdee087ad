/*
 * sock.c - the socket object (sock.h): memory, the event word and the
 * strand handler that hands its bits to the kind, registration with the
 * backend, closing the descriptor, freeing, and the shutdown sweep. Owns
 * struct weft__sock.
 */
#include "sock.h"

#include "io.h"
#include "rt.h"
#include "shard.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <string.h>

/* ---- the event word ------------------------------------------------------ */

/* After a raise that turned EV_QUEUED on: pushes the node it names. */
static void queue(struct weft__shard *local, struct weft__sock *s) {
  s->queued_at = weft__ticks(); /* the push orders it before the run */
  weft__strand_push_sock(s->strand, local, &s->node[s->post_idx]);
}

void weft__sock_signal(struct weft__shard *local, struct weft__sock *s,
                       uint64_t bits, uint32_t gen_tag) {
  if (weft__sock_ev_raise(s, bits, gen_tag))
    queue(local, s);
}

void weft__sock_ready(struct weft__shard *local, struct weft__sock *s,
                      const struct weft__cqe *c) {
  uint64_t bits = 0;
  if (c->events & WEFT_IO_IN)
    bits |= EV_IN;
  if (c->events & WEFT_IO_OUT)
    bits |= EV_OUT;
  if (c->events & WEFT_IO_HUP)
    bits |= EV_HUP;
  if (c->events & WEFT_IO_PRI)
    bits |= EV_PRI;
  weft__sock_signal(local, s, bits, c->gen);
}

void weft__sock_notify(weft_rt *rt, struct weft__sock *s, uint64_t bits,
                       uint32_t gen) {
  struct weft__shard *sh = weft__local_begin(rt);
  if (weft__sock_ev_raise_live(s, bits, gen))
    queue(sh, s);
  weft__local_end(sh);
}

void weft__sock_raise(struct weft__sock *s, uint64_t bits) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(s));
  weft__sock_signal(sh, s, bits, weft__sock_gen(s));
  weft__local_end(sh);
}

void weft__sock_kick(struct weft__sock *s) { weft__sock_raise(s, EV_KICK); }

void weft__sock_yield(struct weft__sock *s) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(s));
  if (sh)
    sh->yield_turn = true; /* read by this thread's strand loop */
  weft__sock_signal(sh, s, EV_KICK, weft__sock_gen(s));
  weft__local_end(sh);
}

unsigned weft__sock_home(weft_rt *rt) {
  struct weft__shard *sh = weft__local_begin(rt);
  unsigned home = sh ? sh->idx : weft__fetch_add(&rt->net.rr, 1, WA_RLX);
  weft__local_end(sh);
  return home % rt->nshards;
}

/* From the event that queued a socket's node to its run. */
static void io_delay(weft_rt *rt, uint64_t queued) {
  uint64_t ns = weft__span_ns(queued, weft__ticks());
  struct weft__shard *sh = weft__local_begin(rt);
  if (sh)
    weft__hist_add(&sh->hist[WEFT_HIST_IO_DELAY], ns);
  else
    weft__hist_add_shared(&rt->outside.hist[WEFT_HIST_IO_DELAY], ns);
  weft__local_end(sh);
}

void weft__sock_node_run(struct weft__nhead *h) {
  unsigned idx = h->idx;
  struct weft__sock *s =
      (struct weft__sock *)((char *)(h - idx) -
                            offsetof(struct weft__sock, node));
  io_delay(weft__sock_rt(s), s->queued_at);
  uint32_t bits = weft__sock_ev_take(s, idx);
  if (s->state == ST_DONE) {
    if (s->free_pending) {
      s->free_pending = false;
      weft__sock_free(s);
    }
    return;
  }
  switch (s->kind) {
  case SK_CONN:
    weft__conn_run(s, bits);
    break;
  case SK_LISTEN:
    weft__lsock_run(s, bits);
    break;
  case SK_UDP:
    weft__udp_run(s, bits);
    break;
  default:
    weft__proc_run(s, bits);
    break;
  }
}

/* ---- life ------------------------------------------------------------------
 */

/* Each kind's memory: connections from the shard's cache, listening and
 * UDP sockets and child processes (few, long-lived) from the depot. */
static struct weft__pool *pool_of(weft_rt *rt, int kind) {
  return kind == SK_CONN     ? &rt->net.conn_pool
         : kind == SK_LISTEN ? &rt->net.lsock_pool
         : kind == SK_UDP    ? &rt->net.udp_pool
                             : &rt->net.proc_pool;
}

static struct weft__pool_cache *cache_of(struct weft__shard *sh, int kind) {
  return sh && kind == SK_CONN ? &sh->cache.conn : NULL;
}

static void mem_free(weft_rt *rt, int kind, struct weft__sock *s) {
  struct weft__shard *sh = weft__local_begin(rt);
  weft__pool_free(pool_of(rt, kind), cache_of(sh, kind), s);
  weft__local_end(sh);
}

int weft__sock_new(struct weft__sock **out, weft_rt *rt, int kind, int fd,
                   weft_strand *strand,
                   void (*done)(struct weft__ioh *, struct weft__shard *,
                                unsigned, const struct weft__cqe *)) {
  struct weft__pool *pool = pool_of(rt, kind);
  struct weft__shard *sh = weft__local_begin(rt);
  /* A simulation's allocation failure: a connection's only (sim.h). */
  struct weft__sock *s =
      kind == SK_CONN && weft__sim_fault(rt, WEFT_SIM_FAULT_ENOMEM)
          ? NULL
          : weft__pool_alloc(pool, cache_of(sh, kind));
  weft__local_end(sh);
  if (!s)
    return -ENOMEM;
  /* All but ev, whose generation survives a free. */
  memset(s, 0, offsetof(struct weft__sock, ev));
  memset((char *)s + offsetof(struct weft__sock, ioh), 0,
         pool->objsize - offsetof(struct weft__sock, ioh));
  for (unsigned i = 0; i < 2; i++) {
    s->node[i].kind = WEFT_NODE_SOCK;
    s->node[i].idx = i;
  }
  s->ioh.done = done;
  s->fd = fd;
  s->kind = (uint8_t)kind;
  if (strand) {
    /* The user's strand may be released while s is open: its callbacks,
     * the close callback last, still go there (really_free unholds). One
     * weft made is released by its last socket instead. */
    if (!strand->weft_made)
      weft__strand_hold(strand);
    s->strand = strand;
  } else {
    int r = weft_strand_create(rt, &s->strand);
    if (r) {
      mem_free(rt, kind, s);
      return r;
    }
    s->strand->weft_made = true;
  }
  weft__fetch_add(&s->strand->socks, 1, WA_RLX);
  weft__fetch_add(&rt->net.live, 1, WA_RLX);
  weft__busy_add(rt, 1); /* its descriptor: dropped when closed */
  *out = s;
  return 0;
}

/* The sweep and the registration, each a store then a load, both seq_cst:
 * register marks s live (RMW on ev), then reads closing; shutdown stores
 * closing, then the sweep reads each socket's ev. In the single order of
 * the four, if register's load comes first (it reads 0), its RMW precedes
 * the sweep's load, which sees EV_LIVE and signals s; else register sees
 * closing and signals s itself. Either way s gets EV_SHUTDOWN, perhaps
 * twice (a raise is idempotent). The sweep finds s's memory because the
 * pool carved it before register ran, and the walk reads the pool's slabs
 * under its lock after shutdown stored closing (pool.c).
 *
 * EV_LIVE goes on only after the watch (weft__sock_live after
 * weft__sock_watch): a watch that fails leaves s seen by nobody, so the
 * caller may discard it. Events the watch delivers may run s's handler
 * before EV_LIVE is set, and even free it; the CAS sets it only on the
 * generation that was watched. The same CAS raises the caller's first
 * bits, so they come before the sweep's or with them: once s is live, the
 * sweep may have it closed and freed at any time, and a signal made after
 * could no longer tell which life it meant. */
int weft__sock_watch(struct weft__sock *s, unsigned home, bool out) {
  weft_rt *rt = weft__sock_rt(s);
  /* release: publishes every field the creator set to reapers and
   * signallers (their acquire CAS), before any event can name s. */
  weft__store(&s->ev, (uint64_t)weft__sock_gen(s) << 32, WA_REL);
  struct weft__shard *reg = &rt->shards[home % rt->nshards];
  return weft__io_watch(rt, reg, s->fd, &s->ioh, weft__sock_gen(s), out);
}

void weft__sock_live(struct weft__sock *s, uint32_t gen, uint64_t bits) {
  weft_rt *rt = weft__sock_rt(s);
  uint64_t cur = (uint64_t)gen << 32;
  uint64_t add = EV_LIVE | (bits ? bits | EV_QUEUED : 0);
  while ((uint32_t)(cur >> 32) == gen &&
         !weft__cas(&s->ev, &cur, cur | add, WA_SC, WA_RLX))
    ;
  struct weft__shard *sh = weft__local_begin(rt);
  if (bits && (uint32_t)(cur >> 32) == gen && !(cur & EV_QUEUED))
    queue(sh, s); /* this CAS turned EV_QUEUED on */
  if (weft__load(&rt->life.closing, WA_SC))
    weft__sock_signal(sh, s, EV_SHUTDOWN, gen);
  weft__local_end(sh);
}

int weft__sock_register(struct weft__sock *s, unsigned home, bool out,
                        uint64_t bits) {
  if (weft__load(&weft__sock_rt(s)->life.closing, WA_SC))
    return -ESHUTDOWN;
  uint32_t gen = weft__sock_gen(s); /* s may be reused once watched */
  int r = weft__sock_watch(s, home, out);
  if (!r)
    weft__sock_live(s, gen, bits);
  return r;
}

void weft__sock_close_fd(struct weft__sock *s) {
  if (s->fd < 0)
    return;
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(s));
  weft__io_close(weft__sock_rt(s), sh, s->fd);
  weft__local_end(sh);
  s->fd = -1;
}

static void really_free(struct weft__sock *s) {
  weft_rt *rt = weft__sock_rt(s);
  /* acq_rel: the last socket's release follows every other socket's use
   * of the strand. */
  weft_strand *st = s->strand;
  bool made = st->weft_made;
  if (weft__fetch_sub(&st->socks, 1, WA_AR) == 1 && made)
    weft_strand_release(st);
  else if (!made)
    weft__strand_unhold(st); /* the hold weft__sock_new took */
  weft__fetch_sub(&rt->net.live, 1, WA_RLX);
  mem_free(rt, s->kind, s);
}

static void final_free(void *arg) { really_free(arg); }

void weft__sock_free(struct weft__sock *s) {
  s->state = ST_DONE;
  /* Only while no node is queued; else that node's run frees it. Stale
   * readiness events fail their generation check from here on, so nothing
   * pushes a node of s again. */
  if (!weft__sock_ev_retire(s)) {
    s->free_pending = true;
    return;
  }
  /* Not here: the strand still reads the node that is running now. A
   * pooled node runs after it. Without memory for one, s stays out of
   * its pool until weft_rt_destroy frees the pools. */
  weft_rt *rt = weft__sock_rt(s);
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__node *n = weft__node_new(rt, sh, final_free, final_free, s);
  if (n)
    weft__node_post(rt, sh, s->strand, n, false);
  weft__local_end(sh);
}

void weft__sock_discard(struct weft__sock *s) {
  weft__sock_close_fd(s);
  weft__store(&s->ev, (uint64_t)(weft__sock_gen(s) + 1) << 32, WA_REL);
  really_free(s);
}

/* ---- the runtime's side ----------------------------------------------------
 */

static void sweep_one(void *obj, void *arg) {
  struct weft__sock *s = obj;
  (void)arg;
  if (weft__sock_ev_raise_live(s, EV_SHUTDOWN, WEFT_GEN_ANY))
    queue(NULL, s);
}

/* Every live socket of every kind, wherever it was made: their pools hold
 * them all (register's comment has why none is missed). */
void weft__socks_shutdown(weft_rt *rt) {
  if (rt->io.backend == WEFT_BACKEND_NONE)
    return;
  weft__pool_each(&rt->net.conn_pool, sweep_one, NULL);
  weft__pool_each(&rt->net.lsock_pool, sweep_one, NULL);
  weft__pool_each(&rt->net.udp_pool, sweep_one, NULL);
  weft__pool_each(&rt->net.proc_pool, sweep_one, NULL);
}

void weft__net_stats(weft_rt *rt, weft_stats *out) {
  out->tcp_live = weft__load(&rt->net.live, WA_RLX);
  out->recv_nobufs = weft__load(&rt->net.recv_nobufs, WA_RLX);
}
