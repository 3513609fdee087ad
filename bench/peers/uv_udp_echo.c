/*
 * uv_udp_echo.c - a UDP echo server on libuv: the peer of weft's
 * examples/udp_echo in bench/udp_echo.
 *
 * One loop, one socket (as weft's example: one socket, one worker).
 * Receives in batches (UV_UDP_RECVMMSG: libuv reads with recvmmsg into
 * 64 KiB slices of the buffer the alloc callback gives, here 16 of them)
 * and answers each datagram with uv_udp_try_send, the fastest way libuv
 * offers; only when the socket buffer is full does it copy the datagram
 * into a uv_udp_send request.
 *
 * Usage: uv_udp_echo [--port P]  (port 0: pick one)
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit status 0).
 */
#include <uv.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLICE (64 * 1024)
#define SLICES 16

static char g_buf[SLICE * SLICES];
static uv_udp_t g_udp;
static uv_signal_t g_sigint, g_sigterm;

typedef struct sreq {
  uv_udp_send_t req;
  char data[];
} sreq;

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  *buf = uv_buf_init(g_buf, sizeof(g_buf));
}

static void on_sent(uv_udp_send_t *req, int status) {
  (void)status;
  free(req);
}

static void on_recv(uv_udp_t *u, ssize_t n, const uv_buf_t *buf,
                    const struct sockaddr *from, unsigned flags) {
  if (n < 0 || !from)
    return; /* an error, or the end of a batch (n == 0, from NULL) */
  if (flags & UV_UDP_MMSG_FREE)
    return;
  uv_buf_t b = uv_buf_init(buf->base, (unsigned)n);
  if (uv_udp_try_send(u, &b, 1, from) == n)
    return;
  sreq *r = malloc(sizeof(*r) + (size_t)n);
  if (!r)
    return;
  memcpy(r->data, buf->base, (size_t)n);
  b = uv_buf_init(r->data, (unsigned)n);
  if (uv_udp_send(&r->req, u, &b, 1, from, on_sent) < 0)
    free(r);
}

static void on_signal(uv_signal_t *s, int signo) {
  (void)signo;
  (void)s;
  uv_udp_recv_stop(&g_udp);
  uv_close((uv_handle_t *)&g_udp, NULL);
  uv_close((uv_handle_t *)&g_sigint, NULL);
  uv_close((uv_handle_t *)&g_sigterm, NULL);
}

int main(int argc, char **argv) {
  int port = 0;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && !strcmp(argv[i], "--port")) {
      port = atoi(argv[i + 1]);
    } else {
      fprintf(stderr, "usage: uv_udp_echo [--port P]\n");
      return 2;
    }
  }
  uv_loop_t *loop = uv_default_loop();
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", port, &a);
  int r = uv_udp_init_ex(loop, &g_udp, AF_INET | UV_UDP_RECVMMSG);
  if (!r)
    r = uv_udp_bind(&g_udp, (const struct sockaddr *)&a, 0);
  if (!r)
    r = uv_udp_recv_start(&g_udp, on_alloc, on_recv);
  if (r) {
    fprintf(stderr, "uv_udp_echo: %s\n", uv_strerror(r));
    return 1;
  }
  uv_signal_init(loop, &g_sigint);
  uv_signal_init(loop, &g_sigterm);
  uv_signal_start(&g_sigint, on_signal, SIGINT);
  uv_signal_start(&g_sigterm, on_signal, SIGTERM);
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  uv_udp_getsockname(&g_udp, (struct sockaddr *)&ss, &len);
  printf("listening on %u\n", ntohs(((struct sockaddr_in *)&ss)->sin_port));
  fflush(stdout);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 0;
}
