/*
 * listen.c - listeners (listen.h): one listening socket per shard bound
 * with SO_REUSEPORT (or one socket, WEFT_LISTEN_SINGLE), accepting, and
 * running out of descriptors. Owns struct weft_listener, the listening
 * sockets (struct lsock) and their pool.
 *
 * Why a socket per shard: the kernel spreads incoming connections over the
 * sockets of a reuseport group by a hash of the 4-tuple, each socket has
 * its own accept queue and lock, and each is served by its own strand, so
 * nothing on the accept path is shared between shards, in the kernel or
 * here (compare one socket whose accept queue every thread contends on,
 * docs/cases.md, "HAProxy's multi-threaded accept"). The costs: a stuck
 * shard's queue waits for the monitor's handoff; and a SO_REUSEPORT socket
 * of the same user binding the address joins the group, so the group would
 * join one bound there before it. A bind without SO_REUSEPORT just before
 * the group's (probe_free) makes an address in use fail instead, unless
 * the caller shares it (WEFT_LISTEN_SHARE). Every TCP socket is bound
 * with SO_REUSEPORT, a group of one included (WEFT_LISTEN_SINGLE, or a
 * runtime of one shard): net.h lets a WEFT_LISTEN_SHARE listener join any
 * listener, and a socket bound without it can be joined by nobody.
 *
 * Out of descriptors (EMFILE, ENFILE; ENOBUFS, ENOMEM alike), a socket
 * drops the connections waiting on it, so that their clients see a reset
 * instead of hanging, and pauses accepting for a backoff that doubles
 * from 1 ms to 100 ms and resets on the next successful accept. No accept
 * call is made while paused. A TCP socket drops its queue without any
 * descriptor (reset_queue): shutdown(2) of a listening socket resets
 * every connection waiting, and listen(2) opens it again on the same
 * port. A Unix socket cannot (its shutdown leaves the queue as it is):
 * it accepts and closes up to 64, through a spare descriptor the runtime
 * keeps open for that (/dev/null, opened by the first Unix listener)
 * and closes just before (drop_with_spare). Any descriptor opened in the
 * process between that close and the accept (a TCP accept, a file, the
 * monitor's read of /proc) can take the freed slot: the drop then stops,
 * and the spare is reopened before the socket's next accept.
 *
 * TCP does without the spare because nothing inside weft can keep the
 * freed slot for the drop: under load the monitor's reads of /proc took
 * it, and an accept that then took the last slot left the spare none.
 */
#include "listen.h"

#include "log.h"
#include "rt.h"
#include "sim.h"
#include "sock.h"
#include "strand.h"
#include "tcp.h"
#include "thread.h"
#include "timer.h"
#include "unix.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#define ACCEPT_BUDGET 64
#define ACCEPTQ_KEEP 256 /* room an emptied queue array keeps */
#define BACKOFF_MIN_NS 1000000ull
#define BACKOFF_MAX_NS 100000000ull

struct weft_listener {
  weft_rt *rt;
  struct weft_listener *next; /* rt->net.listeners, under life.lock */
  weft_accept_fn fn;          /* the accept callback */
  void *arg;
  /* Who calls done is decided on one word: (items << 1) | 1 once
   * weft_listener_close has won, where the items are the open sockets and
   * the accepted connections whose accept callback has not yet run (it
   * runs on the connection's strand, after the listener's turn: done must
   * wait for it, test_tcp_listen_close). The closer's fetch_or and each
   * item's fetch_sub are ordered, so either the closer sees items left
   * (returns 0, and the last one to finish sees the bit and calls done) or
   * it sees none (returns -EALREADY: a shutdown closed them, done is not
   * called). Two words, a flag and a count, would let both happen at
   * once: the closer sets the flag, the last socket finishes, sees it and
   * calls done, and then the closer reads a count of 0 and returns
   * -EALREADY. */
  _Atomic uint64_t live;
  _Atomic uint32_t close_claim; /* 1 once a weft_listener_close won */
  /* 1 once weft_tcp_listen has made and watched every socket; until then
   * none accepts (weft__lsock_run), so a listen that fails never has. */
  _Atomic uint32_t ready;
  weft_fn done;
  void *done_arg;
  struct sockaddr_storage addr;
  unsigned addrlen;
  struct weft__unix_file file; /* a Unix listener's socket file */
#ifdef WEFT_SIM
  /* A simulation's listener on a TCP port, whose socket is a Unix one
   * (sim.h): the address it was given, its port filled in; 0: none. */
  struct sockaddr_storage sim_addr;
  unsigned sim_addrlen;
#endif
  _Atomic uint64_t st_accepted, st_calls, st_limit, st_dropped, st_paused;
  int backlog;   /* listen(2)'s, again after a reset (reset_queue) */
  bool migrates; /* a reset moves the queue to the group (reset_queue) */
  unsigned n;
  uint32_t *gens; /* socks[i]'s generation, for signals after its free */
  struct lsock *socks[];
};

/* Descriptors a multishot accept delivered. */
struct acceptq {
  int *fd;
  uint32_t n, cap;
};

/* A listening socket; everything but the base's ev (sock.h), q (under
 * qlock) and what the reaper stores before it signals (aend) is its
 * strand's. The reaper appends to q what the multishot accept delivers;
 * the strand takes q whole, leaving its own emptied array (taken) in its
 * place, so neither holds qlock for more than a few stores, and no array
 * is allocated once both have grown. They grow in the reaper: one turn of
 * the kernel's accept takes every connection waiting (a whole backlog);
 * the strand makes ACCEPT_BUDGET connections a turn, and gives an array
 * grown past ACCEPTQ_KEEP back once it has emptied it. The end travels
 * with the signal (EV_AEND), not in q: the strand may free the socket once
 * it sees the end, and the reaper's signal comes after its unlock. */
struct lsock {
  struct weft__sock s;
  struct weft_listener *lst;
  weft_timer *timer; /* the backoff's */
  uint64_t backoff_ns;
  unsigned idx;   /* in lst->socks */
  bool readable;  /* connections may wait */
  bool polling;   /* uring: a poll of the socket is in the kernel */
  bool accepting; /* uring: a multishot accept is in the ring */
  bool multishot; /* uring: it accepts so, when not polling */
  bool paused;
  bool placed;     /* uring: sent home once (go_home) */
  bool at_limit;   /* the last accept burst ran out of descriptors */
  bool unlistened; /* TCP: its listen(2) after a reset failed: again */
  bool respare;    /* Unix: its last drop left no spare: reopen first */
  pthread_mutex_t qlock;
  struct acceptq q, taken;
  uint32_t tpos; /* taken's next descriptor */
  bool ended;    /* EV_AEND came: once q and taken are empty, see aend */
  int32_t aend;  /* uring: the multishot accept's last result if < 0, or 0 */
};

/* A listening socket's own event bits (sock.h has the shared ones). */
#define EV_POLLED (EV_KIND << 0) /* uring: the poll completed */
#define EV_ADONE (EV_KIND << 1)  /* uring: the multishot accept delivered */
#define EV_AEND (EV_KIND << 2)   /* uring: the multishot accept ended (aend) */

static bool completes(const struct lsock *ls) {
  return weft__io_completes(weft__sock_rt(&ls->s));
}

/* Listening sockets are non-blocking with both backends; what an accepted
 * socket is follows the backend (io.h, weft__io_sock_flags). */
static int sync_accept(struct lsock *ls) {
  struct weft_listener *l = ls->lst;
  weft__fetch_add(&l->st_calls, 1, WA_RLX);
  if (weft__sim_fault(weft__sock_rt(&ls->s), WEFT_SIM_FAULT_EMFILE))
    return -EMFILE;
  int flags = SOCK_CLOEXEC | weft__io_sock_flags(weft__sock_rt(&ls->s));
  int fd = accept4(ls->s.fd, NULL, NULL, flags);
  return fd < 0 ? -errno : fd;
}

static void resume(void *arg, int status, uint64_t missed) {
  struct lsock *ls = arg;
  (void)missed;
  if (status || ls->s.state != ST_OPEN)
    return;
  ls->paused = false;
  ls->readable = true; /* an edge may have come and gone meanwhile */
  weft__sock_kick(&ls->s);
}

static void pause_backoff(struct lsock *ls) {
  ls->paused = true;
  weft__fetch_add(&ls->lst->st_paused, 1, WA_RLX);
  ls->backoff_ns = ls->backoff_ns ? ls->backoff_ns * 2 : BACKOFF_MIN_NS;
  if (ls->backoff_ns > BACKOFF_MAX_NS)
    ls->backoff_ns = BACKOFF_MAX_NS;
  if (weft_timer_start(ls->timer, ls->backoff_ns, 0, resume, ls) < 0)
    ls->paused = false; /* shutting down: the sweep closes us */
}

/* The spare, if it is not open: 0 once it is, or a negative errno. With
 * the runtime's limit_lock held. */
static int reopen_spare(weft_rt *rt) {
  if (rt->net.spare_open)
    return 0;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  rt->net.spare = fd;
  rt->net.spare_open = true;
  return 0;
}

/* A Unix socket's drop: the spare's slot, freed, takes each connection in
 * turn. Under limit_lock: two listeners' drops would share the one slot.
 * Without a spare (something took the slot of the last drop) nothing is
 * dropped this time. A slot taken only for a moment (the monitor reads
 * /proc) is back by the socket's next accept, which reopens the spare
 * first (respare): else that accept would take it, and the spare none. */
static void drop_with_spare(struct lsock *ls) {
  struct weft_listener *l = ls->lst;
  weft_rt *rt = l->rt;
  pthread_mutex_lock(&rt->net.limit_lock);
  if (reopen_spare(rt) == 0) {
    close(rt->net.spare);
    rt->net.spare_open = false;
    for (int i = 0; i < ACCEPT_BUDGET; i++) {
      int fd = sync_accept(ls);
      if (fd == -EINTR)
        continue;
      if (fd < 0)
        break;
      weft__fetch_add(&l->st_dropped, 1, WA_RLX); /* before its client
                                                     sees it */
      close(fd);
    }
  }
  ls->respare = reopen_spare(rt) != 0;
  pthread_mutex_unlock(&rt->net.limit_lock);
}

/* listen(2) on a TCP socket reset_queue closed; false if it failed
 * (logged once, until it succeeds): it is tried again after a pause. */
static bool relisten(struct lsock *ls) {
  if (listen(ls->s.fd, ls->lst->backlog) == 0) {
    ls->unlistened = false;
    return true;
  }
  int err = errno;
  if (!ls->unlistened)
    weft__log(weft__sock_rt(&ls->s), WEFT_LOG_ERROR,
              "listener socket %d: listen after dropping its queue: %s; "
              "retried after a pause",
              ls->s.fd, strerror(err));
  ls->unlistened = true;
  return false;
}

/* A TCP socket's drop, with no descriptor: shutdown(2) of a listening
 * socket aborts every connection in its queue (each client gets a reset)
 * and leaves the socket bound, not listening; listen(2) makes it listen
 * again. Its port stays its own meanwhile, as it was bound by number
 * (probe_free picks a port 0 first: a socket bound to port 0 would let
 * go of the port at the shutdown). Clients that come in between go to
 * the group's other sockets, or are refused. dropped counts the queue's
 * length read just before (TCP_INFO gives a listener's in tcpi_unacked):
 * one that arrives between the read and the shutdown is reset too, but
 * not counted. An empty queue is left alone (a descriptor shortage makes
 * every accept fail, connections waiting or not). A socket not listening
 * (its listen failed) has none. With net.ipv4.tcp_migrate_req set (5.14,
 * off by default) the kernel moves the queue of a group's socket to
 * another socket of the group instead (`migrates`): nothing is counted
 * then, and while every socket is short the clients wait. (A listener
 * of one socket counts its resets, though a WEFT_LISTEN_SHARE listener
 * that joined it later would take them.) */
static void reset_queue(struct lsock *ls) {
  struct weft_listener *l = ls->lst;
  struct tcp_info ti;
  socklen_t len = sizeof(ti);
  if (getsockopt(ls->s.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
    if (ti.tcpi_unacked == 0)
      return;
    /* Counted first: a client may see its reset before a count after. */
    if (!l->migrates)
      weft__fetch_add(&l->st_dropped, ti.tcpi_unacked, WA_RLX);
  }
  if (shutdown(ls->s.fd, SHUT_RD) == 0)
    (void)relisten(ls);
}

/* Descriptors ran out: drop what waits on ls, then pause. */
static void fd_limit(struct lsock *ls) {
  weft__fetch_add(&ls->lst->st_limit, 1, WA_RLX);
  if (weft__listener_family(ls->lst) == AF_UNIX)
    drop_with_spare(ls);
  else
    reset_queue(ls);
  pause_backoff(ls);
}

/* One accept result: a descriptor or a negative errno. false: stop;
 * ls->at_limit says if descriptors ran out. */
static bool accepted(struct lsock *ls, int fd) {
  struct weft_listener *l = ls->lst;
  if (fd >= 0) {
    ls->backoff_ns = 0;
    weft__fetch_add(&l->st_accepted, 1, WA_RLX);
    weft__tcp_accepted(weft__sock_rt(&ls->s), l, fd);
    return true;
  }
  switch (fd) {
  case -EINTR:
  case -ECONNABORTED:
  case -EPROTO:
  case -EPERM: /* a firewall refused this one */
    return true;
  case -EMFILE:
  case -ENFILE:
  case -ENOBUFS:
  case -ENOMEM:
    ls->at_limit = true;
    return false;
  case -EAGAIN:
    ls->readable = false;
    return false;
  default:
    return false; /* -EINVAL: the socket was shut down */
  }
}

/* Completions without a multishot accept (an older kernel, a Unix
 * socket, or after an accept4 found none): wait for connections with a
 * poll of the listening socket, then accept them with accept4. */
static void poll_submit(struct lsock *ls) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&ls->s));
  ls->polling = weft__io_poll_fd(sh, ls->s.fd, WEFT_IO_IN, &ls->s.ioh) == 0;
  weft__local_end(sh);
  if (!ls->polling)
    weft__sock_kick(&ls->s);
}

static void accept_burst(struct lsock *ls) {
  ls->at_limit = false;
  for (int i = 0; i < ACCEPT_BUDGET; i++) {
    if (!ls->readable || !accepted(ls, sync_accept(ls))) {
      if (!ls->readable && completes(ls) && !ls->polling)
        poll_submit(ls);
      return;
    }
  }
  weft__sock_kick(&ls->s); /* more may wait: after other strands' turns */
}

/* Completions, from kernels that have them (rt->io.ring_accept; TCP
 * only, lsock_add says why): one multishot accept request, armed in this
 * thread's ring, waiting in the kernel and completing once per connection
 * until an error or a cancel ends it. A listener then costs no system
 * call or request of its own per connection. */
static bool ring_accept(struct lsock *ls) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&ls->s));
  ls->accepting =
      sh && weft__io_accept(sh, ls->s.fd, SOCK_CLOEXEC, &ls->s.ioh) == 0;
  if (ls->accepting)
    weft__fetch_add(&ls->lst->st_calls, 1, WA_RLX);
  weft__local_end(sh);
  return ls->accepting;
}

/* With completions, the accepts of a socket go to the ring of the thread
 * that arms them, and so do the connections they make, which start on
 * that thread's shard (weft__sock_home) and keep to that ring while no
 * other thread steals them. So each socket of a group first arms on its
 * own shard, as epoll watches it there; else, as weft_tcp_listen's kicks
 * go to whichever threads take them, one thread could start every
 * connection and the others live on what they steal. A timer due a tick
 * from now fires on its strand's home (a deadline now would fire at once
 * on this thread), and the strand's home is the socket's shard
 * (lsock_add). Best effort, once only: a searching thread serves every
 * wheel (shard.c, steal), and a stuck home's timers fire on another
 * thread; the socket then arms where its timer fired. */
static bool go_home(struct lsock *ls) {
  if (ls->placed || ls->lst->n == 1 || !completes(ls))
    return false;
  ls->placed = true;
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&ls->s));
  bool away = sh && sh->idx != ls->idx;
  weft__local_end(sh);
  if (!away ||
      weft_timer_start(ls->timer, 1u << WEFT_TICK_SHIFT, 0, resume, ls) < 0)
    return false;
  ls->paused = true; /* resume arms */
  return true;
}

static void accept_more(struct lsock *ls) {
  if (ls->paused || ls->accepting || go_home(ls))
    return;
  if (ls->unlistened && !relisten(ls)) {
    pause_backoff(ls);
    return;
  }
  bool ring = ls->multishot && !ls->polling; /* not beside accept_burst's */
  if (!ring && !ls->readable) {
    if (completes(ls) && !ls->polling)
      poll_submit(ls);
    return;
  }
  if (ring && ring_accept(ls))
    return;
  if (ls->respare) {
    weft_rt *rt = ls->lst->rt;
    pthread_mutex_lock(&rt->net.limit_lock);
    ls->respare = reopen_spare(rt) != 0;
    pthread_mutex_unlock(&rt->net.limit_lock);
  }
  accept_burst(ls);
  if (ls->at_limit)
    fd_limit(ls);
}

static void acceptq_free(struct lsock *ls) {
  free(ls->q.fd);
  free(ls->taken.fd);
  pthread_mutex_destroy(&ls->qlock);
}

/* The reaper's side of q; qlock held. Without memory to grow it the
 * connection is closed (its client sees EOF) and counted dropped. */
static void q_add(struct lsock *ls, int fd) {
  struct acceptq *q = &ls->q;
  if (q->n == q->cap) {
    uint32_t cap = q->cap ? 2 * q->cap : 16;
    int *p = realloc(q->fd, cap * sizeof(*p));
    if (!p) {
      close(fd);
      weft__fetch_add(&ls->lst->st_dropped, 1, WA_RLX);
      return;
    }
    q->fd = p;
    q->cap = cap;
  }
  q->fd[q->n++] = fd;
}

/* The reaper: the poll or the multishot accept completed. */
static void lsock_done(struct weft__ioh *h, struct weft__shard *local,
                       unsigned op, const struct weft__cqe *cqe) {
  struct lsock *ls = (struct lsock *)weft__sock_of(h);
  if (op == WEFT_OP_ACCEPT) {
    uint32_t bits = EV_ADONE;
    if (cqe->res >= 0) {
      pthread_mutex_lock(&ls->qlock);
      q_add(ls, cqe->res);
      pthread_mutex_unlock(&ls->qlock);
    }
    if (!(cqe->flags & WEFT_CQE_MORE)) {
      ls->aend = cqe->res < 0 ? cqe->res : 0;
      bits |= EV_AEND;
    }
    weft__sock_signal(local, &ls->s, bits, WEFT_GEN_ANY);
  } else { /* WEFT_OP_POLL: whatever it says, accept4 tells */
    weft__sock_signal(local, &ls->s, EV_POLLED, WEFT_GEN_ANY);
  }
}

/* The strand's side of q: the next descriptor, taking q's array when
 * taken is used up (-1: none is queued). */
static int q_take(struct lsock *ls) {
  if (ls->tpos == ls->taken.n) {
    if (ls->taken.cap > ACCEPTQ_KEEP) { /* a burst's: give it back */
      free(ls->taken.fd);
      ls->taken = (struct acceptq){0};
    }
    pthread_mutex_lock(&ls->qlock);
    struct acceptq got = ls->q;
    ls->q = ls->taken;
    ls->q.n = 0;
    pthread_mutex_unlock(&ls->qlock);
    ls->taken = got;
    ls->tpos = 0;
    if (!got.n)
      return -1;
  }
  return ls->taken.fd[ls->tpos++];
}

/* What the multishot accept delivered, ACCEPT_BUDGET a turn; then, once
 * it has ended (the reaper queued its every descriptor before the end's
 * signal) and all are made, why it ended. */
static void ring_accepted(struct lsock *ls) {
  struct weft_listener *l = ls->lst;
  for (int i = 0; i < ACCEPT_BUDGET; i++) {
    int fd = q_take(ls);
    if (fd < 0)
      break;
    if (ls->s.state == ST_OPEN) {
      accepted(ls, fd);
    } else { /* closed meanwhile: its client sees EOF */
      close(fd);
      weft__fetch_add(&l->st_dropped, 1, WA_RLX);
    }
    if (i == ACCEPT_BUDGET - 1) {
      weft__sock_kick(&ls->s); /* more may wait: after other strands' turns */
      return;
    }
  }
  if (!ls->ended)
    return;
  ls->ended = false;
  ls->accepting = false;
  /* Whatever ended it, an accept4 tells whether connections wait. */
  ls->readable = true;
  int res = ls->aend;
  if (ls->s.state != ST_OPEN || res == 0 || res == -ECANCELED)
    return; /* a full CQ ended it, or its submitter's exit (io_uring.c):
               accept_more arms another */
  ls->at_limit = false;
  if (accepted(ls, res))
    return; /* a connection that failed before it was accepted */
  if (ls->at_limit) {
    /* The kernel took RLIMIT_NOFILE when the request was armed: accept4
     * tells with today's limit whether descriptors are short (a raised
     * limit is then not taken for a shortage, which would drop clients). */
    accept_burst(ls);
    if (ls->at_limit)
      fd_limit(ls);
  } else if (ls->readable) {
    pause_backoff(ls); /* an unexpected error: not again at once */
  }
}

/* One of l's items (`live`) is finished: the last calls done. The struct
 * stays on rt->net.listeners until weft_rt_destroy, holding no descriptor
 * (the spare is the runtime's): a weft_listener_close after a shutdown
 * must find close_claim to return -EALREADY, and a closer still signals
 * the sockets (l->socks, l->n) after the fetch_or that let this call
 * done, so freeing here could pull the memory from under either. */
static void live_drop(struct weft_listener *l) {
  /* seq_cst: the closer's done and done_arg were written before its
   * fetch_or, which this reads from (or follows) when it sees the bit. */
  uint64_t prev = weft__fetch_sub(&l->live, 2, WA_SC);
  if ((prev >> 1) == 1 && (prev & 1) && l->done) {
    weft__calling((void *)l->done);
    l->done(l->done_arg);
  }
}

/* From the listening socket's strand, before the connection is signalled:
 * its socket is still an item, so the count cannot reach 0 meanwhile, and
 * the signal (release) orders this before the connection's drop. */
void weft__listener_hold(struct weft_listener *l) {
  weft__fetch_add(&l->live, 2, WA_RLX);
}

void weft__listener_deliver(struct weft_listener *l, weft_tcp *conn) {
  weft__calling((void *)l->fn);
  l->fn(l->arg, conn);
  live_drop(l);
}

void weft__listener_delivered(struct weft_listener *l) { live_drop(l); }

static void lsock_finished(struct lsock *ls) {
  struct weft_listener *l = ls->lst;
  weft_timer_destroy(ls->timer);
  ls->timer = NULL;
  /* At once, not through the ring (weft__sock_close_fd): a close entry
   * leaves with the thread's next enter, and done, which live_drop below
   * may run, must find the address free to listen on again (a socket
   * still open stays in LISTEN state, an abstract name bound). Listening
   * sockets are few: the ring's batching would save nothing. Every
   * operation on the socket has completed (ST_CLOSING, neither polling
   * nor accepting). */
  weft__io_close(weft__sock_rt(&ls->s), NULL, ls->s.fd);
  ls->s.fd = -1;
  ls->s.state = ST_CLOSED;
  weft__unix_unlink(&l->addr, l->addrlen, &l->file); /* before done runs */
  acceptq_free(ls);
  live_drop(l);
  weft__sock_free(&ls->s);
}

void weft__lsock_run(struct weft__sock *s, uint32_t bits) {
  struct lsock *ls = (struct lsock *)s;
  if (bits & EV_AEND)
    ls->ended = true;
  if (ls->accepting)
    ring_accepted(ls); /* EV_ADONE, or the kick of a spent budget */
  if (bits & EV_POLLED) {
    ls->polling = false;
    ls->readable = true;
  }
  if (bits & EV_IN)
    ls->readable = true;
  if ((bits & (EV_CLOSE | EV_SHUTDOWN)) && s->state == ST_OPEN) {
    s->state = ST_CLOSING;
    weft_timer_cancel(ls->timer);
    if (ls->polling || ls->accepting)
      shutdown(s->fd, SHUT_RDWR); /* ends the poll or accept in the kernel */
  }
  if (s->state == ST_OPEN) {
    /* An epoll event may run a socket between its watch and the end of
     * weft_tcp_listen: then it waits for the kick weft__sock_live sends. */
    if (weft__load(&ls->lst->ready, WA_ACQ))
      accept_more(ls);
  } else if (s->state == ST_CLOSING && !ls->polling && !ls->accepting)
    lsock_finished(ls);
}

/* ---- the API ---------------------------------------------------------------
 */

static int bind_one(weft_rt *rt, struct weft_listener *l, bool reuseport,
                    int backlog) {
  int fd = weft__tcp_socket(rt, l->addr.ss_family);
  if (fd < 0)
    return fd;
  int one = 1;
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  if (l->addr.ss_family == AF_UNIX) {
    int r = weft__unix_bind(fd, &l->addr, l->addrlen, &l->file);
    if (!r && listen(fd, backlog) < 0)
      r = -errno;
    if (r) {
      close(fd);
      return r;
    }
  } else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
             (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one,
                                      sizeof(one)) < 0) ||
             bind(fd, (struct sockaddr *)&l->addr, l->addrlen) < 0 ||
             listen(fd, backlog) < 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  /* Port 0: the next sockets of the group bind the port picked now. */
  socklen_t len = sizeof(l->addr);
  if (getsockname(fd, (struct sockaddr *)&l->addr, &len) < 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  l->addrlen = len;
  return fd;
}

/* Whether l's address is free, by binding it once without SO_REUSEPORT:
 * the group's sockets would join any SO_REUSEPORT group of the same user
 * bound there. Port 0: the port picked now, free, is the one the group
 * binds. 0 or a negative errno (-EADDRINUSE). */
static int probe_free(weft_rt *rt, struct weft_listener *l) {
  int fd = weft__tcp_socket(rt, l->addr.ss_family);
  if (fd < 0)
    return fd;
  int one = 1, r = 0;
  socklen_t len = sizeof(l->addr);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
      bind(fd, (struct sockaddr *)&l->addr, l->addrlen) < 0 ||
      getsockname(fd, (struct sockaddr *)&l->addr, &len) < 0)
    r = -errno;
  else
    l->addrlen = len;
  close(fd);
  return r;
}

/* Whether the kernel moves a closing listener's queue to another socket
 * of its reuseport group rather than reset it (reset_queue). */
static bool migrate_sysctl(void) {
  int fd = open("/proc/sys/net/ipv4/tcp_migrate_req", O_RDONLY | O_CLOEXEC);
  char c = '0';
  if (fd >= 0) {
    if (read(fd, &c, 1) != 1)
      c = '0';
    close(fd);
  }
  return c != '0';
}

static bool port_zero(const struct weft_listener *l) {
  if (l->addr.ss_family == AF_INET)
    return ((const struct sockaddr_in *)&l->addr)->sin_port == 0;
  return ((const struct sockaddr_in6 *)&l->addr)->sin6_port == 0;
}

/* A socket that never ran: its timer (if made) goes with it. */
static void lsock_discard(struct lsock *ls) {
  if (ls->timer)
    weft_timer_destroy(ls->timer);
  acceptq_free(ls);
  weft__sock_discard(&ls->s);
}

static int lsock_add(weft_rt *rt, struct weft_listener *l, unsigned i, int fd) {
  struct weft__sock *s;
  weft_strand *st;
  int r = l->n > 1 ? weft__strand_create_at(rt, i, &st) /* go_home */
                   : weft_strand_create(rt, &st);
  if (!r && (r = weft__sock_new(&s, rt, SK_LISTEN, fd, st, lsock_done)))
    weft_strand_release(st);
  if (r) {
    close(fd);
    return r;
  }
  st->weft_made = true; /* released with the socket (sock.c) */
  struct lsock *ls = (struct lsock *)s;
  ls->lst = l;
  ls->idx = i;
  /* Not on a Unix socket: its shutdown(2) does not end an accept waiting
   * in the kernel (its accept just finds none waiting, and waits on), so
   * nothing would end one at a close. Those poll, as older kernels do. */
  ls->multishot = rt->io.ring_accept && l->addr.ss_family != AF_UNIX;
  pthread_mutex_init(&ls->qlock, NULL);
  ls->q = ls->taken = (struct acceptq){0};
  ls->tpos = 0;
  ls->ended = false;
  ls->s.state = ST_OPEN;
  ls->readable = true;
  r = weft_timer_create(rt, ls->s.strand, &ls->timer);
  l->gens[i] = weft__sock_gen(&ls->s);
  if (r) {
    lsock_discard(ls);
    return r;
  }
  l->socks[i] = ls;
  return 0;
}

static void listener_free(struct weft_listener *l) { free(l); }

/* l is the runtime's from here on: weft__listen_destroy frees it. */
static void listener_keep(weft_rt *rt, struct weft_listener *l) {
  pthread_mutex_lock(&rt->life.lock);
  l->next = rt->net.listeners;
  rt->net.listeners = l;
  pthread_mutex_unlock(&rt->life.lock);
}

/* weft_tcp_listen failed with `made` sockets made and the first `watched`
 * of them watched. One not watched was seen by nobody: it goes now. A
 * watched one may have been run already, on epoll, by a connection that
 * waited on it (its event needs no EV_LIVE: sock.c); it did not accept
 * (not ready), but its node may still be queued, so it closes on its
 * strand, as at a weft_listener_close without done. Its pending clients
 * are then reset with the socket. */
static void listen_failed(struct weft_listener *l, unsigned made,
                          unsigned watched) {
  weft_rt *rt = l->rt;
  for (unsigned i = watched; i < made; i++)
    lsock_discard(l->socks[i]);
  if (!watched) {
    weft__unix_unlink(&l->addr, l->addrlen, &l->file);
    listener_free(l);
    return;
  }
  /* A watch ran, so all were made: a TCP group, no socket file. Nothing
   * reads these words before the sockets go live below. */
  weft__store(&l->close_claim, 1, WA_RLX);
  weft__store(&l->live, ((uint64_t)watched << 1) | 1, WA_RLX);
  listener_keep(rt, l);
  for (unsigned i = 0; i < watched; i++)
    weft__sock_live(&l->socks[i]->s, l->gens[i], EV_CLOSE);
}

int weft_tcp_listen(weft_rt *rt, const struct sockaddr *addr, unsigned addrlen,
                    const weft_listen_opts *opts, weft_accept_fn fn, void *arg,
                    weft_listener **out) {
  int r = weft__tcp_check(rt, addr, addrlen);
  if (r)
    return r;
  unsigned flags = opts ? opts->flags : 0;
  int backlog = opts && opts->backlog ? opts->backlog : SOMAXCONN;
  if (!fn || !out || addrlen > sizeof(struct sockaddr_storage) ||
      (flags & ~(WEFT_LISTEN_SINGLE | WEFT_LISTEN_SHARE)) || backlog < 0)
    return -EINVAL;
#ifdef WEFT_SIM
  /* A TCP port of the simulated host: its Unix name, one socket. */
  struct sockaddr_storage tcp = {0};
  struct sockaddr_un un;
  unsigned tcplen = 0;
  if (weft__simulated(rt) && addr->sa_family != AF_UNIX) {
    memcpy(&tcp, addr, addrlen);
    if ((r = weft__sim_tcp_name(rt, &tcp, &un, &addrlen, true)))
      return r;
    tcplen = addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                        : sizeof(struct sockaddr_in6);
    addr = (const struct sockaddr *)&un;
    flags &= ~WEFT_LISTEN_SHARE;
  }
#endif
  bool is_unix = addr->sa_family == AF_UNIX;
  if (is_unix && (flags & WEFT_LISTEN_SHARE))
    return -EINVAL; /* no SO_REUSEPORT groups for Unix sockets */
  unsigned n = (flags & WEFT_LISTEN_SINGLE) || is_unix ? 1 : rt->nshards;
  struct weft_listener *l =
      calloc(1, sizeof(*l) + n * (sizeof(l->socks[0]) + sizeof(uint32_t)));
  if (!l)
    return -ENOMEM;
  l->gens = (uint32_t *)&l->socks[n];
  l->rt = rt;
  l->n = n;
  l->fn = fn;
  l->arg = arg;
  memcpy(&l->addr, addr, addrlen);
  l->addrlen = addrlen;
#ifdef WEFT_SIM
  memcpy(&l->sim_addr, &tcp, tcplen);
  l->sim_addrlen = tcplen;
#endif
  l->backlog = backlog;
  l->migrates =
      !is_unix && (n > 1 || (flags & WEFT_LISTEN_SHARE)) && migrate_sysctl();
  if (l->migrates)
    weft__log(rt, WEFT_LOG_INFO,
              "net.ipv4.tcp_migrate_req is set: when descriptors run out, "
              "the connections waiting on a listener's socket move to its "
              "group's other sockets instead of being dropped");
  if (is_unix) { /* the spare (drop_with_spare); under the lock: a drop
                    under way has its slot free */
    pthread_mutex_lock(&rt->net.limit_lock);
    r = reopen_spare(rt);
    pthread_mutex_unlock(&rt->net.limit_lock);
  }
  bool reuseport = !is_unix;
  /* Port 0 is picked here even when shared: each socket must be bound by
   * number to keep its port through a reset (reset_queue). */
  if (!r && reuseport && (!(flags & WEFT_LISTEN_SHARE) || port_zero(l)))
    r = probe_free(rt, l);
  /* An item per socket, each dropped when that socket closes. */
  weft__store(&l->live, (uint64_t)n << 1, WA_RLX);
  unsigned made = 0;
  for (; !r && made < n; made++) {
    int fd = bind_one(rt, l, reuseport, backlog);
    r = fd < 0 ? fd : lsock_add(rt, l, made, fd);
    if (r)
      break;
  }
  /* Watched only once all are made, and live (seen by the shutdown sweep)
   * only once all are watched. */
  unsigned watched = 0;
  while (!r && watched < n &&
         !(r = weft__sock_watch(&l->socks[watched]->s, watched, false)))
    watched++;
  if (r) {
    listen_failed(l, made, watched);
    return r;
  }
  listener_keep(rt, l);
  weft__store(&l->ready, 1, WA_REL); /* before the kicks that accept */
  for (unsigned i = 0; i < n; i++)
    weft__sock_live(&l->socks[i]->s, l->gens[i], EV_KICK);
  *out = l;
  return 0;
}

int weft_listener_addr(weft_listener *l, struct sockaddr *addr,
                       unsigned *addrlen) {
  if (!l || !addr || !addrlen)
    return -EINVAL;
  if (weft__forked(l->rt))
    return -ECHILD;
#ifdef WEFT_SIM
  if (l->sim_addrlen) { /* the TCP address, not its Unix name */
    unsigned n = *addrlen < l->sim_addrlen ? *addrlen : l->sim_addrlen;
    memcpy(addr, &l->sim_addr, n);
    *addrlen = l->sim_addrlen;
    return 0;
  }
#endif
  unsigned len = *addrlen < l->addrlen ? *addrlen : l->addrlen;
  memcpy(addr, &l->addr, len);
  *addrlen = l->addrlen;
  return 0;
}

int weft__listener_family(const struct weft_listener *l) {
  return l->addr.ss_family;
}

#ifdef WEFT_SIM
bool weft__listener_sim_port(const struct weft_listener *l, int *family,
                             uint16_t *port) {
  if (!l->sim_addrlen)
    return false;
  *family = l->sim_addr.ss_family;
  const struct sockaddr_in *a4 = (const struct sockaddr_in *)&l->sim_addr;
  const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&l->sim_addr;
  *port = ntohs(*family == AF_INET ? a4->sin_port : a6->sin6_port);
  return true;
}
#endif

int weft_listener_stats_get(weft_listener *l, weft_listener_stats *out) {
  if (!l || !out)
    return -EINVAL;
  if (weft__forked(l->rt))
    return -ECHILD;
  out->accepted = weft__load(&l->st_accepted, WA_RLX);
  out->accept_calls = weft__load(&l->st_calls, WA_RLX);
  out->fd_limit_hits = weft__load(&l->st_limit, WA_RLX);
  out->dropped = weft__load(&l->st_dropped, WA_RLX);
  out->paused = weft__load(&l->st_paused, WA_RLX);
  return 0;
}

int weft_listener_close(weft_listener *l, weft_fn done, void *arg) {
  if (!l)
    return -EINVAL;
  if (weft__forked(l->rt))
    return -ECHILD;
  /* One closer only: a second, even a concurrent one, must not touch
   * done, which the first may already have published. */
  uint32_t zero = 0;
  if (!weft__cas(&l->close_claim, &zero, 1, WA_RLX, WA_RLX))
    return -EALREADY;
  l->done = done;
  l->done_arg = arg;
  if ((weft__fetch_or(&l->live, 1, WA_SC) >> 1) == 0)
    return -EALREADY; /* every socket was closed already, by a shutdown */
  /* A socket's memory stays in its pool (sock.h): one freed already
   * drops the signal by its generation. */
  for (unsigned i = 0; i < l->n; i++)
    weft__sock_signal(NULL, &l->socks[i]->s, EV_CLOSE, l->gens[i]);
  return 0;
}

/* ---- the runtime's side ----------------------------------------------------
 */

void weft__listen_init(weft_rt *rt) {
  weft__pool_init(&rt->net.lsock_pool, sizeof(struct lsock));
  pthread_mutex_init(&rt->net.limit_lock, NULL);
}

void weft__listen_destroy(weft_rt *rt) {
  while (rt->net.listeners) {
    struct weft_listener *l = rt->net.listeners;
    rt->net.listeners = l->next;
    listener_free(l);
  }
  if (rt->net.spare_open)
    close(rt->net.spare);
  rt->net.spare_open = false;
  pthread_mutex_destroy(&rt->net.limit_lock);
  weft__pool_destroy(&rt->net.lsock_pool);
}
