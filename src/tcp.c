/*
 * tcp.c - TCP connections: creation, the per-socket event word and its
 * strand handler, write (queue, partial sends, backpressure), connect
 * with timeout, half-close, close, and the registry that the shutdown
 * sweep walks (receiving: tcp_recv.c; options and addresses: tcp_opt.c).
 * Owns struct weft__sock (tcp.h has the event protocol) except what is
 * specific to listeners (listen.c).
 *
 * Everything but `ev` (and what the io_uring reaper shares with the strand
 * for a multishot receive: tcp_recv.c) is touched only on the socket's
 * strand, so a connection needs no lock: operations started on the strand,
 * completions delivered to it. With io_uring, at most one receive and one send
 * of a socket are in the kernel at a time (user_data: the socket, tagged), and
 * the socket is freed only after both have completed, so the kernel is done
 * with every buffer before any callback says so. Closing with operations in
 * the kernel shuts the socket down (shutdown(2) wakes every waiter on it,
 * whichever ring it was submitted to), waits for their completions, then
 * closes the descriptor.
 *
 * Descriptors are blocking for io_uring (an O_NONBLOCK socket makes some
 * kernels complete an operation with -EAGAIN instead of waiting) and
 * non-blocking for epoll; synchronous calls pass MSG_DONTWAIT.
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define READ_MAX ((size_t)1 << 30)
#define DEFAULT_LOW ((size_t)64 << 10)
#define DEFAULT_HIGH ((size_t)1 << 20)

static void sock_run0(void *arg);
static void sock_run1(void *arg);

/* ---- the event word ------------------------------------------------------ */

void weft__sock_signal(struct weft__shard *local, struct weft__sock *s,
                       uint64_t bits, uint32_t gen_tag) {
  uint64_t cur = weft__load(&s->ev, WA_ACQ);
  for (;;) {
    if (gen_tag != WEFT_GEN_ANY && (uint16_t)(cur >> 32) != (uint16_t)gen_tag)
      return; /* an event for an earlier life of this memory */
    if ((cur & bits) == bits && (cur & EV_QUEUED))
      return; /* nothing would change: do not write */
    if (weft__cas(&s->ev, &cur, cur | bits | EV_QUEUED, WA_AR, WA_ACQ))
      break;
  }
  if (cur & EV_QUEUED)
    return;
  weft__strand_push(s->strand, local, &s->node[s->post_idx], false);
}

void weft__sock_completed(struct weft__shard *local, uint64_t ud, int32_t res,
                          uint32_t flags) {
  struct weft__sock *s =
      (struct weft__sock *)(uintptr_t)(ud & ~(uint64_t)WEFT_OP_MASK);
  if (s->kind == SK_LISTEN && (ud & WEFT_OP_MASK) == WEFT_OP_WRITE) {
    weft__lsock_accepted(local, s, res, flags); /* kind never changes */
    return;
  }
  if ((ud & WEFT_OP_MASK) == WEFT_OP_READ) {
    s->rres = res;
    weft__sock_signal(local, s, EV_RDONE, WEFT_GEN_ANY);
  } else {
    s->wres = res;
    weft__sock_signal(local, s, EV_WDONE, WEFT_GEN_ANY);
  }
}

void weft__sock_event(struct weft__shard *local, uint64_t data,
                      uint32_t events) {
  struct weft__sock *s =
      (struct weft__sock *)(uintptr_t)(data & ((UINT64_C(1) << 48) - 1));
  uint64_t bits = 0;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
    bits |= EV_IN;
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
    bits |= EV_HUP;
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
    bits |= EV_OUT;
  weft__sock_signal(local, s, bits, (uint32_t)(data >> 48));
}

/* From a handler (the socket's strand or the sweep): signal with the
 * calling thread's shard if it holds one. */
static void signal_bits(struct weft__sock *s, uint64_t bits) {
  struct weft__shard *sh = weft__local_begin(s->rt);
  weft__sock_signal(sh, s, bits, s->gen);
  weft__local_end(sh);
}

void weft__sock_kick(struct weft__sock *s) { signal_bits(s, EV_KICK); }

bool weft__on_strand(const struct weft__sock *s) {
  return weft_strand_current() == s->strand;
}

/* ---- life ------------------------------------------------------------------
 */

struct weft__sock *weft__sock_new(weft_rt *rt, int fd, int kind,
                                  weft_strand *strand) {
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__sock *s =
      weft__pool_alloc(&rt->sock_pool, sh ? &sh->sock_cache : NULL);
  weft__local_end(sh);
  if (!s)
    return NULL;
  uint64_t ev = weft__load(&s->ev, WA_RLX); /* survives a free */
  uint32_t gen = (uint32_t)(ev >> 32);
  memset(s, 0, offsetof(struct weft__sock, ev));
  memset((char *)s + offsetof(struct weft__sock, post_idx), 0,
         sizeof(*s) - offsetof(struct weft__sock, post_idx));
  for (int i = 0; i < 2; i++) {
    s->node[i].fn = s->node[i].cancel = i ? sock_run1 : sock_run0;
    s->node[i].arg = s;
    s->node[i].embedded = 1;
  }
  s->gen = gen;
  s->fd = fd;
  s->kind = (uint8_t)kind;
  s->rt = rt;
  s->low = DEFAULT_LOW;
  s->high = DEFAULT_HIGH;
  if (strand) {
    s->strand = strand;
  } else if (weft_strand_create(rt, &s->strand) == 0) {
    s->own_strand = true;
  } else {
    sh = weft__local_begin(rt);
    weft__pool_free(&rt->sock_pool, sh ? &sh->sock_cache : NULL, s);
    weft__local_end(sh);
    return NULL;
  }
  weft__fetch_add(&rt->tcp_live, 1, WA_RLX);
  weft__fetch_add(&rt->tcp_open, 1, WA_SC);
  return s;
}

int weft__sock_register(struct weft__sock *s, unsigned home) {
  weft_rt *rt = s->rt;
  /* release: publishes every field the creator set to reapers and
   * signallers (their acquire CAS), before any event can name s. */
  weft__store(&s->ev, (uint64_t)s->gen << 32, WA_REL);
  struct weft__shard *reg = &rt->shards[home % rt->nshards];
  pthread_mutex_lock(&reg->tcp_lock);
  if (weft__load(&rt->closing, WA_SC)) {
    pthread_mutex_unlock(&reg->tcp_lock);
    return -ESHUTDOWN;
  }
  s->reg = reg;
  s->rnext = reg->tcp_list;
  if (reg->tcp_list)
    reg->tcp_list->rprev = s;
  reg->tcp_list = s;
  pthread_mutex_unlock(&reg->tcp_lock);
  if (rt->backend != WEFT_BACKEND_EPOLL)
    return 0;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET};
  ev.data.u64 = (uint64_t)(uintptr_t)s | ((uint64_t)(uint16_t)s->gen << 48);
  if (s->kind == SK_LISTEN)
    ev.events = EPOLLIN | EPOLLET;
  struct weft__io *io = weft__load(&reg->io, WA_ACQ);
  if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0)
    return -errno; /* the caller discards s, which unregisters it */
  return 0;
}

static void unregister(struct weft__sock *s) {
  struct weft__shard *reg = s->reg;
  if (!reg)
    return;
  pthread_mutex_lock(&reg->tcp_lock);
  if (s->rprev)
    s->rprev->rnext = s->rnext;
  else
    reg->tcp_list = s->rnext;
  if (s->rnext)
    s->rnext->rprev = s->rprev;
  pthread_mutex_unlock(&reg->tcp_lock);
  s->reg = NULL;
}

void weft__tcp_closed(weft_rt *rt, int64_t n) {
  if (weft__fetch_sub(&rt->tcp_open, n, WA_SC) == n &&
      weft__load(&rt->closing, WA_SC))
    weft__poke(rt); /* the last parker may have counted these sockets */
}

/* uring: the close as an entry in this thread's ring, leaving with its
 * next enter (a socket has no flush method, so the kernel closes it inside
 * that enter). Every operation on the socket has completed by now, and
 * the number stays taken until then, so nothing reuses it early. It counts
 * in tcp_open until entered (weft__uring_entered), so a shutdown does not
 * end before: a thread that parks with it sleeps in its ring, whose enter
 * takes it, and its completion ends that sleep at once. */
static bool ring_close(weft_rt *rt, int fd) {
  if (rt->backend != WEFT_BACKEND_URING)
    return false;
  struct weft__shard *sh = weft__local_begin(rt);
  struct io_uring_sqe *sqe = sh ? weft__uring_sqe(sh) : NULL;
  if (sqe)
    weft__uring_prep_close(sh, sqe, fd);
  weft__local_end(sh);
  return sqe != NULL;
}

void weft__sock_close_fd(struct weft__sock *s) {
  if (s->fd < 0)
    return;
  if (!ring_close(s->rt, s->fd)) {
    close(s->fd); /* EINTR: the descriptor is gone anyway on Linux */
    weft__tcp_closed(s->rt, 1);
  }
  s->fd = -1;
}

static void really_free(struct weft__sock *s) {
  weft_rt *rt = s->rt;
  unregister(s);
  if (s->timer)
    weft_timer_destroy(s->timer);
  s->timer = NULL;
  if (s->own_strand)
    weft_strand_release(s->strand);
  weft__fetch_sub(&rt->tcp_live, 1, WA_RLX);
  struct weft__shard *sh = weft__local_begin(rt);
  weft__pool_free(&rt->sock_pool, sh ? &sh->sock_cache : NULL, s);
  weft__local_end(sh);
}

static void final_free(void *arg) { really_free(arg); }

void weft__sock_free(struct weft__sock *s) {
  s->state = ST_DONE;
  uint64_t cur = weft__load(&s->ev, WA_ACQ);
  uint64_t next = (uint64_t)(s->gen + 1) << 32;
  /* Only while no node is queued; else that node's run frees it. Stale
   * epoll events fail their generation check from here on, so nothing
   * pushes a node of s again. */
  if ((cur & EV_QUEUED) || !weft__cas(&s->ev, &cur, next, WA_AR, WA_ACQ)) {
    s->free_pending = true;
    return;
  }
  /* Not here: the strand still reads the node that is running now. A
   * pooled node runs after it. Without memory for one, s stays in the
   * registry as a husk until weft_rt_destroy frees the pools. */
  weft_rt *rt = s->rt;
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__node *n =
      weft__pool_alloc(&rt->node_pool, sh ? &sh->node_cache : NULL);
  if (n) {
    n->fn = n->cancel = final_free;
    n->arg = s;
    n->embedded = 0;
    weft__strand_push(s->strand, sh, n, false);
  }
  weft__local_end(sh);
}

void weft__sock_discard(struct weft__sock *s) {
  weft__sock_close_fd(s);
  weft__store(&s->ev, (uint64_t)(s->gen + 1) << 32, WA_REL);
  really_free(s);
}

/* ---- write completions ------------------------------------------------- */

static void wreq_release(struct weft__sock *s, struct weft__wreq *w) {
  if (w->iov != w->inl)
    free(w->iov);
  if (w == &s->wr_inline)
    s->wr_inline_busy = false;
  else
    free(w);
}

static void wreq_done(struct weft__sock *s, struct weft__wreq *w, int status) {
  if (!w->fn) {
    wreq_release(s, w); /* nobody to tell: no callback to order */
    return;
  }
  w->status = status;
  w->next = NULL;
  if (s->done_tail)
    s->done_tail->next = w;
  else
    s->done_head = w;
  s->done_tail = w;
}

/* Calls the due write callbacks, then the drain callback; only from the
 * strand handler (never inside a weft_tcp_* call). */
static void flush_done(struct weft__sock *s) {
  while (s->done_head) {
    struct weft__wreq *w = s->done_head;
    s->done_head = w->next;
    if (!s->done_head)
      s->done_tail = NULL;
    weft_write_fn fn = w->fn;
    void *arg = w->arg;
    int status = w->status;
    wreq_release(s, w);
    fn(arg, (weft_tcp *)s, status);
  }
  if (s->drain_wanted && s->queued <= s->low && s->state == ST_OPEN) {
    s->drain_wanted = false;
    if (s->dfn)
      s->dfn(s->darg, (weft_tcp *)s);
  }
}

/* Every queued write fails with status (close, error). */
static void fail_writes(struct weft__sock *s, int status) {
  while (s->wq_head) {
    struct weft__wreq *w = s->wq_head;
    s->wq_head = w->next;
    wreq_done(s, w, status);
  }
  s->wq_tail = NULL;
  s->queued = 0;
}

/* n bytes of the queue were sent: complete the writes now fully sent
 * (zero-length ones at the head included). */
static void advance(struct weft__sock *s, size_t n) {
  s->queued -= n;
  while (s->wq_head) {
    struct weft__wreq *w = s->wq_head;
    while (n && w->iovpos < w->iovcnt) {
      struct iovec *v = &w->iov[w->iovpos];
      size_t k = n < v->iov_len ? n : v->iov_len;
      v->iov_base = (char *)v->iov_base + k;
      v->iov_len -= k;
      w->left -= k;
      n -= k;
      if (!v->iov_len)
        w->iovpos++;
    }
    while (w->iovpos < w->iovcnt && !w->iov[w->iovpos].iov_len)
      w->iovpos++;
    if (w->left)
      break;
    s->wq_head = w->next;
    if (!s->wq_head)
      s->wq_tail = NULL;
    wreq_done(s, w, 0);
  }
}

/* Gathers the queue's unsent iovecs into s->siov; returns how many. */
static int gather(struct weft__sock *s) {
  int k = 0;
  for (struct weft__wreq *w = s->wq_head; w && k < WEFT_SEND_IOV; w = w->next)
    for (int i = w->iovpos; i < w->iovcnt && k < WEFT_SEND_IOV; i++)
      if (w->iov[i].iov_len)
        s->siov[k++] = w->iov[i];
  memset(&s->msg, 0, sizeof(s->msg));
  s->msg.msg_iov = s->siov;
  s->msg.msg_iovlen = (size_t)k;
  s->msg_bytes = 0;
  for (int i = 0; i < k; i++)
    s->msg_bytes += s->siov[i].iov_len;
  return k;
}
/* ---- sending ------------------------------------------------------------- */

static void write_failed(struct weft__sock *s, int err) {
  if (!s->err)
    s->err = err;
  fail_writes(s, err);
}

/* A non-blocking send of the gathered bytes: send(2) for one buffer, which
 * spares the kernel copying in a msghdr and an iovec (_copy_from_user was
 * among the largest differences between tcp_proxy's kernel profile and
 * HAProxy's, which sends with send(2)), sendmsg(2) for several. */
static ssize_t send_direct(struct weft__sock *s) {
  if (s->msg.msg_iovlen == 1)
    return send(s->fd, s->msg.msg_iov[0].iov_base, s->msg.msg_iov[0].iov_len,
                MSG_NOSIGNAL | MSG_DONTWAIT);
  return sendmsg(s->fd, &s->msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* epoll: send what the socket takes now. */
static void send_now(struct weft__sock *s) {
  while (s->wq_head && s->writable) {
    if (!gather(s)) {
      advance(s, 0); /* only zero-length writes left */
      continue;
    }
    ssize_t n = send_direct(s);
    if (n >= 0) {
      advance(s, (size_t)n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      s->writable = false;
    } else if (errno != EINTR) {
      write_failed(s, -errno);
    }
  }
}

/* uring: one sendmsg in the kernel at a time, so bytes stay in order. It
 * goes into the ring of the calling thread's shard and leaves with that
 * thread's next kernel entry: when it runs out of work, or within 8 more
 * items (io.c), or, if one of those runs long, when the monitor hands the
 * shard on with its ring. The replies of a burst of requests then leave
 * in one entry and reach the peers as one burst (bench/net: 10% less CPU a
 * request than a send(2) each, with REAP_SHARE_MIN; io_uring.c). Without
 * a ring entry (a thread without a shard, a full ring) a non-blocking send
 * goes directly, or the strand tries again later. */
static void send_submit(struct weft__sock *s) {
  while (s->wq_head && !s->wr_inflight) {
    if (!gather(s)) {
      advance(s, 0);
      continue;
    }
    struct weft__shard *sh = weft__local_begin(s->rt);
    struct io_uring_sqe *sqe = sh ? weft__uring_sqe(sh) : NULL;
    if (sqe) {
      io_uring_prep_sendmsg(sqe, s->fd, &s->msg, MSG_NOSIGNAL);
      io_uring_sqe_set_data64(sqe, (uintptr_t)s | WEFT_OP_WRITE);
      s->wr_inflight = true;
    }
    weft__local_end(sh);
    if (sqe)
      return;
    if (s->writable) {
      ssize_t n = send_direct(s);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        write_failed(s, -errno);
        return;
      }
      if (n > 0)
        advance(s, (size_t)n);
      if (n > 0 && (size_t)n == s->msg_bytes)
        continue;
      s->writable = false; /* full: only the ring waits for room */
    }
    weft__sock_kick(s); /* later, on a thread with a ring entry */
    return;
  }
}

static void pump_writes(struct weft__sock *s) {
  if (s->state != ST_OPEN)
    return;
  if (s->rt->backend == WEFT_BACKEND_URING)
    send_submit(s);
  else
    send_now(s);
  if (!s->wq_head && s->shut_req && !s->shut_sent && !s->wr_inflight) {
    s->shut_sent = true;
    shutdown(s->fd, SHUT_WR);
  }
}

static void send_completed(struct weft__sock *s) {
  s->wr_inflight = false;
  int res = s->wres;
  if (res >= 0) {
    advance(s, (size_t)res);
    if ((size_t)res == s->msg_bytes)
      s->writable = true; /* it all went: room for a direct send */
    return;
  }
  /* -ECANCELED while open: its submitter exited (io_uring.c). These leave
   * the queue as it was, and pump_writes sends again. */
  if (res == -EINTR || res == -EAGAIN ||
      (res == -ECANCELED && s->state == ST_OPEN))
    return;
  write_failed(s, s->state == ST_CLOSING ? -ECANCELED : res);
}

/* ---- connecting ------------------------------------------------------------
 */

static void connect_done(struct weft__sock *s, int status) {
  if (s->timer) {
    weft_timer_destroy(s->timer);
    s->timer = NULL;
  }
  if (s->timed_out && status != 0)
    status = -ETIMEDOUT;
  if (status == 0) {
    s->state = ST_OPEN;
    s->writable = true;
  }
  weft_connect_fn fn = s->cfn;
  s->cfn = NULL;
  if (fn)
    fn(s->carg, (weft_tcp *)s, status);
}

static void connect_timeout(void *arg, int status, uint64_t missed) {
  struct weft__sock *s = arg;
  (void)missed;
  if (status || s->state != ST_CONNECTING || !s->cfn)
    return;
  s->timed_out = true;
  if (s->rd_inflight)
    shutdown(s->fd, SHUT_RDWR); /* aborts the connect in the kernel */
  else
    connect_done(s, -ETIMEDOUT);
}

static void connect_start(struct weft__sock *s) {
  if (s->timeout_ns) {
    int r = weft_timer_create(s->rt, s->strand, &s->timer);
    if (!r)
      r = weft_timer_start(s->timer, s->timeout_ns, 0, connect_timeout, s);
    if (r) {
      connect_done(s, r);
      return;
    }
  }
  if (s->rt->backend == WEFT_BACKEND_URING) {
    struct weft__shard *sh = weft__local_begin(s->rt);
    struct io_uring_sqe *sqe = sh ? weft__uring_sqe(sh) : NULL;
    if (sqe) {
      io_uring_prep_connect(sqe, s->fd, (struct sockaddr *)&s->addr,
                            s->addrlen);
      io_uring_sqe_set_data64(sqe, (uintptr_t)s | WEFT_OP_READ);
      s->rd_inflight = true;
    }
    weft__local_end(sh);
    if (!sqe)
      signal_bits(s, EV_CONNECT); /* try again shortly */
    return;
  }
  int r;
  do
    r = connect(s->fd, (struct sockaddr *)&s->addr, s->addrlen);
  while (r < 0 && errno == EINTR);
  if (r == 0)
    connect_done(s, 0);
  else if (errno != EINPROGRESS)
    connect_done(s, -errno);
  /* else: EV_OUT says it finished (conn_run) */
}

/* epoll: an output event while connecting. Events can predate connect()
 * (a new socket polls as hung up), so only a peer address or a pending
 * error ends the wait. */
static void connect_check(struct weft__sock *s) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (err) {
    connect_done(s, -err);
    return;
  }
  struct sockaddr_storage peer;
  len = sizeof(peer);
  if (getpeername(s->fd, (struct sockaddr *)&peer, &len) == 0)
    connect_done(s, 0);
}

/* ---- closing ------------------------------------------------------------- */

static void close_finish(struct weft__sock *s) {
  if (s->state != ST_CLOSING || weft__recv_busy(s) || s->wr_inflight)
    return;
  weft__recv_release(s);
  if (s->timer) {
    weft_timer_destroy(s->timer);
    s->timer = NULL;
  }
  weft__sock_close_fd(s);
  s->state = ST_CLOSED;
}

static void close_begin(struct weft__sock *s) {
  if (s->state >= ST_CLOSING)
    return;
  s->state = ST_CLOSING;
  if (s->user_closed && s->abortive) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  /* shutdown(2) wakes every operation on the socket in every ring: each
   * completes. A multishot receive alone, in this thread's ring, is
   * cancelled there instead, which costs no system call of its own. */
  weft__recv_closing(s);
  if (s->wr_inflight || s->rd_inflight ||
      (s->rd_multi && !weft__recv_cancel_local(s)))
    shutdown(s->fd, SHUT_RDWR);
  if (s->cfn && !s->rd_inflight)
    connect_done(s, -ECANCELED);
  weft__recv_cancel(s);
}

/* ---- the strand handler ----------------------------------------------------
 */

static void conn_accepted_run(struct weft__sock *s) {
  struct weft_listener *l = s->lst;
  s->lst = NULL;
  if (weft__load(&s->rt->closing, WA_ACQ)) {
    /* Shutting down: the user never sees it. */
    s->state = ST_CLOSING;
    close_finish(s);
    weft__sock_free(s);
    weft__listener_delivered(l);
    return;
  }
  s->state = ST_OPEN;
  s->afn(s->aarg, (weft_tcp *)s);
  weft__listener_delivered(l);
}

static void conn_run(struct weft__sock *s, uint32_t bits) {
  if (bits & EV_ACCEPTED) {
    conn_accepted_run(s);
    if (s->state == ST_DONE)
      return;
  }
  if (bits & EV_CONNECT && s->state == ST_CONNECTING)
    connect_start(s);
  if (bits & EV_RDONE) {
    if (s->cfn) {
      s->rd_inflight = false;
      int res = s->rres;
      connect_done(s,
                   s->state == ST_CLOSING && !s->timed_out ? -ECANCELED : res);
    } else {
      weft__recv_completed(s);
    }
  }
  if (bits & EV_RMEND)
    weft__recv_ended(s);
  if (bits & EV_WDONE)
    send_completed(s);
  if (bits & EV_IN)
    s->readable = true;
  if (bits & EV_HUP)
    s->hup = true;
  if (bits & EV_OUT) {
    s->writable = true;
    if (s->state == ST_CONNECTING && s->cfn && !s->rd_inflight)
      connect_check(s);
  }
  if (bits & EV_CLOSE)
    s->user_closed = true;
  if (bits & (EV_CLOSE | EV_SHUTDOWN))
    close_begin(s);
  if (s->state == ST_OPEN) {
    weft__recv_run(s);
    pump_writes(s);
  }
  if (s->state == ST_CLOSING) {
    if (!s->wr_inflight)
      fail_writes(s, -ECANCELED);
    close_finish(s);
  }
  flush_done(s);
  if (s->state == ST_CLOSED && s->user_closed) {
    if (s->clfn)
      s->clfn(s->clarg, (weft_tcp *)s);
    weft__sock_free(s);
  }
}

static void sock_run(struct weft__sock *s, unsigned idx) {
  s->post_idx = idx ^ 1;
  uint32_t bits = (uint32_t)weft__fetch_and(&s->ev, ~EV_LOW, WA_AR);
  if (s->state == ST_DONE) {
    if (s->free_pending) {
      s->free_pending = false;
      weft__sock_free(s);
    }
    return;
  }
  if (s->kind == SK_LISTEN)
    weft__lsock_run(s, bits);
  else
    conn_run(s, bits);
}

static void sock_run0(void *arg) { sock_run(arg, 0); }
static void sock_run1(void *arg) { sock_run(arg, 1); }

/* ---- accepted connections (from listen.c) ----------------------------------
 */

void weft__conn_accepted(struct weft__sock *ls, int fd) {
  weft_rt *rt = ls->rt;
  unsigned home = weft__tcp_home(rt);
  struct weft__sock *s = weft__sock_new(rt, fd, SK_CONN, NULL);
  if (!s) {
    close(fd);
    return;
  }
  s->state = ST_NEW;
  s->readable = s->writable = true;
  s->afn = ls->afn;
  s->aarg = ls->aarg;
  s->lst = ls->lst;
  if (weft__sock_register(s, home) < 0) {
    weft__sock_discard(s);
    return;
  }
  weft__listener_hold(s->lst);
  signal_bits(s, EV_ACCEPTED);
}

/* ---- the API ---------------------------------------------------------------
 */

static struct weft__sock *conn_of(const weft_tcp *c) {
  return (struct weft__sock *)c;
}

/* The checks every operation on an open connection makes. */
static int usable(const struct weft__sock *s) {
  if (!s || s->kind != SK_CONN)
    return -EINVAL;
  if (!weft__on_strand(s))
    return -EPERM;
  if (weft__load(&s->close_req, WA_RLX))
    return -EBADF;
  switch (s->state) {
  case ST_NEW:
  case ST_CONNECTING:
    return -ENOTCONN;
  case ST_OPEN:
    return weft__load(&s->rt->closing, WA_RLX) ? -ESHUTDOWN : 0;
  default:
    return weft__load(&s->rt->closing, WA_RLX) ? -ESHUTDOWN : -EBADF;
  }
}

int weft_tcp_read(weft_tcp *c, void *buf, size_t len, weft_read_fn fn,
                  void *arg) {
  struct weft__sock *s = conn_of(c);
  int r = usable(s);
  if (r)
    return r;
  if (!buf || !fn || !len)
    return -EINVAL;
  if (s->reading)
    return -EBUSY;
  s->reading = true;
  s->rbuf = buf;
  s->rlen = len < READ_MAX ? len : READ_MAX;
  s->rfn = fn;
  s->rarg = arg;
  weft__recv_start(s);
  return 0;
}

static struct weft__wreq *wreq_new(struct weft__sock *s, int iovcnt) {
  struct weft__wreq *w;
  if (!s->wr_inline_busy) {
    w = &s->wr_inline;
    s->wr_inline_busy = true;
  } else if (!(w = malloc(sizeof(*w)))) {
    return NULL;
  }
  w->iov = w->inl;
  if (iovcnt > 2 && !(w->iov = malloc(sizeof(struct iovec) * (size_t)iovcnt))) {
    if (w == &s->wr_inline)
      s->wr_inline_busy = false;
    else
      free(w);
    return NULL;
  }
  return w;
}

int weft_tcp_writev(weft_tcp *c, const struct iovec *iov, int iovcnt,
                    weft_write_fn fn, void *arg) {
  struct weft__sock *s = conn_of(c);
  int r = usable(s);
  if (r)
    return r;
  if (!iov || iovcnt < 1 || iovcnt > 1024)
    return -EINVAL;
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) {
    if ((!iov[i].iov_base && iov[i].iov_len) || total + iov[i].iov_len < total)
      return -EINVAL;
    total += iov[i].iov_len;
  }
  if (s->shut_req || s->err)
    return -EPIPE;
  if (s->queued && s->queued + total > s->high) {
    s->drain_wanted = true;
    return -ENOBUFS;
  }
  struct weft__wreq *w = wreq_new(s, iovcnt);
  if (!w)
    return -ENOMEM;
  memcpy(w->iov, iov, sizeof(*iov) * (size_t)iovcnt);
  w->iovcnt = iovcnt;
  w->iovpos = 0;
  w->left = total;
  w->fn = fn;
  w->arg = arg;
  w->next = NULL;
  if (s->wq_tail)
    s->wq_tail->next = w;
  else
    s->wq_head = w;
  s->wq_tail = w;
  s->queued += total;
  pump_writes(s);
  if (s->done_head)
    weft__sock_kick(s); /* completions run in the handler */
  return 0;
}

int weft_tcp_write(weft_tcp *c, const void *buf, size_t len, weft_write_fn fn,
                   void *arg) {
  struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
  return weft_tcp_writev(c, &v, 1, fn, arg);
}

size_t weft_tcp_queued(const weft_tcp *c) { return c ? conn_of(c)->queued : 0; }

int weft_tcp_set_watermarks(weft_tcp *c, size_t low, size_t high,
                            weft_drain_fn fn, void *arg) {
  struct weft__sock *s = conn_of(c);
  if (!s || s->kind != SK_CONN || low > high || !high)
    return -EINVAL;
  if (!weft__on_strand(s))
    return -EPERM;
  s->low = low;
  s->high = high;
  s->dfn = fn;
  s->darg = arg;
  return 0;
}

int weft_tcp_shutdown(weft_tcp *c) {
  struct weft__sock *s = conn_of(c);
  int r = usable(s);
  if (r)
    return r;
  if (s->shut_req)
    return -EALREADY;
  s->shut_req = true;
  pump_writes(s);
  return 0;
}

int weft_tcp_close(weft_tcp *c, int abortive, weft_close_fn fn, void *arg) {
  struct weft__sock *s = conn_of(c);
  if (!s || s->kind != SK_CONN)
    return -EINVAL;
  weft_rt *rt = s->rt;
  bool foreign = weft_rt_current() != rt;
  if (foreign) {
    int r = weft__foreign_enter(rt);
    if (r)
      return r; /* shut down: weft_rt_destroy frees it */
  }
  if (weft__xchg(&s->close_req, 1, WA_RLX)) {
    if (foreign)
      weft__foreign_exit(rt);
    return -EALREADY;
  }
  s->clfn = fn;
  s->clarg = arg;
  s->abortive = abortive != 0;
  signal_bits(s, EV_CLOSE); /* release: the fields above go with it */
  if (foreign)
    weft__foreign_exit(rt);
  return 0;
}

static int check_addr(const struct sockaddr *addr, unsigned addrlen) {
  if (!addr || addrlen < sizeof(sa_family_t))
    return -EINVAL;
  if (addr->sa_family == AF_INET)
    return addrlen >= sizeof(struct sockaddr_in) ? 0 : -EINVAL;
  if (addr->sa_family == AF_INET6)
    return addrlen >= sizeof(struct sockaddr_in6) ? 0 : -EINVAL;
  return -EAFNOSUPPORT;
}

int weft__tcp_socket(weft_rt *rt, int family) {
  int flags = SOCK_STREAM | SOCK_CLOEXEC;
  if (rt->backend == WEFT_BACKEND_EPOLL)
    flags |= SOCK_NONBLOCK;
  int fd = socket(family, flags, IPPROTO_TCP);
  return fd < 0 ? -errno : fd;
}

int weft__tcp_check(weft_rt *rt, const struct sockaddr *addr,
                    unsigned addrlen) {
  if (!rt)
    return -EINVAL;
  int r = check_addr(addr, addrlen);
  if (r)
    return r;
  if (rt->backend == WEFT_BACKEND_NONE)
    return -ENOTSUP;
  if (weft__load(&rt->closing, WA_ACQ))
    return -ESHUTDOWN;
  return weft__io_ensure(rt);
}

unsigned weft__tcp_home(weft_rt *rt) {
  struct weft__shard *sh = weft__local_begin(rt);
  unsigned home = sh ? sh->idx : weft__fetch_add(&rt->tcp_rr, 1, WA_RLX);
  weft__local_end(sh);
  return home % rt->nshards;
}

int weft_tcp_connect(weft_rt *rt, weft_strand *strand,
                     const struct sockaddr *addr, unsigned addrlen,
                     uint64_t timeout_ns, weft_connect_fn fn, void *arg,
                     weft_tcp **out) {
  int r = weft__tcp_check(rt, addr, addrlen);
  if (r)
    return r;
  if (!fn || !out || addrlen > sizeof(struct sockaddr_storage))
    return -EINVAL;
  if (strand && strand->rt != rt)
    return -EXDEV;
  if (strand && (weft__load(&strand->released, WA_RLX) ||
                 strand->magic != WEFT_STRAND_MAGIC))
    return -EBADF;
  int fd = weft__tcp_socket(rt, addr->sa_family);
  if (fd < 0)
    return fd;
  unsigned home = weft__tcp_home(rt);
  struct weft__sock *s = weft__sock_new(rt, fd, SK_CONN, strand);
  if (!s) {
    close(fd);
    return -ENOMEM;
  }
  s->state = ST_CONNECTING;
  memcpy(&s->addr, addr, addrlen);
  s->addrlen = addrlen;
  s->timeout_ns = timeout_ns;
  s->cfn = fn;
  s->carg = arg;
  r = weft__sock_register(s, home);
  if (r) {
    weft__sock_discard(s);
    return r;
  }
  *out = (weft_tcp *)s;
  signal_bits(s, EV_CONNECT);
  return 0;
}

/* ---- the runtime's side ----------------------------------------------------
 */

void weft__tcp_shutdown(weft_rt *rt) {
  if (rt->backend == WEFT_BACKEND_NONE)
    return;
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *reg = &rt->shards[i];
    /* The lock keeps each socket's memory from being freed meanwhile;
     * its generation check drops the signal for one already freed. */
    pthread_mutex_lock(&reg->tcp_lock);
    for (struct weft__sock *s = reg->tcp_list; s; s = s->rnext)
      weft__sock_signal(NULL, s, EV_SHUTDOWN, s->gen);
    pthread_mutex_unlock(&reg->tcp_lock);
  }
}

size_t weft__sock_size(void) { return sizeof(struct weft__sock); }
