/*
 * udp_echo - a UDP echo server on weft: every datagram comes back to its
 * sender.
 *
 *   udp_echo [--port P] [--threads N] [--host ADDR]
 *
 * One socket; weft reads datagrams in batches and hands each to on_recv
 * in its own buffer, and weft_udp_send copies the reply, so nothing here
 * allocates or keeps a buffer. Replies queued while a batch is handled
 * leave together at its end (sendmmsg).
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit 0).
 */
#include <weft.h>

#include <stdio.h>
#include <stdlib.h>

#include "netutil.h"

static void on_recv(void *arg, weft_udp *u, long n, const void *data,
                    const struct sockaddr *from, unsigned fromlen,
                    unsigned flags) {
  (void)arg;
  (void)flags; /* a truncated datagram comes back truncated */
  if (n >= 0)
    weft_udp_send(u, data, (size_t)n, from, fromlen, NULL, NULL);
}

/* On the socket's strand, once signals are watched: start receiving and
 * say where. */
static void start(void *arg) {
  weft_udp *u = arg;
  struct sockaddr_storage ss;
  unsigned len = sizeof(ss);
  if (weft_udp_recv_start(u, on_recv, NULL) < 0 ||
      weft_udp_local_addr(u, (struct sockaddr *)&ss, &len) < 0) {
    fprintf(stderr, "udp_echo: cannot start receiving\n");
    exit(1);
  }
  unsigned port = ss.ss_family == AF_INET6
                      ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                      : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  printf("listening on %u\n", port);
  fflush(stdout);
}

static void announce(void *arg) {
  weft_udp *u = arg;
  weft_post(weft_udp_strand(u), start, u);
}

static void usage(void) {
  fprintf(stderr, "usage: udp_echo [--port P] [--threads N] [--host ADDR]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || ex_common_opt(&o, argv[i], argv[i + 1]) != 1 ||
        o.unix_path)
      usage();
  }
  weft_rt *rt = ex_rt_create("udp_echo", &o);
  struct sockaddr_storage ss;
  unsigned len;
  weft_udp *u;
  int r = ex_resolve(o.host, o.port, &ss, &len);
  if (r == 0)
    r = weft_udp_open(rt, NULL, (struct sockaddr *)&ss, len, NULL, &u);
  if (r < 0) {
    fprintf(stderr, "udp_echo: %s:%u: %s\n", o.host, o.port, weft_strerror(r));
    weft_rt_destroy(rt);
    return 1;
  }
  /* The shutdown a signal starts closes u. */
  return ex_serve_with("udp_echo", rt, NULL, NULL, NULL, announce, u);
}
