/*
 * scale_conns - a million idle TCP connections on loopback: the memory
 * weft holds for each, how fast it accepts them, and the latency of
 * keep-alive requests on a few of them while the rest sit idle.
 *
 *   scale_conns [--conns N] [--seconds S] [--burst]
 *
 * The server is this process: a weft runtime with the default workers and
 * a listener on 127.0.0.1 (an ephemeral port, one SO_REUSEPORT socket per
 * worker). Each accepted connection reads a 16-byte request into a slot of
 * its own (20 bytes: the request and how much of it has come, in one array
 * of N slots allocated and faulted in before the first reading) and
 * answers with 16 bytes from a static buffer, then reads again: the only
 * user memory a connection has is its slot (user_bytes_per_conn).
 *
 * The client is a forked child, so that the server's RSS and descriptors
 * are its own. It opens N connections (default 1000000) with non-blocking
 * sockets, each bound before connect to a source address of its own in
 * 127.1.0.0/16 (IP_BIND_ADDRESS_NO_PORT, the port picked at connect; at
 * most 10000 connections a source address, so the local port range is
 * never short), keeping at most half the listen backlog (somaxconn)
 * connected and not yet accepted, so that no SYN is dropped and retried a
 * second later.
 *
 * Limits, checked first: each process raises RLIMIT_NOFILE to N plus a
 * margin (64 + 4 a CPU), the hard limit too where that is allowed
 * (CAP_SYS_RESOURCE), up to fs.nr_open; fs.file-max must hold both
 * processes' descriptors; N connections must need less than 70% of
 * MemAvailable at 10 KiB a connection (both sockets, both processes).
 * Once the runtime listens, N is cut to the descriptors left exactly.
 * Where one does not hold, N is lowered to what does and limit_reason
 * says which (else "none"). No sysctl is changed.
 *
 * Memory: the server's RSS (/proc/self/statm) just before the first
 * connect, with N/2 accepted (the client pauses there) and with all N
 * accepted and idle (each reading 0.3-0.5 s after the last accept
 * callback). weft_bytes_per_conn is the growth over N, what the issue
 * asks; weft_marginal_bytes_per_conn the growth over the second half
 * only, without the runtime's one-time costs (pool caches, the first
 * slabs). weft_heap_bytes_per_conn: the growth over N of what the
 * process has allocated (glibc's mallinfo2: in use from the heap and from
 * mmap), per connection: weft's objects and their pools' slabs, without
 * the pages RSS counts whole (the rings' receive buffers, allocated at
 * start, are touched as the kernel first fills them). The slabs make it
 * step: a strand slab more or less at either end is 64 KiB. The kernel's
 * side is the growth of Slab
 * (/proc/meminfo) over N: both sockets of a connection, the client's port
 * bookkeeping, and what weft keeps in the kernel for it (an armed receive with
 * io_uring, an epoll item with epoll). /proc inodes and dentries made meanwhile
 * are taken out of it (on some hosts a monitor lists /proc/PID/fd, which makes
 * one of each for every descriptor). The caches that grew most are listed (SLUB
 * merges caches of one size under one name: eventpoll_epi may be
 * tcp_bind_bucket's too), and sockstat's TCP buffer pages printed. Other
 * programs running meanwhile blur the kernel's figures, not the RSS.
 *
 * Accept: from the client's first connect to the server's N-th accept
 * callback, less the pause at N/2: accept_s and accept_per_s.
 *
 * Keep-alive: for S seconds (default 5), each second the client picks 1%
 * of the connections at random (at least one; none twice in a second, none
 * with a request in flight) and sends each a request, spread evenly over
 * the second (--burst: all at its start, which measures how fast a burst
 * of N/100 requests drains, not one request's path). ka_p50_us, ka_p99_us
 * and ka_max_us: from a request's send to the client's epoll reporting
 * its response. Requests unanswered 5 s after the last send count as
 * ka_errors.
 *
 * Teardown: the client resets every connection (SO_LINGER 0: no
 * TIME_WAIT), the server closes each on the read error; teardown_s runs
 * from the client's first close to the server's N-th close callback. Then
 * the runtime shuts down.
 *
 * Output: human lines, then one JSON object as the last line. Exit 0, 2
 * on bad flags, 1 on failure (then no JSON; stderr says what stopped it).
 */
#include <weft.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#define REQ_SIZE 16
#define RESP_SIZE 16
#define PER_SRC_IP 10000 /* connections a source address, at most */
#define PAIR_BYTES 10240 /* memory budget a connection, both sides */
#define STALL_S 30       /* no progress for this long: give up */
#define STRAGGLER_S 5    /* wait for responses after the last send */
#define MAX_SLABS 1024

/* ---- what the two processes share (one MAP_SHARED mapping) ------------- */

enum { CMD_NONE, CMD_CONNECT, CMD_KA, CMD_CLOSE };
enum { CL_START, CL_CONNECTED, CL_FAILED, CL_KA_DONE, CL_CLOSED };

struct shared {
  _Atomic long accepted;     /* server: accept callbacks so far */
  _Atomic long target;       /* server -> client: connect this many */
  _Atomic int cmd;           /* server -> client: CMD_* */
  _Atomic int state;         /* client -> server: CL_* */
  long n;                    /* server -> client: connections in all */
  unsigned port;             /* the listener's */
  _Atomic uint64_t t_first;  /* client: its first connect */
  _Atomic uint64_t t_resume; /* client: its first connect past N/2 */
  _Atomic uint64_t t_half;   /* server: the N/2-th accept callback */
  _Atomic uint64_t t_all;    /* server: the N-th accept callback */
  _Atomic uint64_t t_close;  /* client: its first close */
  long opened;               /* client: sockets connecting or connected */
  int err;                   /* client: errno that stopped it, or 0 */
  char err_what[32];         /* client: the call that failed */
  long ka_requests, ka_errors;
  double ka_p50_us, ka_p99_us, ka_max_us;
};

static struct shared *g_sh;

/* ---- /proc readings ----------------------------------------------------- */

static bool read_text(const char *path, char *buf, size_t size) {
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  size_t n = fread(buf, 1, size - 1, f);
  fclose(f);
  buf[n] = 0;
  return true;
}

static long read_long(const char *path) {
  char buf[64];
  return read_text(path, buf, sizeof(buf)) ? atol(buf) : -1;
}

/* What the process has allocated and not freed, in bytes. */
static long heap_bytes(void) {
  struct mallinfo2 mi = mallinfo2();
  return (long)(mi.uordblks + mi.hblkhd);
}

/* A /proc/meminfo field, in bytes; -1 if absent. */
static long meminfo(const char *key) {
  static char buf[8192];
  char k[64];
  if (!read_text("/proc/meminfo", buf, sizeof(buf)))
    return -1;
  snprintf(k, sizeof(k), "\n%s:", key);
  const char *p = strstr(buf, k);
  return p ? atol(p + strlen(k)) * 1024 : -1;
}

/* sockstat's "TCP: ... mem P": pages of TCP buffers. */
static long tcp_mem_pages(void) {
  char buf[1024];
  if (!read_text("/proc/net/sockstat", buf, sizeof(buf)))
    return -1;
  const char *p = strstr(buf, "TCP:");
  p = p ? strstr(p, " mem ") : NULL;
  return p ? atol(p + 5) : -1;
}

/* A TcpExt counter of /proc/net/netstat (a line of names, then one of
 * values); -1 if absent. */
static long netstat(const char *name) {
  static char buf[16384];
  if (!read_text("/proc/net/netstat", buf, sizeof(buf)))
    return -1;
  char *names = strstr(buf, "TcpExt:");
  char *values = names ? strstr(names + 7, "TcpExt:") : NULL;
  if (!values)
    return -1;
  char *ns = names + 7, *vs = values + 7;
  size_t len = strlen(name);
  while (*ns && *ns != '\n') {
    while (*ns == ' ')
      ns++;
    while (*vs == ' ')
      vs++;
    char *end = ns;
    while (*end && *end != ' ' && *end != '\n')
      end++;
    long v = strtol(vs, &vs, 10);
    if ((size_t)(end - ns) == len && !strncmp(ns, name, len))
      return v;
    ns = end;
  }
  return -1;
}

static const char *const k_netstat[] = {
    "ListenOverflows",      "ListenDrops",     "SyncookiesSent",
    "TCPReqQFullDoCookies", "TCPReqQFullDrop", "TCPTimeWaitOverflow"};
#define N_NETSTAT (sizeof(k_netstat) / sizeof(k_netstat[0]))

/* /proc/slabinfo: each cache's objects and object size. */
struct slabs {
  int n;
  char name[MAX_SLABS][40];
  long objs[MAX_SLABS], size[MAX_SLABS];
};

static bool slabs_read(struct slabs *s) {
  FILE *f = fopen("/proc/slabinfo", "r");
  s->n = 0;
  if (!f)
    return false;
  char line[512];
  while (s->n < MAX_SLABS && fgets(line, sizeof(line), f)) {
    if (line[0] == '#' || !strncmp(line, "slabinfo", 8))
      continue;
    long active, total, size;
    if (sscanf(line, "%39s %ld %ld %ld", s->name[s->n], &active, &total,
               &size) == 4) {
      s->objs[s->n] = total;
      s->size[s->n] = size;
      s->n++;
    }
  }
  fclose(f);
  return s->n > 0;
}

/* How many objects of cache name b has more than a. */
static long slab_grew(const struct slabs *a, const struct slabs *b,
                      const char *name) {
  long before = 0, after = 0;
  for (int i = 0; i < a->n; i++)
    if (!strcmp(a->name[i], name))
      before = a->objs[i];
  for (int i = 0; i < b->n; i++)
    if (!strcmp(b->name[i], name))
      after = b->objs[i];
  return after - before;
}

static long slab_size(const struct slabs *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->name[i], name))
      return s->size[i];
  return 0;
}

/* Prints the caches that grew most from a to b, per connection. */
static void slabs_top(const struct slabs *a, const struct slabs *b, long n) {
  long grew[MAX_SLABS];
  for (int i = 0; i < b->n; i++) {
    long before = 0;
    for (int j = 0; j < a->n; j++)
      if (!strcmp(a->name[j], b->name[i]))
        before = a->objs[j];
    grew[i] = (b->objs[i] - before) * b->size[i];
  }
  printf("slab caches that grew (bytes a connection, both sides):");
  for (int k = 0; k < 10; k++) {
    int best = -1;
    for (int i = 0; i < b->n; i++)
      if (grew[i] > 0 && (best < 0 || grew[i] > grew[best]))
        best = i;
    if (best < 0 || grew[best] < n)
      break;
    printf(" %s %.0f", b->name[best], (double)grew[best] / (double)n);
    grew[best] = 0;
  }
  printf("\n");
}

/* ---- the server: one slot a connection ---------------------------------- */

struct slot {
  uint32_t have; /* bytes of the request received */
  char buf[REQ_SIZE];
};

static struct slot *g_slots;
static long g_n, g_half;
static char g_resp[RESP_SIZE];
static _Atomic long g_closed, g_served;
static _Atomic uint64_t g_t_closed;

static void on_close(void *data, weft_tcp *c) {
  (void)data;
  (void)c;
  if (atomic_fetch_add(&g_closed, 1) + 1 == g_n)
    atomic_store(&g_t_closed, bench_now_ns());
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct slot *s = arg;
  if (n <= 0) { /* the client's reset, or end of file */
    weft_tcp_close(c, 0);
    return;
  }
  s->have += (uint32_t)n;
  if (s->have == REQ_SIZE) {
    s->have = 0;
    atomic_fetch_add_explicit(&g_served, 1, memory_order_relaxed);
    if (weft_tcp_write(c, g_resp, RESP_SIZE, NULL, NULL) < 0) {
      weft_tcp_close(c, 0);
      return;
    }
  }
  if (weft_tcp_read(c, s->buf + s->have, REQ_SIZE - s->have, on_read, s) < 0)
    weft_tcp_close(c, 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  long i = atomic_fetch_add(&g_sh->accepted, 1);
  if (i + 1 == g_half)
    atomic_store(&g_sh->t_half, bench_now_ns());
  if (i + 1 == g_n)
    atomic_store(&g_sh->t_all, bench_now_ns());
  if (i >= g_n) { /* more than asked for: not ours */
    weft_tcp_close(c, 1);
    return;
  }
  struct slot *s = &g_slots[i];
  weft_tcp_set_data(c, s, on_close);
  if (weft_tcp_read(c, s->buf, REQ_SIZE, on_read, s) < 0)
    weft_tcp_close(c, 0);
}

/* ---- the client (the forked child) -------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15u;

static uint64_t rng(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

static bool wait_cmd(int cmd) {
  while (atomic_load(&g_sh->cmd) < cmd) {
    if (getppid() == 1)
      return false;
    usleep(1000);
  }
  return true;
}

static void client_fail(const char *what, int err) {
  snprintf(g_sh->err_what, sizeof(g_sh->err_what), "%s", what);
  g_sh->err = err;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

struct req {
  int conn;
  uint32_t got; /* bytes of the response read */
  uint64_t sent;
};

/* Sends request r on a connection picked at random. */
static bool ka_send(int ep, const int *fds, uint8_t *mark, uint8_t sec_mark,
                    long n, struct req *reqs, uint32_t r) {
  long i = 0;
  int tries = 0;
  do { /* not one picked this second (sec_mark) or in flight (1) */
    if (++tries > 1000)
      return false;
    i = (long)(rng() % (uint64_t)n);
  } while (mark[i] == sec_mark || mark[i] == 1);
  mark[i] = sec_mark;
  static const char req[REQ_SIZE] = "keep-alive req\n";
  reqs[r].conn = (int)i;
  reqs[r].got = 0;
  reqs[r].sent = bench_now_ns();
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = r};
  if (write(fds[i], req, REQ_SIZE) != REQ_SIZE ||
      epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) < 0)
    return false;
  mark[i] = 1;
  return true;
}

static void keep_alive(const int *fds, long n, double seconds, bool burst) {
  long per_s = n / 100 > 0 ? n / 100 : 1;
  long secs = (long)seconds, total = per_s * secs;
  struct req *reqs = calloc((size_t)total, sizeof(*reqs));
  uint64_t *lat = calloc((size_t)total, sizeof(*lat));
  uint8_t *mark = calloc((size_t)n, 1);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!reqs || !lat || !mark || ep < 0) {
    client_fail("keep-alive setup", errno);
    return;
  }
  bool pwait2 = true;
  long sent = 0, done = 0, nlat = 0, errors = 0;
  uint64_t t0 = bench_now_ns(), period = 1000000000u;
  uint64_t end = t0 + (uint64_t)secs * period + STRAGGLER_S * period;
  struct epoll_event evs[256];
  while (done < total) {
    uint64_t now = bench_now_ns();
    /* at most 64 sends, then look at the responses */
    for (int k = 0; k < 64 && sent < total; k++) {
      long sec = sent / per_s, j = sent % per_s;
      uint64_t due =
          t0 + (uint64_t)sec * period +
          (burst ? 0 : (uint64_t)((double)j * (double)period / (double)per_s));
      if (due > now)
        break;
      if (!ka_send(ep, fds, mark, (uint8_t)(2 + sec % 250), n, reqs,
                   (uint32_t)sent)) {
        errors++;
        done++;
      }
      sent++;
    }
    if (now > end)
      break;
    uint64_t wait = end - now;
    if (sent < total) {
      long sec = sent / per_s, j = sent % per_s;
      uint64_t due =
          t0 + (uint64_t)sec * period +
          (burst ? 0 : (uint64_t)((double)j * (double)period / (double)per_s));
      wait = due > now ? due - now : 0;
    }
    int got;
    if (pwait2) {
      struct timespec ts = {(time_t)(wait / 1000000000u),
                            (long)(wait % 1000000000u)};
      got = epoll_pwait2(ep, evs, 256, &ts, NULL);
      if (got < 0 && errno == ENOSYS) {
        pwait2 = false;
        continue;
      }
    } else {
      got = epoll_wait(ep, evs, 256, (int)((wait + 999999) / 1000000));
    }
    if (got < 0 && errno != EINTR) {
      client_fail("epoll_wait", errno);
      break;
    }
    uint64_t t = bench_now_ns();
    for (int e = 0; e < got; e++) {
      struct req *rq = &reqs[evs[e].data.u32];
      int fd = fds[rq->conn];
      char buf[RESP_SIZE];
      ssize_t k = read(fd, buf, RESP_SIZE - rq->got);
      if (k < 0 && errno == EAGAIN)
        continue;
      if (k > 0)
        rq->got += (uint32_t)k;
      if (k > 0 && rq->got < RESP_SIZE)
        continue;
      if (rq->got == RESP_SIZE)
        lat[nlat++] = t - rq->sent;
      else
        errors++;
      epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
      mark[rq->conn] = (uint8_t)(2 + (evs[e].data.u32 / per_s) % 250);
      done++;
    }
  }
  close(ep);
  qsort(lat, (size_t)nlat, sizeof(*lat), cmp_u64);
  g_sh->ka_requests = nlat;
  g_sh->ka_errors = errors + (total - done);
  if (nlat) {
    g_sh->ka_p50_us = (double)lat[nlat / 2] / 1e3;
    g_sh->ka_p99_us = (double)lat[(nlat * 99) / 100] / 1e3;
    g_sh->ka_max_us = (double)lat[nlat - 1] / 1e3;
  }
  free(reqs);
  free(lat);
  free(mark);
}

static int client(long window, double seconds, bool burst) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!wait_cmd(CMD_CONNECT))
    return 1;
  long n = g_sh->n;
  int *fds = malloc((size_t)n * sizeof(*fds));
  if (!fds) {
    client_fail("malloc", ENOMEM);
    atomic_store(&g_sh->state, CL_FAILED);
    return 1;
  }
  struct sockaddr_in dst = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)g_sh->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  long nsrc = (n + PER_SRC_IP - 1) / PER_SRC_IP;
  uint64_t t0 = bench_now_ns(), last_move = t0;
  long opened = 0, seen = 0;
  atomic_store(&g_sh->t_first, t0);
  for (; opened < n; opened++) {
    if (opened == atomic_load(&g_sh->target)) { /* the server reads */
      while (opened >= atomic_load(&g_sh->target)) {
        if (getppid() == 1)
          return 1;
        usleep(1000);
      }
      atomic_store(&g_sh->t_resume, bench_now_ns());
    }
    long acc;
    while (opened - (acc = atomic_load(&g_sh->accepted)) >= window) {
      uint64_t t = bench_now_ns();
      if (acc != seen) {
        seen = acc;
        last_move = t;
      } else if (t - last_move > (uint64_t)STALL_S * 1000000000u) {
        client_fail("no accepts", ETIMEDOUT);
        break;
      }
      usleep(50);
    }
    if (g_sh->err)
      break;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      client_fail("socket", errno);
      break;
    }
    int one = 1;
    struct sockaddr_in src = {
        .sin_family = AF_INET,
        .sin_addr.s_addr = htonl(0x7f010001u + (uint32_t)(opened % nsrc))};
    if (setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one)) <
            0 ||
        bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
      client_fail("bind", errno);
      close(fd);
      break;
    }
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 &&
        errno != EINPROGRESS) {
      client_fail("connect", errno);
      close(fd);
      break;
    }
    fds[opened] = fd;
  }
  g_sh->opened = opened;
  atomic_store(&g_sh->state, opened == n ? CL_CONNECTED : CL_FAILED);
  if (opened == n) {
    if (!wait_cmd(CMD_KA))
      return 1;
    keep_alive(fds, n, seconds, burst);
    atomic_store(&g_sh->state, CL_KA_DONE);
  }
  if (!wait_cmd(CMD_CLOSE))
    return 1;
  atomic_store(&g_sh->t_close, bench_now_ns());
  struct linger lg = {1, 0}; /* reset: no TIME_WAIT */
  for (long i = 0; i < opened; i++) {
    setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fds[i]);
  }
  atomic_store(&g_sh->state, CL_CLOSED);
  return 0;
}

/* ---- limits ------------------------------------------------------------- */

/* Descriptors a process needs besides its N sockets: a few per worker
 * (rings, eventfds, listening sockets) and a few more. */
static long fd_margin(void) { return 64 + 4 * sysconf(_SC_NPROCESSORS_ONLN); }

/* Lowers *n to what descriptors and memory allow, saying why in reason;
 * sets RLIMIT_NOFILE (the child inherits it). */
static void fit(long *n, char *reason, size_t size) {
  long margin = fd_margin(), nr_open = read_long("/proc/sys/fs/nr_open");
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t need = (rlim_t)(*n + margin);
  int err = 0;
  if (rl.rlim_max < need) {
    struct rlimit up = {need, need};
    if (nr_open > 0 && (rlim_t)nr_open < need)
      up.rlim_cur = up.rlim_max = (rlim_t)nr_open;
    if (up.rlim_max > rl.rlim_max && setrlimit(RLIMIT_NOFILE, &up) < 0)
      err = errno;
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_max < need) {
    *n = (long)rl.rlim_max - margin;
    need = rl.rlim_max;
    if (err)
      snprintf(reason, size,
               "RLIMIT_NOFILE hard limit %ld, and raising it failed: %s "
               "(it needs CAP_SYS_RESOURCE)",
               (long)rl.rlim_max, strerror(err));
    else
      snprintf(reason, size, "fs.nr_open %ld", nr_open);
  }
  rl.rlim_cur = need;
  setrlimit(RLIMIT_NOFILE, &rl);
  char buf[128];
  long file_max = read_long("/proc/sys/fs/file-max"), used = 0;
  if (read_text("/proc/sys/fs/file-nr", buf, sizeof(buf)))
    used = atol(buf);
  if (file_max > 0 && 2 * (*n + margin) > file_max - used) {
    *n = (file_max - used) / 2 - margin;
    snprintf(reason, size, "fs.file-max %ld (%ld in use): 2N must fit",
             file_max, used);
  }
  long avail = meminfo("MemAvailable");
  if (avail > 0 && (double)*n * PAIR_BYTES > 0.7 * (double)avail) {
    *n = (long)(0.7 * (double)avail / PAIR_BYTES);
    snprintf(reason, size,
             "memory: 70%% of MemAvailable %.1f GiB at %d bytes a "
             "connection",
             (double)avail / (1u << 30), PAIR_BYTES);
  }
}

static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  long k = 0;
  if (!d)
    return -1;
  while (readdir(d))
    k++;
  closedir(d);
  return k - 2; /* . and .. (the directory's own descriptor is counted) */
}

/* ---- main --------------------------------------------------------------- */

static bool g_reaped; /* the client has exited, with g_child_status */
static int g_child_status;

/* Waits until done() or the child ends or fails; false on a stall (no
 * change of progress() for STALL_S) or a child that died before it had
 * closed every connection. */
static bool wait_for(pid_t child, bool (*done)(void), long (*progress)(void),
                     const char *what) {
  long last = progress();
  uint64_t moved = bench_now_ns(), said = moved;
  while (!done()) {
    if (!g_reaped && waitpid(child, &g_child_status, WNOHANG) == child)
      g_reaped = true;
    if (g_reaped && atomic_load(&g_sh->state) != CL_CLOSED) {
      fprintf(stderr, "scale_conns: the client exited while %s\n", what);
      return false;
    }
    if (atomic_load(&g_sh->state) == CL_FAILED)
      return false;
    uint64_t t = bench_now_ns();
    long p = progress();
    if (p != last) {
      last = p;
      moved = t;
    } else if (t - moved > (uint64_t)STALL_S * 1000000000u) {
      fprintf(stderr, "scale_conns: stuck %ds while %s at %ld\n", STALL_S, what,
              p);
      return false;
    }
    if (t - said > 5000000000u) {
      said = t;
      fprintf(stderr, "scale_conns: %s: %ld\n", what, p);
    }
    usleep(1000);
  }
  return true;
}

static long accepted_now(void) { return atomic_load(&g_sh->accepted); }
static bool half_accepted(void) { return accepted_now() >= g_half; }
static bool all_accepted(void) { return accepted_now() >= g_n; }
static long closed_now(void) { return atomic_load(&g_closed); }
static bool all_closed(void) { return closed_now() >= g_n; }
static long served_now(void) { return atomic_load(&g_served); }
static bool client_ka_done(void) {
  return atomic_load(&g_sh->state) >= CL_KA_DONE;
}

/* A reading of the kernel's memory. */
struct kmem {
  long slab, unreclaim, tcp_pages, conntrack;
};

static void kmem_read(struct kmem *k) {
  k->slab = meminfo("Slab");
  k->unreclaim = meminfo("SUnreclaim");
  k->tcp_pages = tcp_mem_pages();
  k->conntrack = read_long("/proc/sys/net/netfilter/nf_conntrack_count");
}

static uint64_t stalls(weft_rt *rt) {
  weft_stats st;
  return weft_rt_stats(rt, &st) == 0 ? st.total.stalls : 0;
}

static struct slabs g_slab0, g_slab1;

int main(int argc, char **argv) {
  long n0 = 1000000;
  double seconds = 5;
  bool burst = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--conns") && i + 1 < argc)
      n0 = atol(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--burst"))
      burst = true;
    else
      goto usage;
  }
  if (n0 < 1 || n0 > 16000000 || seconds < 1 || seconds > 200)
    goto usage;
  signal(SIGPIPE, SIG_IGN);

  char reason[200] = "none";
  long n = n0;
  fit(&n, reason, sizeof(reason));
  if (n < 1) {
    fprintf(stderr, "scale_conns: no connection fits: %s\n", reason);
    return 1;
  }
  long somaxconn = read_long("/proc/sys/net/core/somaxconn");
  long window = (somaxconn > 0 ? somaxconn : 128) / 2;
  if (window > 2048)
    window = 2048;
  if (window < 8)
    window = 8;

  g_sh = mmap(NULL, sizeof(*g_sh), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_sh == MAP_FAILED) {
    perror("scale_conns: mmap");
    return 1;
  }
  fflush(stdout);
  pid_t child = fork(); /* before the runtime: the client has none of it */
  if (child < 0) {
    perror("scale_conns: fork");
    return 1;
  }
  if (child == 0)
    _exit(client(window, seconds, burst));

  /* the server */
  memset(g_resp, 'r', sizeof(g_resp));
  g_resp[RESP_SIZE - 1] = '\n';
  g_slots = malloc((size_t)n * sizeof(*g_slots));
  if (!g_slots) {
    fprintf(stderr, "scale_conns: no memory for %ld slots\n", n);
    kill(child, SIGKILL);
    return 1;
  }
  bench_prefault(g_slots, (size_t)n * sizeof(*g_slots));
  memset(g_slots, 0, (size_t)n * sizeof(*g_slots));
  weft_rt *rt;
  int r = weft_rt_create(&rt, NULL);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *l = NULL;
  weft_listen_opts lo = {.backlog = 65535}; /* the kernel caps: somaxconn */
  if (r == 0)
    r = weft_tcp_listen(rt, (struct sockaddr *)&addr, sizeof(addr), &lo,
                        on_accept, NULL, &l);
  unsigned alen = sizeof(addr);
  if (r == 0)
    r = weft_listener_addr(l, (struct sockaddr *)&addr, &alen);
  if (r < 0) {
    fprintf(stderr, "scale_conns: weft: %s\n", weft_strerror(r));
    kill(child, SIGKILL);
    return 1;
  }
  char backend[16];
  snprintf(backend, sizeof(backend), "%s", weft_rt_backend_name(rt));
  unsigned workers = weft_rt_workers(rt);
  /* What the runtime holds now is known: the exact room for sockets. */
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  long room = (long)rl.rlim_cur - open_fds() - 16;
  if (n > room) {
    n = room;
    if (!strcmp(reason, "none"))
      snprintf(reason, sizeof(reason),
               "RLIMIT_NOFILE %ld less the runtime's own descriptors",
               (long)rl.rlim_cur);
  }
  if (n < 1) {
    fprintf(stderr, "scale_conns: no descriptor left for a connection\n");
    kill(child, SIGKILL);
    return 1;
  }
  g_n = n;
  g_half = n >= 2 ? n / 2 : n;
  g_sh->n = n;
  g_sh->port = ntohs(addr.sin_port);

  /* the readings before (slabinfo twice: the second buffer is touched) */
  bool have_slabs = slabs_read(&g_slab1) && slabs_read(&g_slab0);
  long ns0[N_NETSTAT], ns1[N_NETSTAT];
  for (size_t k = 0; k < N_NETSTAT; k++)
    ns0[k] = netstat(k_netstat[k]);
  struct kmem k0, k1;
  kmem_read(&k0);
  uint64_t stalls0 = stalls(rt);
  long rss0 = bench_rss_bytes();
  long heap0 = heap_bytes();

  /* N/2 connections, a reading, then the rest */
  atomic_store(&g_sh->target, g_half);
  atomic_store(&g_sh->cmd, CMD_CONNECT);
  bool ok = wait_for(child, half_accepted, accepted_now, "accepting");
  long rss_half = 0;
  if (ok && g_half < n) {
    usleep(300000);
    rss_half = bench_rss_bytes();
    atomic_store(&g_sh->target, n);
    ok = wait_for(child, all_accepted, accepted_now, "accepting");
  }
  if (!ok) {
    long acc = accepted_now();
    if (g_sh->err)
      fprintf(stderr,
              "scale_conns: client: %s: %s after %ld connections "
              "(server accepted %ld)\n",
              g_sh->err_what, strerror(g_sh->err), g_sh->opened, acc);
    fprintf(stderr, "scale_conns: %ld of %ld connections accepted\n", acc, n);
    kill(child, SIGKILL);
    if (!g_reaped)
      waitpid(child, NULL, 0);
    weft_rt_destroy(rt);
    return 1;
  }
  uint64_t t_first = atomic_load(&g_sh->t_first);
  uint64_t t_all = atomic_load(&g_sh->t_all);
  double accept_s = g_half < n
                        ? (double)(atomic_load(&g_sh->t_half) - t_first +
                                   (t_all - atomic_load(&g_sh->t_resume))) /
                              1e9
                        : (double)(t_all - t_first) / 1e9;
  while (atomic_load(&g_sh->state) == CL_START)
    usleep(1000);
  usleep(500000); /* let the last reads be armed */

  long rss1 = bench_rss_bytes();
  long heap1 = heap_bytes();
  kmem_read(&k1);
  have_slabs = have_slabs && slabs_read(&g_slab1);
  for (size_t k = 0; k < N_NETSTAT; k++)
    ns1[k] = netstat(k_netstat[k]);
  uint64_t stalls1 = stalls(rt);
  weft_stats st;
  weft_rt_stats(rt, &st);

  double weft_bpc = (double)(rss1 - rss0) / (double)n;
  double weft_marginal =
      g_half < n ? (double)(rss1 - rss_half) / (double)(n - g_half) : weft_bpc;
  double weft_heap = (double)(heap1 - heap0) / (double)n;
  /* /proc inodes (and their dentries) made meanwhile are not the
   * sockets': something listing /proc/PID/fd makes one a descriptor. */
  long proc_bytes = 0;
  if (have_slabs) {
    long pi = slab_grew(&g_slab0, &g_slab1, "proc_inode_cache");
    long pi_size = slab_size(&g_slab1, "proc_inode_cache");
    long de_size = slab_size(&g_slab1, "dentry");
    proc_bytes = pi > 0 ? pi * (pi_size + de_size) : 0;
  }
  double slab_bpc = (double)(k1.slab - k0.slab) / (double)n;
  double kern_bpc = (double)(k1.slab - k0.slab - proc_bytes) / (double)n;
  printf("scale_conns: %ld connections (asked %ld; limit: %s), backend %s, "
         "%u workers, accept window %ld\n",
         n, n0, reason, backend, workers, window);
  printf("accept: %.2f s, %.0f connections/s (the client paused at N/2 "
         "for a reading; not counted)\n",
         accept_s, (double)n / accept_s);
  printf("server RSS %.1f MiB -> %.1f MiB: weft %.1f bytes a connection "
         "(%.1f over the second half), user slot %zu bytes; %" PRIu64
         " sockets live, %" PRIu64 " receive buffers held\n",
         (double)rss0 / (1 << 20), (double)rss1 / (1 << 20), weft_bpc,
         weft_marginal, sizeof(struct slot), st.tcp_live, st.recv_bufs_held);
  printf("allocated: %.1f bytes a connection\n", weft_heap);
  printf("kernel: Slab +%.0f bytes a connection, both sockets (+%.0f with "
         "the /proc inodes made meanwhile; unreclaimable +%.0f); TCP buffer "
         "pages %ld -> %ld\n",
         kern_bpc, slab_bpc, (double)(k1.unreclaim - k0.unreclaim) / (double)n,
         k0.tcp_pages, k1.tcp_pages);
  if (have_slabs)
    slabs_top(&g_slab0, &g_slab1, n);
  printf("netstat during accept:");
  for (size_t k = 0; k < N_NETSTAT; k++)
    if (ns0[k] >= 0 && ns1[k] >= 0)
      printf(" %s +%ld", k_netstat[k], ns1[k] - ns0[k]);
  printf("; weft stalls +%" PRIu64 "\n", stalls1 - stalls0);
  if (k0.conntrack >= 0 && k1.conntrack > k0.conntrack)
    printf("conntrack tracks loopback: +%ld entries (nf_conntrack_max %ld)\n",
           k1.conntrack - k0.conntrack,
           read_long("/proc/sys/net/netfilter/nf_conntrack_max"));

  atomic_store(&g_sh->cmd, CMD_KA);
  wait_for(child, client_ka_done, served_now, "keep-alive");
  long rss2 = bench_rss_bytes();
  uint64_t stalls2 = stalls(rt);
  printf("keep-alive: %ld requests (%ld a second, %s), %ld errors, served "
         "%ld; p50 %.1f us, p99 %.1f us, max %.1f us; RSS %+.1f bytes a "
         "connection; weft stalls +%" PRIu64 "\n",
         g_sh->ka_requests, n / 100 > 0 ? n / 100 : 1,
         burst ? "burst" : "spread", g_sh->ka_errors, atomic_load(&g_served),
         g_sh->ka_p50_us, g_sh->ka_p99_us, g_sh->ka_max_us,
         (double)(rss2 - rss1) / (double)n, stalls2 - stalls1);

  atomic_store(&g_sh->cmd, CMD_CLOSE);
  bool closed = wait_for(child, all_closed, closed_now, "closing");
  double teardown_s =
      closed
          ? (double)(atomic_load(&g_t_closed) - atomic_load(&g_sh->t_close)) /
                1e9
          : -1;
  long rss3 = bench_rss_bytes();
  weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN);
  weft_rt_destroy(rt);
  if (!g_reaped)
    waitpid(child, &g_child_status, 0);
  int cst = g_child_status;
  printf("teardown: %.2f s; RSS with every connection closed %.1f MiB; "
         "close callbacks %ld of %ld\n",
         teardown_s, (double)rss3 / (1 << 20), atomic_load(&g_closed), n);
  if (!closed || atomic_load(&g_closed) != n || !WIFEXITED(cst) ||
      WEXITSTATUS(cst) != 0 || g_sh->ka_requests == 0) {
    fprintf(stderr, "scale_conns: the run did not complete\n");
    return 1;
  }
  printf("{\"bench\":\"scale_conns\",\"conns\":%ld,\"conns_requested\":%ld,"
         "\"backend\":\"%s\",\"workers\":%u,\"weft_bytes_per_conn\":%.1f,"
         "\"weft_marginal_bytes_per_conn\":%.1f,"
         "\"weft_heap_bytes_per_conn\":%.1f,\"user_bytes_per_conn\":%zu,"
         "\"kernel_bytes_per_conn\":%.0f,\"accept_s\":%.3f,"
         "\"accept_per_s\":%.0f,\"ka_requests\":%ld,\"ka_errors\":%ld,"
         "\"ka_p50_us\":%.1f,\"ka_p99_us\":%.1f,\"ka_max_us\":%.1f,"
         "\"teardown_s\":%.3f,\"limit_reason\":\"%s\"}\n",
         n, n0, backend, workers, weft_bpc, weft_marginal, weft_heap,
         sizeof(struct slot), kern_bpc, accept_s, (double)n / accept_s,
         g_sh->ka_requests, g_sh->ka_errors, g_sh->ka_p50_us, g_sh->ka_p99_us,
         g_sh->ka_max_us, teardown_s, reason);
  return 0;
usage:
  fprintf(stderr, "usage: scale_conns [--conns N] [--seconds S] [--burst]\n");
  return 2;
}
