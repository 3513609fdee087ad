/*
 * udp.c - UDP sockets (udp.h): receiving and sending datagrams in
 * batches on the socket's strand. Owns struct udp, its receive batch and
 * its send queue, and the UDP pool.
 *
 * Both backends work by readiness here: epoll reports it (edge-triggered,
 * so `readable` and `writable` remember an edge until EAGAIN), and with
 * io_uring a one-shot poll of the socket stands for it, as for listening
 * sockets (listen.c). The strand then reads with recvmmsg and writes with
 * sendmmsg, non-blocking (MSG_DONTWAIT: io_uring's sockets are blocking,
 * io.h). A datagram costs one slot of a batch, never a system call of
 * its own. The one operation io_uring waits for besides the poll is a
 * send whose socket buffer was full: the head of the queue goes through
 * the ring as a sendmsg, which waits in the kernel for room, and the rest
 * follows when it completes.
 *
 * Fairness: one run reads at most RECV_BUDGET datagrams; with more
 * waiting it ends its strand's turn (weft__sock_yield) and goes on after
 * the shard's other strands.
 *
 * The send queue is a FIFO of entries over one byte arena used as a ring
 * (arena_place): weft_udp_send copies into it, so the caller's buffer is
 * free at once, and the queue's bound in bytes is its memory.
 *
 * Under simulation (sim.h) a socket is a port of the simulated host, a
 * Unix datagram socket bound to the port's name: addresses are mapped at
 * open, at each send (sim_flush) and at each delivery, and a connected
 * socket only remembers its peer, since UDP may connect to a port nobody
 * holds and a Unix socket may not.
 */
#include "udp.h"

#include "rt.h"
#include "sim.h"
#include "sock.h"
#include "tcp.h"
#include "thread.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define BATCH 32
#define RECV_BUDGET 64
#define DEFAULT_MAXDG 2048u
#define DEFAULT_QUEUE (256u * 1024)
#define QUEUE_ENTRIES 1024u

/* UDP's own event bits (sock.h has the shared ones). */
#define EV_POLLED (EV_KIND << 0) /* uring: the poll completed */
#define EV_WDONE (EV_KIND << 1)  /* uring: the ring's send completed */

struct sq_ent {
  uint32_t off, len;
  socklen_t tolen; /* 0: to the connected peer */
  weft_udp_send_fn fn;
  void *arg;
  struct sockaddr_storage to;
};

/* The receive batch: BATCH slots of maxdg bytes (mem) and their headers. */
struct rbatch {
  struct mmsghdr msg[BATCH];
  struct iovec iov[BATCH];
  struct sockaddr_storage addr[BATCH];
  char mem[];
};

struct udp {
  struct weft__sock s;
  weft_udp_recv_fn rfn;
  void *rarg;
  void *data;
  weft_udp_close_fn clfn;
  _Atomic uint32_t close_req; /* 1 once closed by the user or a shutdown */
  bool receiving, readable, writable, polling, ring_send, close_posted;
  bool connected;
  bool in_run; /* weft__udp_run is going on: its flush sends what is queued */
  bool kicked; /* a flush is asked for by a kick */
  int family;
  unsigned maxdg;
  struct rbatch *rb;
  /* rb's datagrams [rb_next, rb_count) are read but not yet delivered: a
   * receive callback stopped receiving; they go first when it restarts */
  unsigned rb_next, rb_count;
  /* send queue: entries [head, tail) of a ring of QUEUE_ENTRIES */
  struct sq_ent *sq;
  unsigned head, tail;
  char *arena;
  size_t arena_cap;
  size_t a_lo, a_hi; /* the arena's ring of queued bytes (arena_place) */
  bool a_wrap;
  struct msghdr wmsg; /* uring: the ring's send of the head */
  struct iovec wiov;
  int32_t wres;
#ifdef WEFT_SIM
  /* A port of the simulated host (sim.h), a Unix datagram socket
   * underneath: its own port, and the peer's address while connected (the
   * socket itself is not: UDP connects to a port nobody holds). */
  uint16_t sim_port;
  struct sockaddr_storage sim_peer;
#endif
};

static struct udp *udp_of(const weft_udp *u) { return (struct udp *)u; }

static unsigned queued(const struct udp *u) { return u->tail - u->head; }

/* ---- sending ---------------------------------------------------------------
 */

/* Where a datagram of len bytes goes in the arena, or SIZE_MAX: none
 * fits. The queued datagrams' bytes form a ring, each contiguous, from
 * the head's (a_lo) to a_hi; one that does not fit before the arena's end
 * starts over at 0 when the head's bytes leave room there (a_wrap: the
 * queued bytes run [a_lo, end) then [0, a_hi)). An empty queue starts
 * over at 0. */
static size_t arena_place(struct udp *u, size_t len) {
  if (!queued(u)) {
    u->a_lo = u->a_hi = 0;
    u->a_wrap = false;
  }
  size_t at;
  if (!u->a_wrap && u->a_hi + len <= u->arena_cap) {
    at = u->a_hi;
  } else if (!u->a_wrap && len <= u->a_lo) {
    u->a_wrap = true;
    at = 0;
  } else if (u->a_wrap && u->a_hi + len <= u->a_lo) {
    at = u->a_hi;
  } else {
    return SIZE_MAX;
  }
  u->a_hi = at + len;
  return at;
}

static void send_complete(struct udp *u, int status) {
  struct sq_ent *e = &u->sq[u->head % QUEUE_ENTRIES];
  u->head++;
  if (u->head != u->tail) { /* the new head's bytes start the ring */
    uint32_t lo = u->sq[u->head % QUEUE_ENTRIES].off;
    if (u->a_wrap && lo < u->a_lo)
      u->a_wrap = false; /* the part before the end is all sent */
    u->a_lo = lo;
  }
  if (e->fn) {
    weft__calling((void *)e->fn);
    e->fn(e->arg, (weft_udp *)u, status);
  }
}

static void fill_msg(struct udp *u, struct sq_ent *e, struct msghdr *m,
                     struct iovec *iov) {
  iov->iov_base = u->arena + e->off;
  iov->iov_len = e->len;
  memset(m, 0, sizeof(*m));
  m->msg_iov = iov;
  m->msg_iovlen = 1;
  if (e->tolen) {
    m->msg_name = &e->to;
    m->msg_namelen = e->tolen;
  }
}

/* uring, the socket buffer full: the head waits in the kernel for room. */
static void ring_send(struct udp *u) {
  struct sq_ent *e = &u->sq[u->head % QUEUE_ENTRIES];
  fill_msg(u, e, &u->wmsg, &u->wiov);
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&u->s));
  u->ring_send = weft__io_send(sh, u->s.fd, &u->wmsg, &u->s.ioh) == 0;
  weft__local_end(sh);
  if (!u->ring_send)
    weft__sock_kick(&u->s); /* the ring is full: try again shortly */
}

#ifdef WEFT_SIM
/* flush in a simulation, a datagram at a time, to the Unix name of its
 * port. A datagram may be lost (WEFT_SIM_FAULT_DROP), and what the Unix
 * socket refuses where UDP would not is loss too: a receiver that has
 * not read what waits (-EAGAIN: unread datagrams count against the
 * sender's buffer too), and nobody on the port (-ECONNREFUSED), which a
 * connected socket hears of, as UDP hears of the ICMP refusal. */
static void sim_flush(struct udp *u) {
  while (u->s.state == ST_OPEN && queued(u)) {
    struct sq_ent *e = &u->sq[u->head % QUEUE_ENTRIES];
    struct sockaddr_storage to = e->tolen ? e->to : u->sim_peer;
    struct sockaddr_un un;
    unsigned unlen;
    struct msghdr m;
    struct iovec iov;
    if (!e->tolen && !u->connected) { /* disconnected since it was queued */
      send_complete(u, -EDESTADDRREQ);
      continue;
    }
    if (weft__sim_fault(weft__sock_rt(&u->s), WEFT_SIM_FAULT_DROP) ||
        weft__sim_udp_name(weft__sock_rt(&u->s), &to, &un, &unlen, false)) {
      send_complete(u, 0);
      continue;
    }
    fill_msg(u, e, &m, &iov);
    m.msg_name = &un;
    m.msg_namelen = unlen;
    int err = sendmsg(u->s.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? errno : 0;
    if (err == EAGAIN || (err == ECONNREFUSED && e->tolen))
      err = 0;
    send_complete(u, -err);
  }
}
#endif

/* Sends what is queued, in batches, until the queue is empty or the
 * socket buffer is full. */
static void flush(struct udp *u) {
  u->kicked = false;
#ifdef WEFT_SIM
  if (weft__simulated(weft__sock_rt(&u->s))) {
    sim_flush(u);
    return;
  }
#endif
  while (u->s.state == ST_OPEN && queued(u) && u->writable && !u->ring_send) {
    struct mmsghdr mm[BATCH];
    struct iovec iov[BATCH];
    unsigned n = queued(u) < BATCH ? queued(u) : BATCH;
    for (unsigned i = 0; i < n; i++)
      fill_msg(u, &u->sq[(u->head + i) % QUEUE_ENTRIES], &mm[i].msg_hdr,
               &iov[i]);
    int r;
    do
      r = sendmmsg(u->s.fd, mm, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r < 0 && errno == EAGAIN) {
      u->writable = false;
      if (weft__io_completes(weft__sock_rt(&u->s)))
        ring_send(u);
      return;
    }
    if (r < 0) { /* the head's own error: the rest go on */
      send_complete(u, -errno);
      continue;
    }
    for (int i = 0; i < r && u->s.state == ST_OPEN; i++)
      send_complete(u, 0);
  }
}

static void fail_queued(struct udp *u) {
  while (queued(u))
    send_complete(u, -ECANCELED);
}

/* ---- receiving -------------------------------------------------------------
 */

static void poll_submit(struct udp *u) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&u->s));
  u->polling = weft__io_poll_fd(sh, u->s.fd, WEFT_IO_IN, &u->s.ioh) == 0;
  weft__local_end(sh);
  if (!u->polling)
    weft__sock_kick(&u->s);
}

static void deliver(struct udp *u, unsigned i) {
  struct mmsghdr *m = &u->rb->msg[i];
  unsigned len = m->msg_len < u->maxdg ? m->msg_len : u->maxdg;
  unsigned flags = (m->msg_hdr.msg_flags & MSG_TRUNC) ? WEFT_UDP_TRUNC : 0;
  const struct sockaddr *from = (const struct sockaddr *)&u->rb->addr[i];
  unsigned fromlen = m->msg_hdr.msg_namelen;
#ifdef WEFT_SIM
  struct sockaddr_storage in;
  if (weft__simulated(
          weft__sock_rt(&u->s))) { /* the sender's port, as UDP reads it */
    uint16_t port =
        weft__sim_port_of((const struct sockaddr_un *)from, fromlen);
    const struct sockaddr_in *p4 = (const struct sockaddr_in *)&u->sim_peer;
    const struct sockaddr_in6 *p6 = (const struct sockaddr_in6 *)&u->sim_peer;
    if (u->connected &&
        port != ntohs(u->family == AF_INET ? p4->sin_port : p6->sin6_port))
      return; /* the kernel drops what a connected socket's peer did not send */
    fromlen = sizeof(in);
    weft__sim_host_addr(u->family, port, (struct sockaddr *)&in, &fromlen);
    from = (const struct sockaddr *)&in;
  }
#endif
  weft__calling((void *)u->rfn);
  u->rfn(u->rarg, (weft_udp *)u, (long)len, m->msg_hdr.msg_iov->iov_base, from,
         fromlen, flags);
}

/* A close asked for (from a receive callback too) stops deliveries at
 * once, as a stop does. Relaxed: a close on the strand is before this
 * load in program order; one from another thread that it misses is as
 * if it came after the delivery, which weft_udp_close allows. */
static bool recv_wanted(const struct udp *u) {
  return u->s.state == ST_OPEN && u->receiving &&
         !weft__load(&u->close_req, WA_RLX);
}

/* Delivers what rb holds from rb_next on, while receiving is wanted. */
static void deliver_held(struct udp *u) {
  while (u->rb_next < u->rb_count && recv_wanted(u))
    deliver(u, u->rb_next++);
}

static void recv_batches(struct udp *u) {
  unsigned budget = RECV_BUDGET;
  struct rbatch *rb = u->rb;
  deliver_held(u);
  while (recv_wanted(u) && u->readable && budget) {
    unsigned n = budget < BATCH ? budget : BATCH;
    for (unsigned i = 0; i < n; i++) {
      rb->iov[i].iov_base = rb->mem + (size_t)i * u->maxdg;
      rb->iov[i].iov_len = u->maxdg;
      memset(&rb->msg[i].msg_hdr, 0, sizeof(rb->msg[i].msg_hdr));
      rb->msg[i].msg_hdr.msg_iov = &rb->iov[i];
      rb->msg[i].msg_hdr.msg_iovlen = 1;
      rb->msg[i].msg_hdr.msg_name = &rb->addr[i];
      rb->msg[i].msg_hdr.msg_namelen = sizeof(rb->addr[i]);
    }
    int r = recvmmsg(u->s.fd, rb->msg, n, MSG_DONTWAIT, NULL);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno == EAGAIN) {
      u->readable = false;
      break;
    }
    if (r < 0) { /* a pending error (ICMP refusal): one call reports it */
      int err = errno;
      budget--;
      weft__calling((void *)u->rfn);
      u->rfn(u->rarg, (weft_udp *)u, -(long)err, NULL, NULL, 0, 0);
      continue;
    }
    budget -= (unsigned)r < budget ? (unsigned)r : budget;
    u->rb_next = 0;
    u->rb_count = (unsigned)r;
    deliver_held(u);
  }
  if (!recv_wanted(u))
    return;
  if (u->readable)
    weft__sock_yield(&u->s); /* more wait: after the shard's others */
  else if (weft__io_completes(weft__sock_rt(&u->s)) && !u->polling)
    poll_submit(u);
}

/* ---- the strand's handler --------------------------------------------------
 */

static void udp_free_bufs(struct udp *u) {
  free(u->rb);
  free(u->arena);
  free(u->sq);
  u->rb = NULL;
  u->arena = NULL;
  u->sq = NULL;
}

static void close_run(void *arg) {
  struct udp *u = arg;
  if (u->clfn) {
    weft__calling((void *)u->clfn);
    u->clfn(u->data, (weft_udp *)u);
  }
  udp_free_bufs(u);
  weft__sock_free(&u->s);
}

/* The close callback goes to the back of the strand's queue (as a TCP
 * connection's, tcp.c); its cancel is itself. */
static void post_close(struct udp *u) {
  u->close_posted = true;
  weft_rt *rt = weft__sock_rt(&u->s);
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__node *n = weft__node_new(rt, sh, close_run, close_run, u);
  if (n)
    weft__node_post(rt, sh, u->s.strand, n, false);
  weft__local_end(sh);
  if (!n)
    close_run(u);
}

void weft__udp_run(struct weft__sock *s, uint32_t bits) {
  struct udp *u = (struct udp *)s;
  if (bits & EV_POLLED) {
    u->polling = false;
    u->readable = true;
  }
  u->in_run = true;
  if (bits & EV_WDONE) {
    u->ring_send = false;
    u->writable = s->state == ST_OPEN;
    /* Sent (0) even if closing; -EPIPE while closing is the close's
     * shutdown ending a send that waited for room: not sent, cancelled. */
    int st = u->wres < 0 ? u->wres : 0;
    send_complete(u, st == -EPIPE && s->state != ST_OPEN ? -ECANCELED : st);
  }
  if (bits & EV_IN)
    u->readable = true;
  if (bits & EV_OUT)
    u->writable = true;
  if ((bits & (EV_CLOSE | EV_SHUTDOWN)) && s->state == ST_OPEN) {
    uint32_t none = 0; /* a shutdown's close: a later weft_udp_close is late */
    weft__cas(&u->close_req, &none, 1, WA_ACQ, WA_ACQ);
    s->state = ST_CLOSING;
    if (u->polling || u->ring_send)
      shutdown(s->fd, SHUT_RDWR); /* wakes the poll and the send */
  }
  if (s->state == ST_OPEN) {
    recv_batches(u);
    flush(u);
  }
  if (s->state == ST_CLOSING && !u->polling && !u->ring_send) {
    weft__sock_close_fd(s);
    s->state = ST_CLOSED;
    fail_queued(u);
  }
  u->in_run = false;
  if (s->state == ST_CLOSED && !u->close_posted)
    post_close(u);
}

/* The reaper: the poll or the ring's send completed. */
static void udp_done(struct weft__ioh *h, struct weft__shard *local,
                     unsigned op, const struct weft__cqe *cqe) {
  struct udp *u = (struct udp *)weft__sock_of(h);
  if (op == WEFT_OP_SEND) {
    u->wres = cqe->res;
    weft__sock_signal(local, &u->s, EV_WDONE, WEFT_GEN_ANY);
  } else { /* WEFT_OP_POLL: whatever it says, recvmmsg tells */
    weft__sock_signal(local, &u->s, EV_POLLED, WEFT_GEN_ANY);
  }
}

/* ---- the API ---------------------------------------------------------------
 */

/* u, if it is a UDP socket that may be used here: 0, or why not. */
static int usable(const struct udp *u, const char *what) {
  if (!u || u->s.kind != SK_UDP)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(&u->s)))
    return -ECHILD;
  if (!weft__sock_on_strand(&u->s)) {
    weft__log(weft__sock_rt(&u->s), WEFT_LOG_DEBUG,
              "%s(%p): not called on the socket's strand (%p)", what,
              (const void *)u, (void *)u->s.strand);
    return -EPERM;
  }
  if (u->s.state != ST_OPEN || weft__load(&u->close_req, WA_RLX))
    return -EBADF; /* closing, or a close is asked for */
  return 0;
}

static int family_len(int family) {
  return family == AF_INET    ? (int)sizeof(struct sockaddr_in)
         : family == AF_INET6 ? (int)sizeof(struct sockaddr_in6)
                              : -1;
}

static int socket_setup(int fd, unsigned flags) {
  int one = 1;
  if ((flags & WEFT_UDP_REUSEADDR) &&
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
    return -errno;
  if ((flags & WEFT_UDP_BROADCAST) &&
      setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) < 0)
    return -errno;
  return 0;
}

static int udp_alloc(struct udp *u, const weft_udp_opts *o) {
  u->maxdg = o && o->max_datagram ? o->max_datagram : DEFAULT_MAXDG;
  u->arena_cap = o && o->send_queue ? o->send_queue : DEFAULT_QUEUE;
  u->rb = malloc(sizeof(*u->rb) + (size_t)BATCH * u->maxdg);
  u->arena = malloc(u->arena_cap);
  u->sq = malloc(QUEUE_ENTRIES * sizeof(*u->sq));
  if (u->rb && u->arena && u->sq)
    return 0;
  udp_free_bufs(u);
  return -ENOMEM;
}

static int open_check(weft_rt *rt, weft_strand *s, const struct sockaddr *addr,
                      unsigned addrlen, const weft_udp_opts *o,
                      weft_udp **out) {
  if (!out || !addr ||
      (o && (o->max_datagram > 65535 ||
             (o->flags & ~(WEFT_UDP_REUSEADDR | WEFT_UDP_BROADCAST)))))
    return -EINVAL;
  if (addrlen >= sizeof(sa_family_t) && addr->sa_family == AF_UNIX)
    return -EAFNOSUPPORT; /* datagram Unix sockets are not served */
  int r = weft__tcp_check(rt, addr, addrlen);
  if (r)
    return r;
  int sr = weft__strand_usable(rt, s);
  if (sr)
    return sr;
  return 0;
}

/* Binds fd to addr. In a simulation fd is a Unix datagram socket and
 * addr a port of the simulated host: fd takes the port's name (a port 0
 * the next one nobody holds), and *sim_port tells which. */
static int bind_addr(weft_rt *rt, int fd, const struct sockaddr *addr,
                     socklen_t alen, uint16_t *sim_port) {
  *sim_port = 0;
#ifdef WEFT_SIM
  if (weft__simulated(rt)) {
    struct sockaddr_storage in;
    struct sockaddr_un un;
    unsigned unlen;
    memset(&in, 0, sizeof(in));
    memcpy(&in, addr, alen);
    int r = weft__sim_udp_name(rt, &in, &un, &unlen, true);
    if (r)
      return r;
    if (bind(fd, (struct sockaddr *)&un, unlen) < 0)
      return -errno;
    *sim_port = ntohs(in.ss_family == AF_INET
                          ? ((struct sockaddr_in *)&in)->sin_port
                          : ((struct sockaddr_in6 *)&in)->sin6_port);
    return 0;
  }
#else
  (void)rt;
#endif
  return bind(fd, addr, alen) < 0 ? -errno : 0;
}

int weft_udp_open(weft_rt *rt, weft_strand *s, const struct sockaddr *addr,
                  unsigned addrlen, const weft_udp_opts *o, weft_udp **out) {
  int r = open_check(rt, s, addr, addrlen, o, out);
  if (r)
    return r;
  int family = addr->sa_family;
  int domain = weft__simulated(rt) ? AF_UNIX : family; /* bind_addr */
  int fd =
      socket(domain, SOCK_DGRAM | SOCK_CLOEXEC | weft__io_sock_flags(rt), 0);
  if (fd < 0)
    return -errno;
  uint16_t sim_port;
  if ((r = socket_setup(fd, o ? o->flags : 0)) ||
      (r = bind_addr(rt, fd, addr, (socklen_t)family_len(family), &sim_port))) {
    close(fd);
    return r;
  }
  unsigned home = weft__sock_home(rt);
  struct weft__sock *sk;
  r = weft__sock_new(&sk, rt, SK_UDP, fd, s, udp_done);
  if (r) {
    close(fd);
    return r;
  }
  struct udp *u = (struct udp *)sk;
  if ((r = udp_alloc(u, o))) {
    weft__sock_discard(sk);
    return r;
  }
  u->s.state = ST_OPEN;
  u->family = family;
#ifdef WEFT_SIM
  u->sim_port = sim_port;
#else
  (void)sim_port;
#endif
  u->writable = true;
  u->readable = true; /* a first recvmmsg tells */
  r = weft__sock_register(&u->s, home, true, 0);
  if (r) {
    udp_free_bufs(u);
    weft__sock_discard(sk);
    return r;
  }
  *out = (weft_udp *)u;
  return 0;
}

int weft_udp_recv_start(weft_udp *wu, weft_udp_recv_fn fn, void *arg) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_recv_start");
  if (r)
    return r;
  if (!fn)
    return -EINVAL;
  u->rfn = fn;
  u->rarg = arg;
  if (!u->receiving) {
    u->receiving = true;
    weft__sock_kick(&u->s);
  }
  return 0;
}

int weft_udp_recv_stop(weft_udp *wu) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_recv_stop");
  if (r && r != -EBADF)
    return r;
  u->receiving = false;
  return 0;
}

static int send_check(const struct udp *u, size_t len,
                      const struct sockaddr *to, unsigned tolen) {
  int family = u->family;
  if (len > (family == AF_INET6 ? 65527u : 65507u))
    return -EMSGSIZE;
  if (!to)
    return 0;
  if (tolen < sizeof(sa_family_t) || tolen > sizeof(struct sockaddr_storage))
    return -EINVAL;
  if (to->sa_family != family)
    return -EAFNOSUPPORT;
  return (int)tolen >= family_len(family) ? 0 : -EINVAL;
}

int weft_udp_send(weft_udp *wu, const void *buf, size_t len,
                  const struct sockaddr *to, unsigned tolen,
                  weft_udp_send_fn fn, void *arg) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_send");
  if (r)
    return r;
  if (!buf && len)
    return -EINVAL;
  if ((r = send_check(u, len, to, tolen)))
    return r;
  if (!to && !u->connected)
    return -EDESTADDRREQ;
  size_t at;
  if (queued(u) == QUEUE_ENTRIES || (at = arena_place(u, len)) == SIZE_MAX)
    return -ENOBUFS;
  struct sq_ent *e = &u->sq[u->tail % QUEUE_ENTRIES];
  e->off = (uint32_t)at;
  e->len = (uint32_t)len;
  e->tolen = to ? tolen : 0;
  if (to)
    memcpy(&e->to, to, tolen);
  e->fn = fn;
  e->arg = arg;
  if (len)
    memcpy(u->arena + at, buf, len);
  u->tail++;
  /* Sent at the end of this turn: by the run that is going on (a receive
   * callback's reply), or by a kick. */
  if (!u->in_run && !u->kicked) {
    u->kicked = true;
    weft__sock_kick(&u->s);
  }
  return 0;
}

int weft_udp_connect(weft_udp *wu, const struct sockaddr *addr,
                     unsigned addrlen) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_connect");
  if (r)
    return r;
  struct sockaddr unspec = {.sa_family = AF_UNSPEC};
  if (!addr) {
    addr = &unspec;
    addrlen = sizeof(unspec);
  } else if ((r = send_check(u, 0, addr, addrlen))) {
    return r;
  }
#ifdef WEFT_SIM
  if (weft__simulated(
          weft__sock_rt(&u->s))) { /* remembered: sim_flush, deliver */
    memset(&u->sim_peer, 0, sizeof(u->sim_peer));
    if (addr != &unspec)
      memcpy(&u->sim_peer, addr, (size_t)family_len(u->family));
    u->connected = addr != &unspec;
    return 0;
  }
#endif
  if (connect(u->s.fd, addr, addrlen) < 0)
    return -errno;
  u->connected = addr != &unspec;
  return 0;
}

int weft_udp_membership(weft_udp *wu, const struct sockaddr *group,
                        unsigned grouplen, unsigned ifindex, int join) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_membership");
  if (r)
    return r;
  if (!group || (r = send_check(u, 0, group, grouplen)))
    return r ? r : -EINVAL;
  if (weft__simulated(weft__sock_rt(&u->s)))
    return -ENOTSUP; /* one simulated host: no groups */
  if (group->sa_family == AF_INET) {
    struct ip_mreqn m = {.imr_ifindex = (int)ifindex};
    m.imr_multiaddr = ((const struct sockaddr_in *)group)->sin_addr;
    r = setsockopt(u->s.fd, IPPROTO_IP,
                   join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m,
                   sizeof(m));
  } else {
    struct ipv6_mreq m = {.ipv6mr_interface = ifindex};
    m.ipv6mr_multiaddr = ((const struct sockaddr_in6 *)group)->sin6_addr;
    r = setsockopt(u->s.fd, IPPROTO_IPV6,
                   join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &m, sizeof(m));
  }
  return r < 0 ? -errno : 0;
}

int weft_udp_set_data(weft_udp *wu, void *data, weft_udp_close_fn on_close) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_set_data");
  if (r && r != -EBADF)
    return r;
  u->data = data;
  u->clfn = on_close;
  return 0;
}

void *weft_udp_data(const weft_udp *wu) {
  const struct udp *u = udp_of(wu);
  return u && u->s.kind == SK_UDP ? u->data : NULL;
}

weft_strand *weft_udp_strand(const weft_udp *wu) {
  const struct udp *u = udp_of(wu);
  return u && u->s.kind == SK_UDP ? u->s.strand : NULL;
}

int weft_udp_local_addr(weft_udp *wu, struct sockaddr *addr,
                        unsigned *addrlen) {
  struct udp *u = udp_of(wu);
  int r = usable(u, "weft_udp_local_addr");
  if (r)
    return r;
  if (!addr || !addrlen)
    return -EINVAL;
#ifdef WEFT_SIM
  if (weft__simulated(weft__sock_rt(&u->s))) {
    weft__sim_host_addr(u->family, u->sim_port, addr, addrlen);
    return 0;
  }
#endif
  socklen_t len = *addrlen;
  if (getsockname(u->s.fd, addr, &len) < 0)
    return -errno;
  *addrlen = len;
  return 0;
}

int weft_udp_close(weft_udp *wu) {
  struct udp *u = udp_of(wu);
  if (!u || u->s.kind != SK_UDP)
    return -EINVAL;
  weft_rt *rt = weft__sock_rt(&u->s);
  if (weft__forked(rt))
    return -ECHILD;
  bool foreign = weft_rt_current() != rt;
  if (foreign) {
    int r = weft__busy_enter(rt);
    if (r)
      return r; /* shutting down: the shutdown closes u */
  }
  /* Before the claim, which a shutdown's close reads (acquire) before it
   * frees u: so this reads u's life, never a later one. */
  uint32_t gen = weft__sock_gen(&u->s);
  uint32_t none = 0;
  int r = weft__cas(&u->close_req, &none, 1, WA_REL, WA_RLX) ? 0 : -EALREADY;
  if (!r)
    weft__sock_notify(rt, &u->s, EV_CLOSE, gen);
  if (foreign)
    weft__busy_drop(rt, 1);
  return r;
}

/* ---- the runtime's side ----------------------------------------------------
 */

void weft__udp_init(weft_rt *rt) {
  weft__pool_init(&rt->net.udp_pool, sizeof(struct udp));
}

void weft__udp_destroy(weft_rt *rt) { weft__pool_destroy(&rt->net.udp_pool); }
