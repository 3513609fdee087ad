/*
 * udp_echo - datagrams per second and server CPU per datagram of a UDP
 * echo server: weft's (examples/udp_echo), libuv's and Asio's
 * (bench/peers), and a floor, in the same run.
 *
 *   udp_echo [--seconds S] [--rounds R] [--size B] [--window W]
 *            [--flows F]
 *
 * Each server runs as its own process with one thread serving one socket
 * on 127.0.0.1 (weft: --threads 1; its monitor thread also exists). The
 * floor is the same work with no runtime: one thread that waits in
 * poll(2), reads a batch with recvmmsg and answers it with one sendmmsg
 * (this program, run with --floor-server).
 *
 * The client (this program, one thread) keeps W datagrams of B bytes in
 * flight on each of F connected sockets (defaults 64, 16, 4): every
 * reply read sends one more, both in batches (recvmmsg, sendmmsg). A
 * socket that gets nothing for 20 ms has lost datagrams (loopback drops
 * what overflows a socket buffer): its window is sent again. Each server
 * is measured for S seconds (default 2) after 0.3 s of warm-up, R times
 * (default 5) in turn: the replies read, and the server's CPU time
 * (utime + stime of /proc/PID/stat) over the same span. Figures are the
 * medians over the rounds; ratios compare weft with the best peer and
 * with the floor. Last line: one JSON object.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#define BATCH 32
#define MAX_FLOWS 64
#define MAX_ROUNDS 64

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the floor server ---------------------------------------------------- */

static int floor_server(void) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) < 0)
    return 1;
  printf("listening on %u\n", ntohs(a.sin_port));
  fflush(stdout);
  static char buf[BATCH][2048];
  struct mmsghdr m[BATCH];
  struct iovec iov[BATCH];
  struct sockaddr_storage from[BATCH];
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, -1) < 0 && errno != EINTR)
      return 1;
    for (;;) {
      for (int i = 0; i < BATCH; i++) {
        iov[i].iov_base = buf[i];
        iov[i].iov_len = sizeof(buf[i]);
        memset(&m[i].msg_hdr, 0, sizeof(m[i].msg_hdr));
        m[i].msg_hdr.msg_iov = &iov[i];
        m[i].msg_hdr.msg_iovlen = 1;
        m[i].msg_hdr.msg_name = &from[i];
        m[i].msg_hdr.msg_namelen = sizeof(from[i]);
      }
      int n = recvmmsg(fd, m, BATCH, MSG_DONTWAIT, NULL);
      if (n <= 0)
        break;
      for (int i = 0; i < n; i++)
        iov[i].iov_len = m[i].msg_len;
      sendmmsg(fd, m, (unsigned)n, MSG_DONTWAIT);
    }
  }
}

/* ---- servers --------------------------------------------------------------
 */

typedef struct server {
  const char *name;
  char path[512];
  bool floor;
  pid_t pid;
  unsigned port;
  double pps[MAX_ROUNDS], cpu_us[MAX_ROUNDS];
} server;

static bool start_server(server *s, const char *self) {
  char *argv[8];
  int argc = 0;
  if (s->floor) {
    argv[argc++] = (char *)self;
    argv[argc++] = "--floor-server";
  } else {
    argv[argc++] = s->path;
    if (!strcmp(s->name, "weft")) {
      argv[argc++] = "--threads";
      argv[argc++] = "1";
    }
    argv[argc++] = "--port";
    argv[argc++] = "0";
  }
  argv[argc] = NULL;
  int fds[2];
  if (pipe(fds) < 0)
    return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  int r = posix_spawn(&s->pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  char line[128];
  size_t n = 0;
  while (!r && n < sizeof(line) - 1 && read(fds[0], line + n, 1) == 1 &&
         line[n] != '\n')
    n++;
  close(fds[0]);
  line[n] = 0;
  if (r || sscanf(line, "listening on %u", &s->port) != 1) {
    fprintf(stderr, "udp_echo: %s did not start\n", s->name);
    if (!r)
      kill(s->pid, SIGKILL);
    return false;
  }
  return true;
}

static void stop_server(server *s) {
  kill(s->pid, SIGTERM);
  int st;
  while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR)
    ;
}

/* utime + stime of pid, in seconds. */
static double cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the name may hold spaces */
  unsigned long ut = 0, st = 0;
  if (p)
    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
           &st);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- the client ---------------------------------------------------------- */

typedef struct flow {
  int fd;
  unsigned out; /* in flight */
  uint64_t last;
} flow;

static unsigned g_size = 64, g_window = 16, g_flows = 4;
static char g_payload[2048];

static void send_n(flow *f, unsigned n) {
  struct mmsghdr m[BATCH];
  struct iovec iov = {g_payload, g_size};
  while (n) {
    unsigned k = n < BATCH ? n : BATCH;
    for (unsigned i = 0; i < k; i++) {
      memset(&m[i].msg_hdr, 0, sizeof(m[i].msg_hdr));
      m[i].msg_hdr.msg_iov = &iov;
      m[i].msg_hdr.msg_iovlen = 1;
    }
    int r = sendmmsg(f->fd, m, k, MSG_DONTWAIT);
    if (r <= 0)
      return;
    f->out += (unsigned)r;
    n -= (unsigned)r;
  }
}

/* Runs the client against port for secs; returns replies read. */
static uint64_t drive(unsigned port, double secs, uint64_t warm_ns,
                      pid_t server_pid, double *cpu) {
  flow fl[MAX_FLOWS];
  struct pollfd pf[MAX_FLOWS];
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (unsigned i = 0; i < g_flows; i++) {
    fl[i].fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    connect(fl[i].fd, (struct sockaddr *)&a, sizeof(a));
    fl[i].out = 0;
    fl[i].last = now_ns();
    pf[i].fd = fl[i].fd;
    pf[i].events = POLLIN;
    send_n(&fl[i], g_window);
  }
  static char rbuf[BATCH][2048];
  struct mmsghdr m[BATCH];
  struct iovec iov[BATCH];
  uint64_t t0 = now_ns(), start = t0 + warm_ns;
  uint64_t end = start + (uint64_t)(secs * 1e9), count = 0;
  double c0 = 0;
  bool measuring = false;
  for (;;) {
    uint64_t now = now_ns();
    if (!measuring && now >= start) {
      measuring = true;
      count = 0;
      c0 = cpu_s(server_pid);
    }
    if (now >= end)
      break;
    poll(pf, g_flows, 5);
    now = now_ns();
    for (unsigned i = 0; i < g_flows; i++) {
      flow *f = &fl[i];
      if (pf[i].revents & POLLIN) {
        for (int k = 0; k < BATCH; k++) {
          iov[k].iov_base = rbuf[k];
          iov[k].iov_len = sizeof(rbuf[k]);
          memset(&m[k].msg_hdr, 0, sizeof(m[k].msg_hdr));
          m[k].msg_hdr.msg_iov = &iov[k];
          m[k].msg_hdr.msg_iovlen = 1;
        }
        int r = recvmmsg(f->fd, m, BATCH, MSG_DONTWAIT, NULL);
        if (r > 0) {
          count += (uint64_t)r;
          f->out = f->out > (unsigned)r ? f->out - (unsigned)r : 0;
          f->last = now;
          send_n(f, g_window - f->out);
        }
      } else if (now - f->last > 20000000u) { /* lost: send the window */
        f->out = 0;
        f->last = now;
        send_n(f, g_window);
      }
    }
  }
  *cpu = cpu_s(server_pid) - c0;
  for (unsigned i = 0; i < g_flows; i++)
    close(fl[i].fd);
  return count;
}

/* ---- main ---------------------------------------------------------------- */

static double med(const double *v, int n) {
  double c[MAX_ROUNDS];
  memcpy(c, v, (size_t)n * sizeof(*v));
  return bench_median(c, n);
}

int main(int argc, char **argv) {
  double secs = 2;
  int rounds = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--floor-server"))
      return floor_server();
    if (i + 1 >= argc)
      goto usage;
    if (!strcmp(argv[i], "--seconds"))
      secs = atof(argv[++i]);
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--size"))
      g_size = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--window"))
      g_window = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--flows"))
      g_flows = (unsigned)atoi(argv[++i]);
    else
      goto usage;
  }
  if (secs <= 0 || rounds < 1 || rounds > MAX_ROUNDS || g_size < 1 ||
      g_size > sizeof(g_payload) || g_window < 1 || g_flows < 1 ||
      g_flows > MAX_FLOWS)
    goto usage;
  signal(SIGPIPE, SIG_IGN);
  memset(g_payload, 'u', sizeof(g_payload));
  server sv[4] = {{.name = "weft"},
                  {.name = "uv"},
                  {.name = "asio"},
                  {.name = "floor", .floor = true}};
  int n = 0;
  char buf[512];
  snprintf(sv[0].path, sizeof(sv[0].path), "%s/../../examples/udp_echo",
           WEFT_PEER_DIR);
  server *use[4];
  use[n++] = &sv[0];
  if (bench_peer_path("uv_udp_echo", buf, sizeof(buf))) {
    snprintf(sv[1].path, sizeof(sv[1].path), "%s", buf);
    use[n++] = &sv[1];
  }
  if (bench_peer_path("asio_udp_echo", buf, sizeof(buf))) {
    snprintf(sv[2].path, sizeof(sv[2].path), "%s", buf);
    use[n++] = &sv[2];
  }
  use[n++] = &sv[3];
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < n; k++) {
      server *s = use[(k + r) % n]; /* each round starts with another */
      if (!start_server(s, argv[0]))
        return 1;
      double cpu;
      uint64_t got = drive(s->port, secs, 300000000u, s->pid, &cpu);
      stop_server(s);
      s->pps[r] = (double)got / secs;
      s->cpu_us[r] = got ? cpu * 1e6 / (double)got : 0;
      fprintf(stderr, "round %d %-5s %10.0f datagrams/s %6.2f us CPU each\n",
              r + 1, s->name, s->pps[r], s->cpu_us[r]);
    }
  }
  printf("%-6s %14s %18s\n", "server", "datagrams/s", "CPU us/datagram");
  double best_pps = 0, best_cpu = 0;
  for (int k = 0; k < n; k++) {
    server *s = use[k];
    double p = med(s->pps, rounds), c = med(s->cpu_us, rounds);
    printf("%-6s %14.0f %18.3f\n", s->name, p, c);
    if (k > 0 && !s->floor && p > best_pps) {
      best_pps = p;
      best_cpu = c;
    }
  }
  double wp = med(sv[0].pps, rounds), wc = med(sv[0].cpu_us, rounds);
  double fp = med(sv[3].pps, rounds), fc = med(sv[3].cpu_us, rounds);
  printf("{\"bench\":\"udp_echo\",\"size\":%u,\"window\":%u,\"flows\":%u,"
         "\"rounds\":%d,\"weft_pps\":%.0f,\"weft_cpu_us\":%.3f",
         g_size, g_window, g_flows, rounds, wp, wc);
  for (int k = 1; k < n; k++)
    printf(",\"%s_pps\":%.0f,\"%s_cpu_us\":%.3f", use[k]->name,
           med(use[k]->pps, rounds), use[k]->name, med(use[k]->cpu_us, rounds));
  if (best_pps > 0)
    printf(",\"weft_vs_best_peer_pps\":%.3f,\"weft_vs_best_peer_cpu\":%.3f",
           wp / best_pps, best_cpu > 0 ? wc / best_cpu : 0);
  printf(",\"weft_vs_floor_pps\":%.3f,\"weft_vs_floor_cpu\":%.3f}\n",
         fp > 0 ? wp / fp : 0, fc > 0 ? wc / fc : 0);
  return 0;
usage:
  fprintf(stderr, "usage: udp_echo [--seconds S] [--rounds R] [--size B] "
                  "[--window W] [--flows F]\n");
  return 2;
}
