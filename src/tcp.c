/*
 * tcp.c - TCP connections (tcp.h): creation, the strand handler's state
 * machine, connect with a timeout, half-close, close, and the public
 * calls. Owns struct weft__conn but its receive state (tcp_recv.c) and
 * its writes (tcp_send.c), and the connection, send and write-state
 * pools.
 *
 * A connection needs no lock: operations are started on its strand and
 * completions delivered to it. With io_uring, at most one receive and one
 * send of a connection are in the kernel at a time, and it is freed only
 * after both have completed, so the kernel is done with every buffer
 * before any callback says so. Closing with operations in the kernel shuts
 * the socket down (shutdown(2) wakes every waiter on it, whichever ring it
 * was submitted to), waits for their completions, then closes the
 * descriptor. Descriptors are what the backend serves (io.h,
 * weft__io_sock_flags); synchronous calls pass MSG_DONTWAIT.
 */
#include "tcp.h"

#include "listen.h"
#include "rt.h"
#include "sim.h"
#include "shard.h"
#include "tcp_recv.h"
#include "tcp_send.h"
#include "tcp_timeout.h"
#include "tcp_until.h"
#include "thread.h"
#include "unix.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* An idle connection's memory is mostly this (tcp.h). A simulation's
 * (sim.h) has the family and ports of its TCP addresses too: a fourth
 * line there. */
#ifdef WEFT_SIM
_Static_assert(sizeof(struct weft__conn) <= 4 * WEFT_CACHELINE,
               "a simulation's connection is four cache lines at most");
#else
_Static_assert(sizeof(struct weft__conn) <= 3 * WEFT_CACHELINE,
               "a connection is three cache lines at most");
#endif

#define READ_MAX ((size_t)1 << 30)

/* close_req (tcp.h) */
#define CLOSE_USER 1u
#define CLOSE_SELF 2u
#define CLOSE_ABORT 4u /* with CLOSE_USER */

/* The reaper: an operation of c completed. */
static void conn_done(struct weft__ioh *h, struct weft__shard *local,
                      unsigned op, const struct weft__cqe *cqe) {
  struct weft__conn *c = (struct weft__conn *)weft__sock_of(h);
  uint64_t bits;
  switch (op) {
  case WEFT_OP_RECVM:
    weft__recv_multishot_done(local, c, cqe);
    return;
  case WEFT_OP_SEND:
  case WEFT_OP_POLL: /* for room, before a sendfile (tcp_send.c) */
    c->wres = cqe->res;
    bits = EV_WDONE;
    break;
  case WEFT_OP_CONNECT:
    c->rres = cqe->res;
    bits = EV_CDONE;
    break;
  default: /* WEFT_OP_RECV */
    c->rres = cqe->res;
    bits = EV_RDONE;
    break;
  }
  weft__sock_signal(local, &c->s, bits, WEFT_GEN_ANY);
}

/* 0, -ENOMEM or -ESHUTDOWN (weft__sock_new); fd is left open on error. */
static int conn_new(struct weft__conn **out, weft_rt *rt, int fd,
                    weft_strand *strand) {
  struct weft__sock *s;
  int r = weft__sock_new(&s, rt, SK_CONN, fd, strand, conn_done);
  if (r)
    return r;
  *out = (struct weft__conn *)s;
  return 0;
}

/* ---- connecting ------------------------------------------------------------
 */

static void close_begin(struct weft__conn *c);

static void connect_done(struct weft__conn *c, int status) {
  struct weft__connect *cn = c->cn;
  c->cn = NULL;
  if (cn->timer)
    weft_timer_destroy(cn->timer);
  /* Timed out: weft shut the socket down, so a connect that completed
   * meanwhile (its completion handled after the timer's firing) is not
   * usable either. A close begun meanwhile is never undone. */
  if (cn->timed_out)
    status = -ETIMEDOUT;
  else if (status == 0 && c->s.state != ST_CONNECTING)
    status = -ECANCELED;
  if (status == 0) {
    c->s.state = ST_OPEN;
    c->writable = true;
  }
  weft_connect_fn fn = cn->fn;
  void *arg = cn->arg;
  free(cn);
  weft__calling((void *)fn);
  fn(arg, (weft_tcp *)c, status);
  if (status != 0)
    weft__tcp_close_self(c); /* a failed connection closes itself */
}

static void connect_timeout(void *arg, int status, uint64_t missed) {
  struct weft__conn *c = arg;
  (void)missed;
  if (status || c->s.state != ST_CONNECTING || !c->cn)
    return;
  c->cn->timed_out = true;
  if (c->rd_inflight)
    shutdown(c->s.fd, SHUT_RDWR); /* aborts the connect in the kernel */
  else
    connect_done(c, -ETIMEDOUT);
}

static void connect_start(struct weft__conn *c) {
  struct weft__connect *cn = c->cn;
  if (cn->timeout_ns) {
    int r = weft_timer_create(weft__sock_rt(&c->s), c->s.strand, &cn->timer);
    if (!r)
      r = weft_timer_start(cn->timer, cn->timeout_ns, 0, connect_timeout, c);
    if (r) { /* -ESHUTDOWN: a shutdown began since the connect was asked */
      connect_done(c, r == -ESHUTDOWN ? -ECANCELED : r);
      return;
    }
  }
  const struct sockaddr *addr = (const struct sockaddr *)&cn->addr;
  if (cn->addr.ss_family == AF_UNIX) {
    connect_done(c, weft__sim_fault(weft__sock_rt(&c->s), WEFT_SIM_FAULT_REFUSE)
                        ? -ECONNREFUSED
                        : weft__unix_connect(c->s.fd, addr, cn->addrlen));
    return;
  }
  if (weft__io_completes(weft__sock_rt(&c->s))) {
    struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
    c->rd_inflight =
        weft__io_connect(sh, c->s.fd, addr, cn->addrlen, &c->s.ioh) == 0;
    weft__local_end(sh);
    if (!c->rd_inflight)
      weft__sock_raise(&c->s, EV_CONNECT); /* try again shortly */
    return;
  }
  int r;
  do
    r = connect(c->s.fd, addr, cn->addrlen);
  while (r < 0 && errno == EINTR);
  if (r == 0)
    connect_done(c, 0);
  else if (errno != EINPROGRESS)
    connect_done(c, -errno);
  /* else: EV_OUT says it finished (weft__conn_run) */
}

/* Readiness: an output event while connecting. Events can predate
 * connect() (a new socket polls as hung up), so only a peer address or a
 * pending error ends the wait. */
static void connect_check(struct weft__conn *c) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(c->s.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (err) {
    connect_done(c, -err);
    return;
  }
  struct sockaddr_storage peer;
  len = sizeof(peer);
  if (getpeername(c->s.fd, (struct sockaddr *)&peer, &len) == 0)
    connect_done(c, 0);
}

/* ---- closing ------------------------------------------------------------- */

static void close_finish(struct weft__conn *c) {
  if (c->s.state != ST_CLOSING || weft__recv_busy(c) || c->wr_inflight)
    return;
  weft__recv_release(c);
  weft__sock_close_fd(&c->s);
  c->s.state = ST_CLOSED;
}

/* A weft_tcp_close that came first ends the wait in weft__conn_run with its
 * EV_CLOSE. The kick runs weft__conn_run to the close callback when this is
 * called from outside it (a timer's handler). */
void weft__tcp_close_self(struct weft__conn *c) {
  uint32_t none = 0;
  weft__cas(&c->close_req, &none, CLOSE_SELF, WA_RLX, WA_RLX);
  close_begin(c);
  weft__sock_kick(&c->s);
}

static void close_begin(struct weft__conn *c) {
  if (c->s.state >= ST_CLOSING)
    return;
  bool connecting = c->s.state == ST_CONNECTING; /* cn is the request */
  c->s.state = ST_CLOSING;
  /* Abortive as asked, whichever step begins the close (a shutdown's may
   * come before the user's EV_CLOSE). */
  if (weft__load(&c->close_req, WA_RLX) & CLOSE_ABORT) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c->s.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  /* shutdown(2) wakes every operation on the socket in every ring: each
   * completes. A multishot receive alone, in this thread's ring, is
   * cancelled there instead, which costs no system call of its own. An
   * abortive close disconnects instead (connect(2) to AF_UNSPEC): that
   * sends the RST at once and wakes every waiter too, where shutdown's
   * FIN would reach the peer first and read as an orderly end. A Unix
   * socket refuses it (EINVAL): shut down. */
  weft__recv_closing(c);
  if (c->wr_inflight || c->rd_inflight ||
      (c->rd_multi && !weft__recv_cancel_local(c))) {
    struct sockaddr unspec = {.sa_family = AF_UNSPEC};
    if (!(weft__load(&c->close_req, WA_RLX) & CLOSE_ABORT) ||
        connect(c->s.fd, &unspec, sizeof(unspec)) != 0)
      shutdown(c->s.fd, SHUT_RDWR);
  }
  if (connecting && c->cn && !c->rd_inflight)
    connect_done(c, -ECANCELED);
  weft__recv_cancel(c);
  weft__until_cancel(c, weft__tcp_close_status(c));
}

/* ---- the strand handler ----------------------------------------------------
 */

static void accepted_run(struct weft__conn *c) {
  struct weft_listener *l = c->lst;
  c->lst = NULL;
  if (weft__load(&weft__sock_rt(&c->s)->life.closing, WA_ACQ)) {
    /* Shutting down: the user never sees it. */
    c->s.state = ST_CLOSING;
    close_finish(c);
    weft__sock_free(&c->s);
    weft__listener_delivered(l);
    return;
  }
  c->s.state = ST_OPEN;
  weft__listener_deliver(l, (weft_tcp *)c);
}

/* The close callback, then c's end. */
static void close_run(void *arg) {
  struct weft__conn *c = arg;
  if (c->clfn) {
    weft__calling((void *)c->clfn);
    c->clfn(c->data, (weft_tcp *)c);
  }
  /* After the callback, which may still set the watermarks. The write
   * state is back in its pool already: the handler that closed c failed
   * its queue and ran the callbacks (weft__send_flush), the send buffer
   * went back when the last send completed (nothing of c is in the kernel
   * once it is closed), and no write is taken since. */
  free(c->more);
  c->more = NULL;
  weft__sock_free(&c->s);
}

/* Closed: the close callback goes to the back of the strand's queue, so
 * that it also follows every handler posted to the strand before the
 * connection finished closing (the user's, which may use what the
 * callback frees), not only the connection's own callbacks. Its cancel
 * is itself: it runs at a CANCEL shutdown too. Without memory for a node
 * it runs here. */
static void post_close(struct weft__conn *c) {
  weft__tmo_free(c);
  weft__until_free(c);
  weft__fdq_free(c);
  c->close_posted = true;
  weft_rt *rt = weft__sock_rt(&c->s);
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__node *n = weft__node_new(rt, sh, close_run, close_run, c);
  if (n)
    weft__node_post(rt, sh, c->s.strand, n, false);
  weft__local_end(sh);
  if (!n)
    close_run(c);
}

void weft__conn_run(struct weft__sock *sk, uint32_t bits) {
  struct weft__conn *c = (struct weft__conn *)sk;
  if (bits & EV_ACCEPTED) {
    accepted_run(c);
    if (c->s.state == ST_DONE)
      return;
  }
  if (bits & EV_CONNECT && c->s.state == ST_CONNECTING)
    connect_start(c);
  if (bits & EV_CDONE) {
    c->rd_inflight = false;
    /* cn is set: a connect in the kernel is answered only here */
    bool cancelled = c->s.state == ST_CLOSING && !c->cn->timed_out;
    connect_done(c, cancelled ? -ECANCELED : c->rres);
  }
  if (bits & EV_RDONE)
    weft__recv_completed(c);
  if (bits & EV_RMEND)
    weft__recv_ended(c);
  if (bits & EV_WDONE)
    weft__send_completed(c);
  if (bits & EV_IN)
    c->readable = true;
  if (bits & EV_HUP)
    c->hup = true;
  if (bits & EV_PRI)
    c->short_empty = false;
  if (bits & EV_OUT) {
    c->writable = true;
    if (c->s.state == ST_CONNECTING && c->cn && !c->rd_inflight)
      connect_check(c);
  }
  if (bits & EV_CLOSE) {
    c->user_closed = true;
    close_begin(c);
  }
  if (bits & EV_SHUTDOWN && c->s.state < ST_CLOSING)
    weft__tcp_close_self(c);
  if (c->s.state == ST_OPEN) {
    weft__recv_run(c);
    weft__send_pump(c);
  }
  if (c->s.state == ST_CLOSING) {
    if (!c->wr_inflight)
      weft__send_fail(c, weft__tcp_close_status(c));
    close_finish(c);
  }
  weft__send_flush(c);
  if (c->s.state == ST_CLOSED && !c->close_posted &&
      (c->user_closed || weft__load(&c->close_req, WA_RLX) == CLOSE_SELF))
    post_close(c);
}

/* ---- accepted connections (from listen.c) ----------------------------------
 */

#ifdef WEFT_SIM
/* A connect to a TCP address in a simulation: to the Unix name of its
 * port on the simulated host instead (sim.h), which *addr then points to
 * (in st). */
struct sim_tcp {
  struct sockaddr_un un;
  int family;
  uint16_t port;
};

static int sim_tcp_name(weft_rt *rt, const struct sockaddr **addr,
                        unsigned *addrlen, struct sim_tcp *st) {
  struct sockaddr_storage tcp;
  memset(&tcp, 0, sizeof(tcp));
  memcpy(&tcp, *addr, *addrlen);
  unsigned len;
  int r = weft__sim_tcp_name(rt, &tcp, &st->un, &len, false);
  if (r)
    return r;
  st->family = tcp.ss_family;
  st->port = ntohs(tcp.ss_family == AF_INET
                       ? ((struct sockaddr_in *)&tcp)->sin_port
                       : ((struct sockaddr_in6 *)&tcp)->sin6_port);
  *addr = (const struct sockaddr *)&st->un;
  *addrlen = len;
  return 0;
}

/* An accepted connection of a listener on a simulated TCP port: its
 * addresses read as TCP ones, the peer's port from its client name. */
static void sim_accepted(struct weft__conn *c, struct weft_listener *l) {
  int family;
  uint16_t port;
  if (!weft__listener_sim_port(l, &family, &port))
    return;
  struct sockaddr_un un;
  socklen_t len = sizeof(un);
  c->sim_family = (uint8_t)family;
  c->sim_lport = port;
  if (getpeername(c->s.fd, (struct sockaddr *)&un, &len) == 0)
    c->sim_pport = weft__sim_port_of(&un, len);
}
#endif

/* A simulation's WEFT_SIM_FAULT_SMALLBUF for new connection fd, if one
 * strikes (sim.h); nothing outside the weft_sim library. */
static void sim_smallbuf(weft_rt *rt, int fd) {
  if (!weft__sim_fault(rt, WEFT_SIM_FAULT_SMALLBUF))
    return;
  int one = 1; /* the kernel raises it to its least */
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &one, sizeof(one));
}

void weft__tcp_accepted(weft_rt *rt, struct weft_listener *l, int fd) {
  sim_smallbuf(rt, fd);
  unsigned home = weft__sock_home(rt);
  struct weft__conn *c;
  if (conn_new(&c, rt, fd, NULL)) {
    close(fd);
    return;
  }
  c->s.state = ST_NEW;
  c->writable = true;
  c->readable = false; /* the watch reports data already there (tcp.h) */
  c->short_empty = weft__listener_family(l) != AF_UNIX;
  c->lst = l;
#ifdef WEFT_SIM
  sim_accepted(c, l);
#endif
  weft__listener_hold(l);
  if (weft__sock_register(&c->s, home, true, EV_ACCEPTED) < 0) {
    weft__sock_discard(&c->s);
    weft__listener_delivered(l);
  }
}

/* ---- the API ---------------------------------------------------------------
 */

int weft__tcp_on_strand(const struct weft__conn *c, const char *what) {
  if (!c || c->s.kind != SK_CONN)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(&c->s)))
    return -ECHILD;
  if (!weft__sock_on_strand(&c->s))
    return weft__tcp_off_strand(c, what);
  return 0;
}

int weft__tcp_usable(const struct weft__conn *c, const char *what) {
  int r = weft__tcp_on_strand(c, what);
  if (r)
    return r;
  if (weft__load(&c->close_req, WA_RLX))
    return -EBADF;
  switch (c->s.state) {
  case ST_NEW:
  case ST_CONNECTING:
    return -ENOTCONN;
  case ST_OPEN:
    return weft__load(&weft__sock_rt(&c->s)->life.closing, WA_RLX) ? -ESHUTDOWN
                                                                   : 0;
  default:
    return weft__load(&weft__sock_rt(&c->s)->life.closing, WA_RLX) ? -ESHUTDOWN
                                                                   : -EBADF;
  }
}

int weft_tcp_read(weft_tcp *tcp, void *buf, size_t len, weft_read_fn fn,
                  void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_read");
  if (r)
    return r;
  if (!buf || !fn || !len)
    return -EINVAL;
  if (c->reading || weft__until_pending(c))
    return -EBUSY;
  c->reading = true;
  c->rbuf = buf;
  c->rlen = (uint32_t)(len < READ_MAX ? len : READ_MAX);
  c->rfn = fn;
  c->rarg = arg;
  if (weft__tcp_tmo(c))
    weft__tmo_read_started(c);
  weft__recv_start(c);
  return 0;
}

int weft_tcp_shutdown(weft_tcp *tcp) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_shutdown");
  if (r)
    return r;
  if (c->shut_req)
    return -EALREADY;
  c->shut_req = true;
  weft__send_pump(c);
  return 0;
}

int weft_tcp_close(weft_tcp *tcp, int abortive) {
  struct weft__conn *c = weft__conn_of(tcp);
  if (!c || c->s.kind != SK_CONN)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(&c->s)))
    return -ECHILD;
  weft_rt *rt = weft__sock_rt(&c->s);
  bool foreign = weft_rt_current() != rt;
  if (foreign) {
    int r = weft__busy_enter(rt);
    if (r)
      return r; /* shutting down: the shutdown closes c */
  }
  /* c is open while the caller may call this; a claim keeps it so (the
   * close callback waits for EV_CLOSE), but the life read here needs no
   * such argument */
  uint32_t gen = weft__sock_gen(&c->s);
  uint32_t none = 0;
  if (!weft__cas(&c->close_req, &none,
                 CLOSE_USER | (abortive ? CLOSE_ABORT : 0), WA_RLX, WA_RLX)) {
    if (foreign)
      weft__busy_drop(rt, 1);
    return -EALREADY;
  }
  weft__sock_notify(rt, &c->s, EV_CLOSE, gen); /* release: close_req too */
  if (foreign)
    weft__busy_drop(rt, 1);
  return 0;
}

int weft_tcp_set_data(weft_tcp *tcp, void *data, weft_close_fn on_close) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_on_strand(c, "weft_tcp_set_data");
  if (r)
    return r;
  c->data = data;
  c->clfn = on_close;
  return 0;
}

void *weft_tcp_data(const weft_tcp *tcp) {
  const struct weft__conn *c = weft__conn_of(tcp);
  return c && c->s.kind == SK_CONN ? c->data : NULL;
}

int weft__tcp_off_strand(const struct weft__conn *c, const char *what) {
  weft__log(weft__sock_rt(&c->s), WEFT_LOG_DEBUG,
            "%s(%p): not called on the connection's strand (%p): call it "
            "from one of the connection's callbacks, or post to "
            "weft_tcp_strand(conn)",
            what, (void *)c, (void *)c->s.strand);
  return -EPERM;
}

static int check_addr(const struct sockaddr *addr, unsigned addrlen) {
  if (!addr || addrlen < sizeof(sa_family_t))
    return -EINVAL;
  if (addr->sa_family == AF_INET)
    return addrlen >= sizeof(struct sockaddr_in) ? 0 : -EINVAL;
  if (addr->sa_family == AF_INET6)
    return addrlen >= sizeof(struct sockaddr_in6) ? 0 : -EINVAL;
  if (addr->sa_family == AF_UNIX) /* the family alone: an autobound name */
    return addrlen <= sizeof(struct sockaddr_un) ? 0 : -EINVAL;
  return -EAFNOSUPPORT;
}

int weft__tcp_socket(weft_rt *rt, int family) {
  int flags = SOCK_STREAM | SOCK_CLOEXEC | weft__io_sock_flags(rt);
  int fd = socket(family, flags, family == AF_UNIX ? 0 : IPPROTO_TCP);
  return fd < 0 ? -errno : fd;
}

int weft__tcp_check(weft_rt *rt, const struct sockaddr *addr,
                    unsigned addrlen) {
  if (!rt)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  int r = check_addr(addr, addrlen);
  return r ? r : weft__tcp_check_rt(rt);
}

int weft__tcp_check_rt(weft_rt *rt) {
  if (rt->io.backend == WEFT_BACKEND_NONE)
    return -ENOTSUP;
  if (weft__load(&rt->life.closing, WA_ACQ))
    return -ESHUTDOWN;
  return weft__io_ensure(rt);
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
  if (strand && !weft__strand_live(strand))
    return -EBADF;
#ifdef WEFT_SIM
  struct sim_tcp st = {0};
  if (weft__simulated(rt) && addr->sa_family != AF_UNIX &&
      (r = sim_tcp_name(rt, &addr, &addrlen, &st)))
    return r;
#endif
  struct weft__connect *cn = calloc(1, sizeof(*cn));
  if (!cn)
    return -ENOMEM;
  int fd = weft__sim_fault(rt, WEFT_SIM_FAULT_EMFILE)
               ? -EMFILE
               : weft__tcp_socket(rt, addr->sa_family);
  if (fd < 0) {
    free(cn);
    return fd;
  }
  sim_smallbuf(rt, fd);
#ifdef WEFT_SIM
  int port = st.family ? weft__sim_tcp_bind_client(rt, fd) : 0;
  if (port < 0) {
    close(fd);
    free(cn);
    return port;
  }
#endif
  unsigned home = weft__sock_home(rt);
  struct weft__conn *c;
  r = conn_new(&c, rt, fd, strand);
  if (r) {
    close(fd);
    free(cn);
    return r;
  }
#ifdef WEFT_SIM
  c->sim_family = st.family;
  c->sim_lport = (uint16_t)port;
  c->sim_pport = st.port;
#endif
  memcpy(&cn->addr, addr, addrlen);
  cn->addrlen = addrlen;
  cn->timeout_ns = timeout_ns;
  cn->fn = fn;
  cn->arg = arg;
  c->cn = cn;
  c->short_empty = addr->sa_family != AF_UNIX;
  c->s.state = ST_CONNECTING;
  *out = (weft_tcp *)c; /* before: c may be closed and freed at once */
  r = weft__sock_register(&c->s, home, true, EV_CONNECT);
  if (r) {
    *out = NULL;
    c->cn = NULL;
    free(cn);
    weft__sock_discard(&c->s);
    return r;
  }
  return 0;
}

int weft__tcp_adopt(weft_rt *rt, weft_strand *s, int fd, weft_tcp **out) {
  unsigned home = weft__sock_home(rt);
  struct weft__conn *c;
  int r = conn_new(&c, rt, fd, s);
  if (r) {
    close(fd);
    return r;
  }
  c->s.state = ST_OPEN;
  c->writable = true;
  c->readable = false; /* the watch reports data already there (tcp.h) */
  r = weft__sock_register(&c->s, home, true, 0);
  if (r) {
    weft__sock_discard(&c->s); /* closes fd */
    return r;
  }
  *out = (weft_tcp *)c;
  return 0;
}

struct weft__tcp_more *weft__tcp_more(struct weft__conn *c) {
  if (!c->more)
    c->more = calloc(1, sizeof(*c->more));
  return c->more;
}

/* ---- the runtime's side ----------------------------------------------------
 */

void weft__tcp_init(weft_rt *rt) {
  weft__pool_init(&rt->net.conn_pool, sizeof(struct weft__conn));
  weft__pool_init(&rt->net.send_pool, sizeof(struct weft__sendbuf));
  weft__pool_init(&rt->net.wstate_pool, sizeof(struct weft__wstate));
}

void weft__tcp_destroy(weft_rt *rt) {
  weft__pool_destroy(&rt->net.conn_pool);
  weft__pool_destroy(&rt->net.send_pool);
  weft__pool_destroy(&rt->net.wstate_pool);
}
