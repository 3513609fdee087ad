/*
 * sim_host.c - the simulated host's addresses (sim.h): a simulated TCP or
 * UDP port is an abstract Unix socket name, "\0weft-sim-PID-SERIAL-KPORT",
 * so that simulated sockets are the kernel's Unix sockets; ephemeral ports
 * are picked as a kernel picks them, passing over those held. Owns no
 * state: the port sequence and the host's serial are sim.c's. In the
 * weft_sim build only (WEFT_SIM).
 */
#include "sim.h"

#ifdef WEFT_SIM

#include "rt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* "\0weft-sim-PID-SERIAL-KPORT": K is l (a listener), c (a TCP client)
 * or u (a UDP socket). */
static unsigned name_of(weft_rt *rt, char kind, unsigned port,
                        struct sockaddr_un *un) {
  memset(un, 0, sizeof(*un));
  un->sun_family = AF_UNIX;
  int n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1,
                   "weft-sim-%d-%u-%c%u", (int)getpid(), weft__sim_serial(rt),
                   kind, port);
  return (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Whether no socket of type holds name un: a probe binds it and lets it
 * go (an abstract name is free again at the close). Of the same type:
 * the kernel keeps each type's abstract names apart. Unsure: free, and
 * the caller's bind will tell. */
static bool name_free(const struct sockaddr_un *un, unsigned len, int type) {
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return true;
  bool ok =
      bind(fd, (const struct sockaddr *)un, len) == 0 || errno != EADDRINUSE;
  close(fd);
  return ok;
}

/* The next ephemeral port of kind that nobody holds, as a kernel's pick
 * passes over ports held, its name into un; 0 when every one is held. */
static uint16_t pick_port(weft_rt *rt, char kind, struct sockaddr_un *un,
                          unsigned *unlen) {
  for (unsigned tries = 0; tries < 65536 - WEFT_SIM_FIRST_PORT; tries++) {
    uint16_t port = weft__sim_next_port(rt);
    *unlen = name_of(rt, kind, port, un);
    if (name_free(un, *unlen, kind == 'u' ? SOCK_DGRAM : SOCK_STREAM))
      return port;
  }
  return 0;
}

/* The name of in's port, of kind; pick: a port 0 takes the next free one
 * (pick_port). */
static int port_name(weft_rt *rt, struct sockaddr_storage *in, char kind,
                     bool pick, struct sockaddr_un *un, unsigned *unlen) {
  in_port_t *pp;
  if (in->ss_family == AF_INET)
    pp = &((struct sockaddr_in *)in)->sin_port;
  else if (in->ss_family == AF_INET6)
    pp = &((struct sockaddr_in6 *)in)->sin6_port;
  else
    return -ENOTSUP;
  if (!pick || *pp) {
    *unlen = name_of(rt, kind, ntohs(*pp), un);
    return 0;
  }
  uint16_t port = pick_port(rt, kind, un, unlen);
  if (!port)
    return -EADDRINUSE; /* a bind's answer when every port is held */
  *pp = htons(port);
  return 0;
}

int weft__sim_tcp_name(weft_rt *rt, struct sockaddr_storage *tcp,
                       struct sockaddr_un *un, unsigned *unlen, bool listener) {
  return port_name(rt, tcp, 'l', listener, un, unlen);
}

int weft__sim_udp_name(weft_rt *rt, struct sockaddr_storage *udp,
                       struct sockaddr_un *un, unsigned *unlen, bool bind) {
  return port_name(rt, udp, 'u', bind, un, unlen);
}

int weft__sim_tcp_bind_client(weft_rt *rt, int fd) {
  struct sockaddr_un un;
  unsigned len;
  uint16_t port = pick_port(rt, 'c', &un, &len);
  if (!port)
    return -EADDRNOTAVAIL; /* a connect's answer when every port is held */
  if (bind(fd, (struct sockaddr *)&un, len) < 0)
    return -errno;
  return port;
}

uint16_t weft__sim_port_of(const struct sockaddr_un *un, unsigned len) {
  size_t off = offsetof(struct sockaddr_un, sun_path);
  if (len <= off + 1 || un->sun_path[0])
    return 0;
  const char *end = (const char *)un + len, *p = end;
  while (p > un->sun_path + 1 && p[-1] >= '0' && p[-1] <= '9')
    p--;
  unsigned v = 0;
  for (; p < end; p++)
    v = v * 10 + (unsigned)(*p - '0');
  return v <= 65535 ? (uint16_t)v : 0;
}

void weft__sim_host_addr(int family, uint16_t port, struct sockaddr *out,
                         unsigned *len) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  unsigned n;
  if (family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    a->sin6_addr = in6addr_loopback;
    n = sizeof(*a);
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    n = sizeof(*a);
  }
  memcpy(out, &ss, *len < n ? *len : n);
  *len = n;
}

#endif
