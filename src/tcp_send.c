/*
 * tcp_send.c - a connection's writes (tcp_send.h). Owns the write state
 * (struct weft__wstate and the write requests in it: tcp.h), the
 * watermarks' settings (struct weft__wmark) and the runtime's send
 * buffers in use.
 *
 * A connection holds its write state (struct weft__wstate: the queue,
 * the completed writes, the send buffer) only while it has writes: from
 * the first write queued until all have completed and their callbacks
 * run (ws_put), so an idle connection holds none.
 *
 * Writes leave in the order they were queued. With io_uring one send is
 * in the kernel at a time (its iovecs gathered into a pooled send buffer
 * that the kernel reads until the completion), so bytes cannot overtake
 * each other; with epoll, non-blocking sends on readiness, and a write
 * without a callback into a connection without write state goes at once
 * and takes the write state only for what the socket left (send_at_once).
 * A file send
 * (weft_tcp_sendfile) is a write whose bytes come from a file: it goes by
 * sendfile(2) on the strand once every write before it has gone, never in
 * a gathered send, and when the socket is full the strand waits for room
 * (epoll's edge, or a one-shot poll in the ring). A write that passes
 * descriptors (weft_tcp_send_fds) starts a send of its own, whose control
 * message rides with its first byte (unix_fds.c has the receiving side).
 */
#include "tcp_send.h"

#include "io.h"
#include "rt.h"
#include "sim.h"
#include "shard.h"
#include "tcp_timeout.h"
#include "thread.h"
#include "unix.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

/* The most bytes a connection sends by direct send(2) calls in one go (a
 * write call, or one turn of its strand); the rest goes in later turns.
 * Without the bound, a large write to a reader that keeps draining the
 * socket looped inside the call for as long as the whole transfer took,
 * holding the shard and every strand on it. */
#define SEND_BUDGET ((size_t)1 << 20)

/* The watermarks of a connection without weft_tcp_set_watermarks. */
static const struct weft__wmark wm_default = {.low = (size_t)64 << 10,
                                              .high = (size_t)1 << 20};

static const struct weft__wmark *wm_of(const struct weft__conn *c) {
  return c->more && c->more->wm_set ? &c->more->wm : &wm_default;
}

/* ---- the write state ---------------------------------------------------- */

/* c's write state, taken from the pool if c holds none; NULL without
 * memory. */
static struct weft__wstate *ws_get(struct weft__conn *c) {
  if (c->ws)
    return c->ws;
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  struct weft__wstate *ws = weft__pool_alloc(
      &weft__sock_rt(&c->s)->net.wstate_pool, sh ? &sh->cache.wstate : NULL);
  weft__local_end(sh);
  if (ws)
    memset(ws, 0, offsetof(struct weft__wstate, inl));
  return c->ws = ws;
}

/* Gives c's write state back once nothing in it is in use: no write
 * queued or due its callback, no send in the kernel (whose completion
 * reads sb). */
static void ws_put(struct weft__conn *c) {
  struct weft__wstate *ws = c->ws;
  if (!ws || ws->wq_head || ws->done_head || ws->sb || c->wr_inflight)
    return;
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  weft__pool_free(&weft__sock_rt(&c->s)->net.wstate_pool,
                  sh ? &sh->cache.wstate : NULL, ws);
  weft__local_end(sh);
  c->ws = NULL;
}

static size_t queued_of(const struct weft__conn *c) {
  return c->ws ? c->ws->queued : 0;
}

bool weft__send_queued(const struct weft__conn *c) {
  return c->ws && c->ws->wq_head;
}

/* ---- write completions ------------------------------------------------- */

static void wreq_release(struct weft__wstate *ws, struct weft__wreq *w) {
  if (w->iov != w->inl)
    free(w->iov);
  free(w->ctl);
  if (w == &ws->inl)
    ws->inl_busy = false;
  else
    free(w);
}

static void wreq_done(struct weft__wstate *ws, struct weft__wreq *w,
                      int status) {
  if (!w->fn) {
    wreq_release(ws, w); /* nobody to tell: no callback to order */
    return;
  }
  w->status = status;
  w->next = NULL;
  if (ws->done_tail)
    ws->done_tail->next = w;
  else
    ws->done_head = w;
  ws->done_tail = w;
}

/* Calls the due write callbacks, then the drain callback, and gives the
 * write state back if nothing in it is left; only from the strand handler
 * (never inside a weft_tcp_* call). */
void weft__send_flush_held(struct weft__conn *c) {
  /* c->ws read again after each callback: a write it makes may take one
   * when none is held, and give it back at once */
  while (c->ws && c->ws->done_head) {
    struct weft__wstate *ws = c->ws;
    struct weft__wreq *w = ws->done_head;
    ws->done_head = w->next;
    if (!ws->done_head)
      ws->done_tail = NULL;
    weft_write_fn fn = w->fn;
    void *arg = w->arg;
    int status = w->status;
    wreq_release(ws, w);
    weft__calling((void *)fn);
    fn(arg, (weft_tcp *)c, status);
  }
  ws_put(c);
  const struct weft__wmark *wm = wm_of(c);
  if (c->drain_wanted && queued_of(c) <= wm->low && c->s.state == ST_OPEN) {
    c->drain_wanted = false;
    if (wm->fn) {
      weft__calling((void *)wm->fn);
      wm->fn(wm->arg, (weft_tcp *)c);
    }
  }
}

/* Every queued write fails with status (close, error). */
void weft__send_fail(struct weft__conn *c, int status) {
  struct weft__wstate *ws = c->ws;
  if (!ws)
    return;
  ws->queued = 0;
  while (ws->wq_head) {
    struct weft__wreq *w = ws->wq_head;
    ws->wq_head = w->next;
    wreq_done(ws, w, status);
  }
  ws->wq_tail = NULL;
}

/* Moves w's iovecs past up to n of their bytes, then past the empty ones
 * that follow; returns how many bytes it moved past. */
static size_t wreq_skip(struct weft__wreq *w, size_t n) {
  size_t done = 0;
  while (n > done && w->iovpos < w->iovcnt) {
    struct iovec *v = &w->iov[w->iovpos];
    size_t k = n - done < v->iov_len ? n - done : v->iov_len;
    v->iov_base = (char *)v->iov_base + k;
    v->iov_len -= k;
    done += k;
    if (!v->iov_len)
      w->iovpos++;
  }
  while (w->iovpos < w->iovcnt && !w->iov[w->iovpos].iov_len)
    w->iovpos++;
  return done;
}

/* n bytes of the queue were sent: complete the writes now fully sent
 * (zero-length ones at the head included). */
static void advance(struct weft__conn *c, size_t n) {
  struct weft__wstate *ws = c->ws;
  if (n && weft__tcp_tmo(c))
    weft__tmo_progress(c, true);
  ws->queued -= n;
  while (ws->wq_head) {
    struct weft__wreq *w = ws->wq_head;
    if (n && w->ctl)
      w->ctl_sent = true; /* its descriptors went with its first byte */
    size_t k = wreq_skip(w, n);
    w->left -= k;
    n -= k;
    if (w->left)
      break;
    ws->wq_head = w->next;
    if (!ws->wq_head)
      ws->wq_tail = NULL;
    wreq_done(ws, w, 0);
  }
}

/* Most bytes of one send through the ring: a one-buffer send's length is
 * 32 bits there (a 4 GiB write would be sent as 0 bytes, again and again),
 * and the kernel sends at most 2 GiB - 4 KiB a call anyway. */
#define RING_SEND_MAX ((size_t)1 << 30)

/* Gathers the queue's unsent iovecs into sb, at most max bytes of them,
 * up to the first file send; returns how many iovecs. Descriptors to
 * pass go with the first byte of their write, so such a write starts a
 * send of its own, its control message attached. */
static int gather(struct weft__conn *c, struct weft__sendbuf *sb, size_t max) {
  int k = 0;
  size_t bytes = 0;
  void *ctl = NULL;
  size_t ctllen = 0;
  struct weft__wreq *w = c->ws->wq_head;
  for (; w && w->file_fd < 0 && k < WEFT_SEND_IOV && bytes < max; w = w->next) {
    if (w->ctl && !w->ctl_sent) {
      if (k)
        break;
      ctl = w->ctl;
      ctllen = w->ctllen;
    }
    for (int i = w->iovpos; i < w->iovcnt && k < WEFT_SEND_IOV && bytes < max;
         i++)
      if (w->iov[i].iov_len) {
        sb->iov[k] = w->iov[i];
        if (sb->iov[k].iov_len > max - bytes)
          sb->iov[k].iov_len = max - bytes;
        bytes += sb->iov[k++].iov_len;
      }
  }
  memset(&sb->msg, 0, sizeof(sb->msg));
  sb->msg.msg_iov = sb->iov;
  sb->msg.msg_iovlen = (size_t)k;
  sb->msg.msg_control = ctl;
  sb->msg.msg_controllen = ctllen;
  sb->bytes = bytes;
  sb->file_next = w && w->file_fd >= 0;
  return k;
}

/* ---- sending ------------------------------------------------------------- */

static void write_failed(struct weft__conn *c, int err) {
  if (!c->err)
    c->err = err;
  weft__send_fail(c, err);
}

/* A non-blocking send of msg's buffers: send(2) for one buffer, which
 * spares the kernel copying in a msghdr and an iovec, sendmsg(2) for
 * several. more: MSG_MORE or 0. */
static ssize_t send_msg(struct weft__conn *c, const struct msghdr *msg,
                        int more) {
  int flags = MSG_NOSIGNAL | MSG_DONTWAIT | more;
  if (weft__sim_fault(weft__sock_rt(&c->s), WEFT_SIM_FAULT_BREAK))
    shutdown(c->s.fd, SHUT_RDWR); /* a simulated break (sim.h) */
  if (msg->msg_iovlen == 1 && !msg->msg_control)
    return send(c->s.fd, msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len,
                flags);
  return sendmsg(c->s.fd, msg, flags);
}

/* The gathered bytes. Before a file send, MSG_MORE lets them leave in one
 * segment with the file's first bytes (a response's head and its body). */
static ssize_t send_direct(struct weft__conn *c, struct weft__sendbuf *sb) {
  return send_msg(c, &sb->msg, sb->file_next ? MSG_MORE : 0);
}

/* sendfile(2) of at most max bytes of the file send at the head of the
 * queue: the bytes sent. 0 when the socket is full (writable cleared),
 * or on an error, which fails the queue: the peer would take the writes
 * after a file send cut short for the file's bytes. A file that ends
 * before len bytes is -ENODATA. */
static size_t send_file(struct weft__conn *c, size_t max) {
  struct weft__wreq *w = c->ws->wq_head;
  ssize_t n = sendfile(c->s.fd, w->file_fd, &w->file_off,
                       w->left < max ? w->left : max);
  if (n > 0) {
    if (weft__tcp_tmo(c))
      weft__tmo_progress(c, true);
    w->left -= (size_t)n;
    if (!w->left)
      advance(c, 0);
    return (size_t)n;
  }
  if (n == 0)
    write_failed(c, -ENODATA);
  else if (errno == EAGAIN || errno == EWOULDBLOCK)
    c->writable = false;
  else if (errno != EINTR)
    write_failed(c, -errno);
  return 0;
}

/* Readiness: send what the socket takes now, up to SEND_BUDGET bytes;
 * beyond that the strand's next turn goes on. */
static void send_now(struct weft__conn *c) {
  struct weft__sendbuf sb;
  size_t budget = SEND_BUDGET;
  while (weft__send_queued(c) && c->writable) {
    if (!budget) {
      weft__sock_yield(&c->s);
      return;
    }
    struct weft__wreq *head = c->ws->wq_head;
    if (head->file_fd >= 0 && head->left) {
      budget -= send_file(c, budget);
      continue;
    }
    if (!gather(c, &sb, budget)) {
      advance(c, 0); /* only zero-length writes left */
      continue;
    }
    ssize_t n = send_direct(c, &sb);
    if (n >= 0) {
      advance(c, (size_t)n);
      budget -= (size_t)n;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c->writable = false;
    } else if (errno != EINTR) {
      write_failed(c, -errno);
    }
  }
}

static struct weft__sendbuf *sendbuf_get(weft_rt *rt, struct weft__shard *sh) {
  return weft__pool_alloc(&rt->net.send_pool, sh ? &sh->cache.send : NULL);
}

static void sendbuf_put(struct weft__conn *c) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  weft__pool_free(&weft__sock_rt(&c->s)->net.send_pool,
                  sh ? &sh->cache.send : NULL, c->ws->sb);
  weft__local_end(sh);
  c->ws->sb = NULL;
}

/* One sendmsg in the ring of the calling thread's shard, leaving with that
 * thread's next kernel entry: when it runs out of work, or within 8 more
 * items (io.c), or, if one of those runs long, when the monitor hands the
 * shard on with its ring. The replies of a burst of requests then leave
 * in one entry and reach the peers as one burst. true: it is in the ring
 * (wr_inflight, sb held until it completes). */
static bool send_ring(struct weft__conn *c) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  struct weft__sendbuf *sb = c->ws->sb;
  bool in = sh && sb && weft__io_send(sh, c->s.fd, &sb->msg, &c->s.ioh) == 0;
  weft__local_end(sh);
  c->wr_inflight = in;
  return in;
}

/* A one-shot poll for room in the socket, in the calling thread's ring
 * (wr_inflight and wr_poll until it completes); false without an entry. */
static bool poll_room(struct weft__conn *c) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  bool in = sh && weft__io_poll_fd(sh, c->s.fd, WEFT_IO_OUT, &c->s.ioh) == 0;
  weft__local_end(sh);
  c->wr_inflight = c->wr_poll = in;
  return in;
}

/* The file send at the head of the queue, with completions: sendfile(2)
 * while the socket takes bytes and budget lasts, then a poll for room.
 * false: the strand goes on in a later turn. */
static bool submit_file(struct weft__conn *c, size_t *budget) {
  struct weft__wstate *ws = c->ws;
  if (ws->sb)
    sendbuf_put(c);
  /* The socket starts blocking (io.h, weft__io_sock_flags), and sendfile
   * has no MSG_DONTWAIT: at the first file send it is made non-blocking,
   * for good, which spares two calls per file send. The ring's operations
   * on it may then complete with -EAGAIN (an O_NONBLOCK socket gives that
   * to one io_uring hands to its workers; liburing#364): a receive takes
   * it as a reason to try again (tcp_recv.c), and a send leaves the queue
   * as it was, to be sent again (weft__send_completed). */
  if (c->writable && *budget) {
    int on = 1;
    if (!c->nonblock && ioctl(c->s.fd, FIONBIO, &on) < 0) {
      write_failed(c, -errno);
      return true;
    }
    c->nonblock = true;
    while (*budget && ws->wq_head && ws->wq_head->file_fd >= 0 &&
           ws->wq_head->left && c->writable)
      *budget -= send_file(c, *budget);
  }
  if (!ws->wq_head || ws->wq_head->file_fd < 0 || !ws->wq_head->left)
    return true;
  if (!c->writable && poll_room(c))
    return true;
  weft__sock_yield(&c->s); /* the budget is spent, or no ring entry */
  return false;
}

/* Completions: one send in the kernel at a time, so bytes stay in order.
 * Without a ring entry (a thread without a shard, a full ring) a
 * non-blocking send goes directly, or the strand tries again later. */
static void send_submit(struct weft__conn *c) {
  struct weft__wstate *ws = c->ws;
  size_t budget = SEND_BUDGET; /* of direct sends */
  while (ws->wq_head && !c->wr_inflight) {
    if (ws->wq_head->file_fd >= 0 && ws->wq_head->left) {
      if (!submit_file(c, &budget))
        break;
      continue;
    }
    if (!ws->sb) {
      struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
      ws->sb = sendbuf_get(weft__sock_rt(&c->s), sh);
      weft__local_end(sh);
      if (!ws->sb) {
        weft__sock_kick(&c->s); /* no memory now: later */
        return;
      }
    }
    if (!gather(c, ws->sb, RING_SEND_MAX)) {
      advance(c, 0);
      continue;
    }
    /* Before a file send, which runs on the strand anyway, a direct send
     * spares waiting a turn for the ring's completion. */
    bool direct = ws->sb->file_next && c->writable && budget;
    if (!direct && send_ring(c))
      return;
    if (c->writable && budget) {
      if (!gather(c, ws->sb, budget))
        continue; /* cannot be: gathered above */
      ssize_t n = send_direct(c, ws->sb);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        write_failed(c, -errno);
        break;
      }
      bool all = n > 0 && (size_t)n == ws->sb->bytes;
      if (n > 0) {
        advance(c, (size_t)n);
        budget -= (size_t)n;
      }
      if (all)
        continue;
      c->writable = false; /* full: only the ring waits for room */
    }
    weft__sock_yield(&c->s); /* later, on a thread with a ring entry */
    break;
  }
  if (ws->sb && !c->wr_inflight)
    sendbuf_put(c);
}

void weft__send_pump_held(struct weft__conn *c) {
  if (weft__send_queued(c) && weft__io_completes(weft__sock_rt(&c->s)))
    send_submit(c);
  else if (weft__send_queued(c))
    send_now(c);
  if (!weft__send_queued(c) && c->shut_req && !c->shut_sent &&
      !c->wr_inflight) {
    c->shut_sent = true;
    shutdown(c->s.fd, SHUT_WR);
  }
  ws_put(c);
}

void weft__send_completed(struct weft__conn *c) {
  c->wr_inflight = false;
  if (c->wr_poll) { /* whatever it says, the next sendfile tells */
    c->wr_poll = false;
    c->writable = true;
    return;
  }
  int res = c->wres;
  size_t bytes = c->ws->sb->bytes;
  sendbuf_put(c);
  if (res >= 0) {
    advance(c, (size_t)res);
    if ((size_t)res == bytes)
      c->writable = true; /* it all went: room for a direct send */
    return;
  }
  /* -ECANCELED while open: its submitter exited (io_uring.c). These leave
   * the queue as it was, and weft__send_pump sends again. */
  if (res == -EINTR || res == -EAGAIN ||
      (res == -ECANCELED && c->s.state == ST_OPEN))
    return;
  write_failed(c, c->s.state == ST_CLOSING ? weft__tcp_close_status(c) : res);
}

/* ---- the API ------------------------------------------------------------- */

/* A write request, with the write state if c holds none; NULL without
 * memory, which leaves c's write state as it was or gives it back. */
static struct weft__wreq *wreq_new(struct weft__conn *c, int iovcnt) {
  struct weft__wstate *ws = ws_get(c);
  struct weft__wreq *w;
  if (!ws)
    return NULL;
  if (!ws->inl_busy) {
    w = &ws->inl;
    ws->inl_busy = true;
  } else if (!(w = malloc(sizeof(*w)))) {
    return NULL;
  }
  w->iov = w->inl;
  w->iovpos = 0;
  w->file_fd = -1;
  w->ctl = NULL;
  w->ctl_sent = false;
  if (iovcnt > 2 && !(w->iov = malloc(sizeof(struct iovec) * (size_t)iovcnt))) {
    if (w == &ws->inl)
      ws->inl_busy = false;
    else
      free(w);
    ws_put(c);
    return NULL;
  }
  return w;
}

/* Appends w, of len bytes, to the queue and sends what can go now. */
static void enqueue(struct weft__conn *c, struct weft__wreq *w, size_t len,
                    weft_write_fn fn, void *arg) {
  struct weft__wstate *ws = c->ws;
  w->left = len;
  w->fn = fn;
  w->arg = arg;
  w->next = NULL;
  if (ws->wq_tail) {
    ws->wq_tail->next = w;
  } else {
    ws->wq_head = w;
    if (weft__tcp_tmo(c))
      weft__tmo_write_queued(c);
  }
  ws->wq_tail = w;
  weft__send_pump(c); /* gives the write state back if all is done */
  if (c->ws && c->ws->done_head)
    weft__sock_kick(&c->s); /* completions run in the handler */
}

/* With epoll, a write nobody waits on (no callback) into a connection
 * with no write state (nothing queued, no callback due) goes to the
 * socket at once, from the caller's iovecs: most often the socket takes
 * it whole, and the write then needs no write state at all. true: it is
 * done (sent, or failed as a queued write would: the connection's later
 * writes fail); false: *sent of its bytes went and the caller queues the
 * rest. Unused with io_uring, whose writes leave together at the thread's
 * next entry (send_ring). */
static bool send_at_once(struct weft__conn *c, const struct iovec *iov,
                         int iovcnt, size_t total, size_t *sent) {
  if (c->ws || !c->writable || !total || total > SEND_BUDGET ||
      weft__io_completes(weft__sock_rt(&c->s)))
    return false;
  struct msghdr msg = {.msg_iov = (struct iovec *)iov,
                       .msg_iovlen = (size_t)iovcnt};
  ssize_t n = send_msg(c, &msg, 0);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      c->writable = false;
    else if (errno != EINTR)
      write_failed(c, -errno);
    return c->err != 0;
  }
  if (n && weft__tcp_tmo(c))
    weft__tmo_progress(c, true);
  *sent = (size_t)n;
  return (size_t)n == total;
}

int weft_tcp_writev(weft_tcp *tcp, const struct iovec *iov, int iovcnt,
                    weft_write_fn fn, void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_write");
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
  if (c->shut_req || c->err)
    return -EPIPE;
  size_t queued = queued_of(c);
  if (queued && queued + total > wm_of(c)->high) {
    c->drain_wanted = true;
    return -ENOBUFS;
  }
  size_t sent = 0;
  if (!fn && send_at_once(c, iov, iovcnt, total, &sent))
    return 0;
  struct weft__wreq *w = wreq_new(c, iovcnt);
  if (!w && sent) {
    /* Part of it went and the rest cannot follow: the stream is cut. */
    write_failed(c, -ENOMEM);
    return -ENOMEM;
  }
  if (!w)
    return -ENOMEM;
  memcpy(w->iov, iov, sizeof(*iov) * (size_t)iovcnt);
  w->iovcnt = iovcnt;
  wreq_skip(w, sent);
  c->ws->queued += total - sent;
  enqueue(c, w, total - sent, fn, arg);
  return 0;
}

int weft_tcp_sendfile(weft_tcp *tcp, int fd, int64_t off, size_t len,
                      weft_write_fn fn, void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_sendfile");
  if (r)
    return r;
  if (fd < 0 || fd == c->s.fd)
    return -EBADF;
  if (off < 0 || len > (size_t)INT64_MAX - (size_t)off)
    return -EINVAL;
  /* Only a file that never makes sendfile wait: from a pipe or a socket
   * it could answer EAGAIN while the connection has room, and the strand
   * would wait for room it already has. */
  struct stat st;
  if (fstat(fd, &st) < 0)
    return -errno;
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    return -EINVAL;
  if (c->shut_req || c->err)
    return -EPIPE;
  struct weft__wreq *w = wreq_new(c, 0);
  if (!w)
    return -ENOMEM;
  w->iovcnt = 0;
  w->file_fd = fd;
  w->file_off = (off_t)off;
  enqueue(c, w, len, fn, arg); /* holds no memory: not in ws->queued */
  return 0;
}

int weft_tcp_send_fds(weft_tcp *tcp, const void *buf, size_t len,
                      const int *fds, int nfds, weft_write_fn fn, void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_send_fds");
  if (r)
    return r;
  if (!buf || !len || !fds || nfds < 1 || nfds > WEFT_FDS_PER_WRITE)
    return -EINVAL;
  for (int i = 0; i < nfds; i++)
    if (fds[i] < 0)
      return -EBADF;
  if ((r = weft__unix_conn_check(c)))
    return r;
  if (c->shut_req || c->err)
    return -EPIPE;
  size_t queued = queued_of(c);
  if (queued && queued + len > wm_of(c)->high) {
    c->drain_wanted = true;
    return -ENOBUFS;
  }
  size_t ctllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
  struct cmsghdr *m = calloc(1, ctllen);
  struct weft__wreq *w = m ? wreq_new(c, 1) : NULL;
  if (!w) {
    free(m);
    return -ENOMEM;
  }
  m->cmsg_level = SOL_SOCKET;
  m->cmsg_type = SCM_RIGHTS;
  m->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
  memcpy(CMSG_DATA(m), fds, sizeof(int) * (size_t)nfds);
  w->ctl = m;
  w->ctllen = ctllen;
  w->iov[0].iov_base = (void *)buf;
  w->iov[0].iov_len = len;
  w->iovcnt = 1;
  c->ws->queued += len;
  enqueue(c, w, len, fn, arg);
  return 0;
}

int weft_tcp_write(weft_tcp *tcp, const void *buf, size_t len, weft_write_fn fn,
                   void *arg) {
  struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
  return weft_tcp_writev(tcp, &v, 1, fn, arg);
}

size_t weft_tcp_queued(const weft_tcp *tcp) {
  return tcp ? queued_of(weft__conn_of(tcp)) : 0;
}

int weft_tcp_set_watermarks(weft_tcp *tcp, size_t low, size_t high,
                            weft_drain_fn fn, void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  if (low > high || !high)
    return -EINVAL;
  int r = weft__tcp_on_strand(c, "weft_tcp_set_watermarks");
  if (r)
    return r;
  struct weft__tcp_more *m = weft__tcp_more(c);
  if (!m)
    return -ENOMEM;
  m->wm = (struct weft__wmark){.low = low, .high = high, .fn = fn, .arg = arg};
  m->wm_set = true;
  return 0;
}