/*
 * tcp_opt.c - what a connection tells and what can be set on it: socket
 * options (nodelay, keepalive), its strand, its local and peer addresses.
 * Owns nothing: every call reads or sets the descriptor of a connection
 * (tcp.h), on its strand like every other operation on a connection.
 */
#include "tcp.h"

#include "rt.h"
#include "sim.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int sockopt(weft_tcp *c, int level, int name, int val) {
  struct weft__sock *s = c ? &weft__conn_of(c)->s : NULL;
  if (!s || s->kind != SK_CONN)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(s)))
    return -ECHILD;
  if (!weft__sock_on_strand(s))
    return weft__tcp_off_strand(weft__conn_of(c), "weft_tcp option");
  if (s->fd < 0)
    return -EBADF;
#ifdef WEFT_SIM
  if (weft__conn_of(c)->sim_family)
    return 0; /* TCP's options, on a Unix socket underneath (sim.h) */
#endif
  if (setsockopt(s->fd, level, name, &val, sizeof(val)) < 0)
    return -errno;
  return 0;
}

int weft_tcp_nodelay(weft_tcp *c, int on) {
  return sockopt(c, IPPROTO_TCP, TCP_NODELAY, on != 0);
}

int weft_tcp_keepalive(weft_tcp *c, int on, unsigned idle_s) {
  if (on && (idle_s < 1 || idle_s > 32767))
    return -EINVAL;
  int r = sockopt(c, SOL_SOCKET, SO_KEEPALIVE, on != 0);
  if (!r && on)
    r = sockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, (int)idle_s);
  return r;
}

weft_strand *weft_tcp_strand(const weft_tcp *c) {
  return c ? weft__conn_of(c)->s.strand : NULL;
}

static int addr_of(weft_tcp *c, struct sockaddr *addr, unsigned *addrlen,
                   bool peer) {
  struct weft__sock *s = c ? &weft__conn_of(c)->s : NULL;
  if (!s || !addr || !addrlen || s->kind != SK_CONN)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(s)))
    return -ECHILD;
  if (!weft__sock_on_strand(s))
    return weft__tcp_off_strand(weft__conn_of(c), peer ? "weft_tcp_peer_addr"
                                                       : "weft_tcp_local_addr");
  if (s->fd < 0)
    return -EBADF;
#ifdef WEFT_SIM
  struct weft__conn *sc = weft__conn_of(c);
  if (sc->sim_family) {
    weft__sim_host_addr(sc->sim_family, peer ? sc->sim_pport : sc->sim_lport,
                        addr, addrlen);
    return 0;
  }
#endif
  socklen_t len = *addrlen;
  int r =
      peer ? getpeername(s->fd, addr, &len) : getsockname(s->fd, addr, &len);
  if (r < 0)
    return -errno;
  *addrlen = len;
  return 0;
}

int weft_tcp_local_addr(weft_tcp *c, struct sockaddr *addr, unsigned *addrlen) {
  return addr_of(c, addr, addrlen, false);
}

int weft_tcp_peer_addr(weft_tcp *c, struct sockaddr *addr, unsigned *addrlen) {
  return addr_of(c, addr, addrlen, true);
}
