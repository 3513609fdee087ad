/*
 * test_examples: the network examples (build/examples/echo, udp_echo,
 * http_hello, file_server, tcp_proxy, chat) do what they say, as separate
 * processes driven over loopback by plain non-blocking sockets, once with
 * WEFT_BACKEND=epoll and once with WEFT_BACKEND=uring (skipped where io_uring
 * cannot be set up).
 *
 * Each example is started with --port 0 --threads 2; its first stdout line
 * must be "listening on PORT". At the end it gets SIGTERM, with
 * connections still open, and must exit with status 0 (under ASan that
 * includes LeakSanitizer finding nothing).
 *
 *  - echo: 1 MiB of pseudo-random bytes sent while reading comes back
 *    unchanged, then EOF after our half-close; the same over a Unix
 *    socket (echo --unix) on a path, whose file is gone after the
 *    SIGTERM, and in the abstract namespace.
 *  - udp_echo: 50 bursts of 16 datagrams of 1..1400 bytes come back
 *    unchanged, in order.
 *  - http_hello: on one keep-alive connection one request, then a
 *    pipelined pair, then a 3000-byte head and one more request, get
 *    exactly five responses; "connection: Close" gets
 *    the close response, then EOF; a pipelined keep-alive + close pair gets
 *    both, then EOF; 8 KiB without an end of headers gets 431, then EOF.
 *  - file_server: over one keep-alive connection, a 300 KiB file whole,
 *    then pipelined a HEAD, two byte ranges and the index of "/", then
 *    404, 400 for ".." (plain or percent-encoded), 404 for a directory,
 *    405, 416; then "Connection: close" gets the file, then EOF. A
 *    connection in the middle of a large body is open at the SIGTERM.
 *  - tcp_proxy: in front of echo, 1 MiB round trip as above (half-close
 *    passes through both ways); with a backend port nobody listens on (and
 *    a one-minute connect timeout) the client is closed; with a short idle
 *    timeout an idle client is closed.
 *  - chat: two clients in room A, one in room B: lines reach only the
 *    other member of the same room, joins and leaves are announced; a
 *    client without a nick gets an id. After the server has exited, the
 *    rest of every stream is empty: nothing went to the wrong client.
 *
 * Every wait is bounded (poll timeouts, TU_WAIT_S); nothing sleeps to
 * synchronise and nothing measures speed.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/io_uring.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#ifndef WEFT_EXAMPLES_DIR
#error "WEFT_EXAMPLES_DIR must name the directory of the example binaries"
#endif

extern char **environ;

#define ECHO_BYTES (1u << 20)
#define MAX_CHILDREN 8

/* ------------------------------------------------------------- time, io */

/* Milliseconds left until deadline (ns), at least 0. */
static int xt_ms_left(uint64_t deadline) {
  uint64_t now = tu_now_ns();
  return now >= deadline ? 0 : (int)((deadline - now) / 1000000u + 1);
}

/* Polls fd for events until deadline; fails the test on timeout. */
static short xt_poll(int fd, short events, uint64_t deadline,
                     const char *what) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, xt_ms_left(deadline));
    if (n > 0)
      return p.revents;
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      fail_msg("poll (%s): %s", what, strerror(errno));
    fail_msg("timed out after %d s: %s", TU_WAIT_S, what);
  }
}

static int xt_connect(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
    if (errno != EINPROGRESS)
      fail_msg("connect to port %u: %s", port, strerror(errno));
    xt_poll(fd, POLLOUT, tu_deadline_ns(TU_WAIT_S), "connect");
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err)
      fail_msg("connect to port %u: %s", port, strerror(err));
  }
  return fd;
}

static void xt_send_all(int fd, const void *buf, size_t len) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      xt_poll(fd, POLLOUT, deadline, "send");
      continue;
    }
    if (n < 0)
      fail_msg("send: %s", strerror(errno));
    p += n;
    len -= (size_t)n;
  }
}

static void xt_send_str(int fd, const char *s) {
  xt_send_all(fd, s, strlen(s));
}

/* Receives up to len bytes, waiting (bounded) until there are some.
 * Returns the count, 0 at EOF, -1 when the peer reset the connection. */
static ssize_t xt_recv_some(int fd, void *buf, size_t len, uint64_t deadline) {
  for (;;) {
    ssize_t n = recv(fd, buf, len, 0);
    if (n >= 0)
      return n;
    if (errno == ECONNRESET)
      return -1;
    if (errno != EAGAIN && errno != EINTR)
      fail_msg("recv: %s", strerror(errno));
    xt_poll(fd, POLLIN, deadline, "recv");
  }
}

/* Receives exactly len bytes and checks them against want. */
static void xt_expect(int fd, const char *want, size_t len, const char *what) {
  static char got[4096];
  assert_true(len < sizeof(got));
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  size_t have = 0;
  while (have < len) {
    ssize_t n = xt_recv_some(fd, got + have, len - have, deadline);
    if (n <= 0)
      fail_msg("%s: connection ended after %zu of %zu bytes", what, have, len);
    have += (size_t)n;
  }
  got[len] = '\0';
  if (memcmp(got, want, len) != 0)
    fail_msg("%s: got \"%s\"", what, got);
}

/* Reads until the peer closes (EOF or reset); returns what came, as a
 * NUL-terminated string in a static buffer (valid until the next call). */
static const char *xt_read_to_close(int fd) {
  static char buf[8192];
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  size_t have = 0;
  for (;;) {
    if (have == sizeof(buf) - 1)
      fail_msg("more than %zu bytes before the close", have);
    ssize_t n = xt_recv_some(fd, buf + have, sizeof(buf) - 1 - have, deadline);
    if (n <= 0)
      break;
    have += (size_t)n;
  }
  buf[have] = '\0';
  return buf;
}

/* ------------------------------------------------------- child processes */

typedef struct xt_child {
  pid_t pid; /* 0: not running (reaped) */
  int out;   /* read end of its stdout */
  unsigned port;
  const char *name;
  const char *unix_path; /* listening there (--unix), not on port */
} xt_child;

static xt_child g_children[MAX_CHILDREN];
static int g_nchildren;
static const char *g_backend; /* WEFT_BACKEND of the current test */

/* environ with WEFT_BACKEND replaced; static storage, rebuilt per spawn. */
static char **xt_env(void) {
  static char *env[1024];
  static char backend[64];
  size_t n = 0;
  snprintf(backend, sizeof(backend), "WEFT_BACKEND=%s", g_backend);
  env[n++] = backend;
  for (char **e = environ; *e && n < 1023; e++)
    if (strncmp(*e, "WEFT_BACKEND=", 13) != 0)
      env[n++] = *e;
  env[n] = NULL;
  return env;
}

/* Reads the child's next stdout line (what: the line it should be). */
static void xt_read_line(xt_child *c, char *line, size_t size,
                         const char *what) {
  size_t len = 0;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  while (len == 0 || line[len - 1] != '\n') {
    if (len == size - 1)
      fail_msg("%s: line too long", c->name);
    xt_poll(c->out, POLLIN, deadline, what);
    ssize_t n = read(c->out, line + len, 1);
    if (n == 0)
      fail_msg("%s (%s) ended its output before %s", c->name, g_backend, what);
    if (n < 0 && errno != EINTR && errno != EAGAIN)
      fail_msg("read from %s: %s", c->name, strerror(errno));
    if (n > 0)
      len++;
  }
  line[len] = '\0';
}

/* Reads the child's first stdout line and returns the port it names. */
static unsigned xt_read_port(xt_child *c) {
  char line[128];
  xt_read_line(c, line, sizeof line, "the 'listening on PORT' line");
  unsigned port;
  char end;
  if (c->unix_path) {
    char want[256];
    snprintf(want, sizeof want, "listening on %s\n", c->unix_path);
    if (strcmp(line, want) != 0)
      fail_msg("%s: unexpected first line \"%s\"", c->name, line);
    return 0;
  }
  if (sscanf(line, "listening on %u%c", &port, &end) != 2 || end != '\n' ||
      port == 0 || port > 65535)
    fail_msg("%s: unexpected first line \"%s\"", c->name, line);
  return port;
}

/* Starts build/examples/name --port 0 --threads 2 [extra...] with
 * WEFT_BACKEND=g_backend and waits until it listens. */
static xt_child *xt_start(const char *name, const char *const *extra) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s", WEFT_EXAMPLES_DIR, name);
  char *argv[16] = {path, "--port", "0", "--threads", "2"};
  int argc = 5;
  for (; extra && *extra && argc < 15; extra++)
    argv[argc++] = (char *)*extra;
  argv[argc] = NULL;
  assert_true(g_nchildren < MAX_CHILDREN);
  xt_child *c = &g_children[g_nchildren++];
  c->name = name;
  c->unix_path = NULL;
  for (int i = 5; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--unix"))
      c->unix_path = argv[i + 1];
  int fds[2];
  assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
  c->out = fds[0];
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t none, dfl;
  sigemptyset(&none);
  sigemptyset(&dfl);
  sigaddset(&dfl, SIGPIPE);
  sigaddset(&dfl, SIGINT);
  sigaddset(&dfl, SIGTERM);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawnattr_init(&at);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dfl);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  int rc = posix_spawn(&c->pid, path, &fa, &at, argv, xt_env());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(fds[1]);
  if (rc != 0) {
    c->pid = 0;
    fail_msg("posix_spawn %s: %s", path, strerror(rc));
  }
  c->port = xt_read_port(c);
  return c;
}

/* Waits (bounded) for the child to exit and returns its wait status. */
static int xt_wait_exit(xt_child *c) {
  int st = 0;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  int pfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
  if (pfd >= 0) {
    xt_poll(pfd, POLLIN, deadline, "the example to exit");
    close(pfd);
    while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
    }
  } else {
    /* No pidfd (old kernel): poll the status, still bounded. */
    while (waitpid(c->pid, &st, WNOHANG) == 0) {
      if (tu_now_ns() > deadline)
        fail_msg("%s did not exit within %d s", c->name, TU_WAIT_S);
      tu_sleep_ms(1);
    }
  }
  c->pid = 0;
  close(c->out);
  return st;
}

/* SIGTERM, then the child must exit with status 0 in bounded time. */
static void xt_stop(xt_child *c) {
  assert_int_equal(kill(c->pid, SIGTERM), 0);
  int st = xt_wait_exit(c);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("%s (%s) after SIGTERM: %s %d", c->name, g_backend,
             WIFEXITED(st) ? "exit status" : "killed by signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* Kills what a failed test left running. */
static int xt_teardown(void **state) {
  (void)state;
  for (int i = 0; i < g_nchildren; i++) {
    xt_child *c = &g_children[i];
    if (c->pid > 0) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, NULL, 0);
      close(c->out);
      c->pid = 0;
    }
  }
  g_nchildren = 0;
  return 0;
}

static bool xt_uring_available(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  int fd = (int)syscall(__NR_io_uring_setup, 4, &p);
  if (fd < 0)
    return false;
  close(fd);
  return true;
}

/* Sets the backend of this test; skips uring where it cannot be set up. */
static void xt_begin(void **state, const char *what) {
  g_backend = *state;
  if (!strcmp(g_backend, "uring") && !xt_uring_available()) {
    print_message("io_uring unavailable here: %s on uring skipped\n", what);
    skip();
  }
  tu_phase(what);
}

/* ------------------------------------------------------------------ echo */

/* Sends len pseudo-random bytes to port while reading, half-closes after
 * the last, and checks that exactly the same bytes come back, then EOF. */
/* A Unix stream connection to path (a path, or "@name"). */
static int xt_connect_unix(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_un a;
  int len = weft_unix_addr(&a, path);
  assert_true(len > 0);
  if (connect(fd, (struct sockaddr *)&a, (socklen_t)len) < 0)
    fail_msg("connect to %s: %s", path, strerror(errno));
  return fd;
}

/* Sends len pseudo-random bytes on fd while reading them back, then
 * half-closes and expects EOF; closes fd. */
static void xt_echo_round_trip_fd(int fd, size_t len, uint64_t seed) {
  static unsigned char out[ECHO_BYTES], in[ECHO_BYTES];
  assert_true(len <= ECHO_BYTES);
  for (size_t i = 0; i < len; i += 8) {
    uint64_t r = tu_rand(&seed);
    memcpy(out + i, &r, len - i < 8 ? len - i : 8);
  }
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  size_t sent = 0, got = 0;
  bool eof = false;
  while (!eof) {
    short ev = xt_poll(fd, POLLIN | (sent < len ? POLLOUT : 0), deadline,
                       "the echoed bytes");
    if ((ev & POLLOUT) && sent < len) {
      size_t chunk = len - sent < 65536 ? len - sent : 65536;
      ssize_t n = send(fd, out + sent, chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        fail_msg("send after %zu bytes: %s", sent, strerror(errno));
      if (n > 0 && (sent += (size_t)n) == len)
        assert_int_equal(shutdown(fd, SHUT_WR), 0);
    }
    if (ev & (POLLIN | POLLHUP | POLLERR)) {
      unsigned char extra;
      ssize_t n = got < len ? recv(fd, in + got, len - got, MSG_DONTWAIT)
                            : recv(fd, &extra, 1, MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        fail_msg("recv after %zu of %zu bytes: %s", got, len, strerror(errno));
      if (n == 0 && got < len)
        fail_msg("EOF after %zu of %zu bytes", got, len);
      if (n > 0 && got == len)
        fail_msg("more bytes than were sent");
      if (n == 0)
        eof = true;
      if (n > 0)
        got += (size_t)n;
    }
  }
  for (size_t i = 0; i < len; i++)
    if (in[i] != out[i])
      fail_msg("byte %zu differs: sent %u, got %u", i, out[i], in[i]);
  close(fd);
}

static void xt_echo_round_trip(unsigned port, size_t len, uint64_t seed) {
  xt_echo_round_trip_fd(xt_connect(port), len, seed);
}

static void test_echo(void **state) {
  xt_begin(state, "echo");
  xt_child *echo = xt_start("echo", NULL);
  xt_echo_round_trip(echo->port, ECHO_BYTES, 1);
  /* Left open across the SIGTERM: the shutdown closes it. */
  int idle = xt_connect(echo->port);
  xt_send_str(idle, "ping");
  xt_expect(idle, "ping", 4, "echo of 'ping'");
  xt_stop(echo);
  close(idle);
}

/* echo --unix: the same over a Unix socket, on a path (its file gone
 * after the SIGTERM) and in the abstract namespace. */
static void test_echo_unix(void **state) {
  xt_begin(state, "echo --unix");
  char path[64], name[64];
  snprintf(path, sizeof path, "/tmp/weft-echo-%d.sock", (int)getpid());
  snprintf(name, sizeof name, "@weft-echo-%d", (int)getpid());
  const char *const on_path[] = {"--unix", path, NULL};
  xt_child *echo = xt_start("echo", on_path);
  xt_echo_round_trip_fd(xt_connect_unix(path), ECHO_BYTES, 4);
  int idle = xt_connect_unix(path);
  xt_send_str(idle, "ping");
  xt_expect(idle, "ping", 4, "echo of 'ping' over a Unix socket");
  xt_stop(echo);
  close(idle);
  assert_int_equal(access(path, F_OK), -1); /* the listener removed it */
  const char *const abstract[] = {"--unix", name, NULL};
  echo = xt_start("echo", abstract);
  xt_echo_round_trip_fd(xt_connect_unix(name), 4096, 5);
  xt_stop(echo);
}

/* udp_echo: datagrams of 1..1400 bytes in bursts come back unchanged. */
static void test_udp_echo(void **state) {
  xt_begin(state, "udp_echo");
  xt_child *echo = xt_start("udp_echo", NULL);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct timeval tv = {TU_WAIT_S, 0};
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)echo->port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  static unsigned char out[16][1400], in[1500];
  uint64_t seed = 9;
  for (int round = 0; round < 50; round++) {
    size_t lens[16];
    for (int i = 0; i < 16; i++) {
      lens[i] = 1 + tu_rand(&seed) % 1400;
      for (size_t k = 0; k < lens[i]; k++)
        out[i][k] = (unsigned char)tu_rand(&seed);
      assert_int_equal(send(fd, out[i], lens[i], 0), (ssize_t)lens[i]);
    }
    for (int i = 0; i < 16; i++) {
      ssize_t n;
      /* With SO_RCVTIMEO a stop of the process (a job-control stop, a
       * cgroup freeze) ends the wait with EINTR, even with no handler. */
      do
        n = recv(fd, in, sizeof in, 0);
      while (n < 0 && errno == EINTR);
      if (n < 0)
        fail_msg("no echo of datagram %d of round %d: %s", i, round,
                 strerror(errno));
      assert_int_equal(n, (ssize_t)lens[i]);
      assert_memory_equal(in, out[i], lens[i]);
    }
  }
  close(fd);
  xt_stop(echo);
}

/* ------------------------------------------------------------ http_hello */

#define HTTP_HEAD                                                              \
  "HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
static const char resp_keep[] = HTTP_HEAD "\r\nHello, World!";
static const char resp_close[] =
    HTTP_HEAD "Connection: close\r\n\r\nHello, World!";
static const char req_plain[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
static const char req_close[] =
    "GET /bye HTTP/1.1\r\nHost: localhost\r\nconnection: Close\r\n\r\n";

/* http_hello's admin endpoint: GET /metrics gives the counters as
 * Prometheus text, with a Content-Length that matches; anything else 404. */
static void xt_check_metrics(unsigned port) {
  int m = xt_connect(port);
  xt_send_str(m, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  const char *got = xt_read_to_close(m);
  close(m);
  const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; "
                     "version=0.0.4\r\nContent-Length: ";
  if (strncmp(got, head, strlen(head)) != 0)
    fail_msg("GET /metrics: got \"%.200s\"", got);
  size_t clen = strtoul(got + strlen(head), NULL, 10);
  const char *body = strstr(got, "\r\n\r\n");
  assert_non_null(body);
  body += 4;
  assert_int_equal(strlen(body), clen);
  const char *s0 = strstr(body, "weft_handlers_run_total{shard=\"0\"} ");
  const char *s1 = strstr(body, "weft_handlers_run_total{shard=\"1\"} ");
  assert_non_null(s0);
  assert_non_null(s1);
  assert_true(strtoull(s0 + 35, NULL, 10) + strtoull(s1 + 35, NULL, 10) > 0);
  assert_non_null(strstr(body, "# TYPE weft_tcp_live gauge\n"));
  assert_non_null(strstr(body, "# TYPE weft_io_delay_seconds summary\n"));
  const char *io = strstr(body, "weft_io_delay_seconds_count ");
  assert_non_null(io); /* the requests' reads went through callbacks */
  assert_true(strtoull(io + 28, NULL, 10) > 0);
  m = xt_connect(port);
  xt_send_str(m, "GET /other HTTP/1.1\r\n\r\n");
  got = xt_read_to_close(m);
  close(m);
  if (strncmp(got, "HTTP/1.1 404 ", 13) != 0)
    fail_msg("GET /other on the metrics port: got \"%.200s\"", got);
}

static void test_http(void **state) {
  xt_begin(state, "http_hello");
  const char *const margs[] = {"--metrics", "0", NULL};
  xt_child *h = xt_start("http_hello", margs);
  char mline[128];
  unsigned mport;
  xt_read_line(h, mline, sizeof mline, "the 'metrics on PORT' line");
  if (sscanf(mline, "metrics on %u", &mport) != 1 || !mport)
    fail_msg("http_hello: unexpected second line \"%s\"", mline);
  const size_t klen = sizeof(resp_keep) - 1;

  int ka = xt_connect(h->port);
  xt_send_str(ka, req_plain);
  xt_expect(ka, resp_keep, klen, "first keep-alive response");
  char pair[2 * sizeof(req_plain)], two[2 * sizeof(resp_keep)];
  snprintf(pair, sizeof(pair), "%s%s", req_plain, req_plain);
  snprintf(two, sizeof(two), "%s%s", resp_keep, resp_keep);
  xt_send_str(ka, pair);
  xt_expect(ka, two, 2 * klen, "responses to the pipelined pair");
  /* A head longer than the connection's first buffer (960 bytes): served
   * from the 8 KiB one, and so is the next. */
  static char padded[3000];
  memset(padded, 'p', sizeof(padded));
  memcpy(padded, "GET / HTTP/1.1\r\nX-Pad: ", 23);
  memcpy(padded + sizeof(padded) - 4, "\r\n\r\n", 4);
  xt_send_all(ka, padded, sizeof(padded));
  xt_expect(ka, resp_keep, klen, "the response to a 3000-byte head");
  xt_send_str(ka, req_plain);
  xt_expect(ka, resp_keep, klen, "the response after the long head");

  int cl = xt_connect(h->port);
  xt_send_str(cl, req_close);
  const char *got = xt_read_to_close(cl);
  assert_string_equal(got, resp_close);
  close(cl);

  int mix = xt_connect(h->port);
  char both[sizeof(req_plain) + sizeof(req_close)];
  snprintf(both, sizeof(both), "%s%s", req_plain, req_close);
  xt_send_str(mix, both);
  got = xt_read_to_close(mix);
  char want[sizeof(resp_keep) + sizeof(resp_close)];
  snprintf(want, sizeof(want), "%s%s", resp_keep, resp_close);
  assert_string_equal(got, want);
  close(mix);

  /* Exactly a buffer's worth, so nothing is left unread at the close. */
  int big = xt_connect(h->port);
  static char huge[8192];
  memset(huge, 'a', sizeof(huge));
  memcpy(huge, "GET / HTTP/1.1\r\nX-Pad: ", 23);
  xt_send_all(big, huge, 8192);
  got = xt_read_to_close(big);
  if (strncmp(got, "HTTP/1.1 431 ", 13) != 0)
    fail_msg("oversized request: got \"%s\"", got);
  close(big);

  xt_check_metrics(mport);
  xt_stop(h); /* ka is still open */
  close(ka);
}

/* ------------------------------------------------------------- tcp_proxy */

/* A loopback port nobody listens on (bound, then released). */
static unsigned xt_dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

/* The proxy closes the client: it reads EOF (or a reset), nothing else. */
static void xt_expect_closed(int fd, const char *what) {
  tu_phase(what);
  const char *got = xt_read_to_close(fd);
  if (*got)
    fail_msg("%s: got \"%s\" before the close", what, got);
}

static void test_proxy(void **state) {
  xt_begin(state, "tcp_proxy");
  xt_child *echo = xt_start("echo", NULL);
  char backend[64], dead[64];
  snprintf(backend, sizeof(backend), "127.0.0.1:%u", echo->port);
  const char *const args[] = {"--backend", backend, NULL};
  xt_child *p = xt_start("tcp_proxy", args);
  xt_echo_round_trip(p->port, ECHO_BYTES, 2);
  xt_echo_round_trip(p->port, 1000, 3);
  int open_pair = xt_connect(p->port);
  xt_send_str(open_pair, "through");
  xt_expect(open_pair, "through", 7, "a short round trip");

  /* Refused at once; the one-minute timeout does not come into it. */
  snprintf(dead, sizeof(dead), "127.0.0.1:%u", xt_dead_port());
  const char *const dead_args[] = {"--backend", dead, "--connect-timeout-ms",
                                   "60000", NULL};
  xt_child *pd = xt_start("tcp_proxy", dead_args);
  int fd = xt_connect(pd->port);
  xt_expect_closed(fd, "client of a proxy whose backend refuses");
  close(fd);

  const char *const idle_args[] = {"--backend", backend, "--idle-timeout-ms",
                                   "200", NULL};
  xt_child *pi = xt_start("tcp_proxy", idle_args);
  fd = xt_connect(pi->port);
  xt_expect_closed(fd, "idle client of a proxy with a 200 ms idle timeout");
  close(fd);

  tu_phase("tcp_proxy: stopping");
  xt_stop(pi);
  xt_stop(pd);
  xt_stop(p); /* open_pair is still open */
  xt_stop(echo);
  close(open_pair);
}

/* ------------------------------------------------------------------ chat */

typedef struct xt_lines {
  int fd;
  size_t len;
  char buf[4096];
} xt_lines;

static void xt_lines_open(xt_lines *l, unsigned port) {
  l->fd = xt_connect(port);
  l->len = 0;
}

/* The next line (without its '\n') into out. */
static void xt_line(xt_lines *l, char *out, size_t cap, const char *who) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  char *nl;
  while (!(nl = memchr(l->buf, '\n', l->len))) {
    if (l->len == sizeof(l->buf))
      fail_msg("%s: line too long", who);
    ssize_t n =
        xt_recv_some(l->fd, l->buf + l->len, sizeof(l->buf) - l->len, deadline);
    if (n <= 0)
      fail_msg("%s: connection closed while waiting for a line", who);
    l->len += (size_t)n;
  }
  size_t n = (size_t)(nl - l->buf);
  if (n >= cap)
    fail_msg("%s: line too long", who);
  memcpy(out, l->buf, n);
  out[n] = '\0';
  l->len -= n + 1;
  memmove(l->buf, nl + 1, l->len);
}

static void xt_expect_line(xt_lines *l, const char *want, const char *who) {
  char got[1024];
  xt_line(l, got, sizeof(got), who);
  if (strcmp(got, want) != 0)
    fail_msg("%s: expected \"%s\", got \"%s\"", who, want, got);
}

/* After the server exited: nothing more came to this client. */
static void xt_expect_no_more(xt_lines *l, const char *who) {
  const char *rest = xt_read_to_close(l->fd);
  if (l->len || *rest)
    fail_msg("%s got more than expected: \"%.*s%s\"", who, (int)l->len, l->buf,
             rest);
  close(l->fd);
}

static void test_chat(void **state) {
  xt_begin(state, "chat");
  xt_child *chat = xt_start("chat", NULL);
  xt_lines a, b, c, d;
  xt_lines_open(&a, chat->port);
  xt_send_str(a.fd, "JOIN A alice\n");
  xt_expect_line(&a, "* alice joined", "alice");
  xt_lines_open(&b, chat->port);
  xt_send_str(b.fd, "JOIN A bob\r\n");
  xt_expect_line(&b, "* bob joined", "bob");
  xt_expect_line(&a, "* bob joined", "alice");
  xt_lines_open(&c, chat->port);
  xt_send_str(c.fd, "JOIN B carol\n");
  xt_expect_line(&c, "* carol joined", "carol");

  xt_send_str(a.fd, "hello from alice\n");
  xt_expect_line(&b, "alice: hello from alice", "bob");
  xt_send_str(b.fd, "hi alice\r\n");
  xt_expect_line(&a, "bob: hi alice", "alice");
  close(b.fd);
  xt_expect_line(&a, "* bob left", "alice");

  /* Without a nick: an id, announced to the newcomer and to carol. */
  xt_lines_open(&d, chat->port);
  xt_send_str(d.fd, "JOIN B\n");
  char joined[256], id[256], want[300];
  xt_line(&d, joined, sizeof(joined), "nameless");
  size_t n = strlen(joined);
  if (n < 10 || strncmp(joined, "* ", 2) || strcmp(joined + n - 7, " joined"))
    fail_msg("nameless: unexpected join line \"%s\"", joined);
  snprintf(id, sizeof(id), "%.*s", (int)(n - 9), joined + 2);
  xt_expect_line(&c, joined, "carol");
  xt_send_str(c.fd, "hi there\n");
  xt_expect_line(&d, "carol: hi there", "nameless");
  xt_send_str(d.fd, "hello B\n");
  snprintf(want, sizeof(want), "%s: hello B", id);
  xt_expect_line(&c, want, "carol");

  tu_phase("chat: stopping");
  xt_stop(chat); /* alice, carol and the nameless one are connected */
  xt_expect_no_more(&a, "alice");
  xt_expect_no_more(&c, "carol");
  xt_expect_no_more(&d, "nameless");
}

/* file_server: files under a fresh directory, over keep-alive. */
#define FS_BIG (300u * 1024)

static void fs_write_file(const char *dir, const char *name, const void *p,
                          size_t n) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, p, n), (ssize_t)n);
  close(fd);
}

/* Receives a head equal to head, then n bytes equal to body. */
static void fs_expect(int fd, const char *head, const void *body, size_t n,
                      const char *what) {
  xt_expect(fd, head, strlen(head), what);
  unsigned char *got = malloc(n + 1);
  assert_non_null(got);
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (size_t have = 0; have < n;) {
    ssize_t k = xt_recv_some(fd, got + have, n - have, deadline);
    if (k <= 0)
      fail_msg("%s: body ended after %zu of %zu bytes", what, have, n);
    have += (size_t)k;
  }
  if (memcmp(got, body, n) != 0)
    fail_msg("%s: the body differs from the file", what);
  free(got);
}

static void test_file_server(void **state) {
  xt_begin(state, "file_server");
  char dir[] = "/tmp/weft-files-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sub[PATH_MAX];
  snprintf(sub, sizeof sub, "%s/sub", dir);
  assert_int_equal(mkdir(sub, 0755), 0);
  static unsigned char big[FS_BIG]; /* not leaked when a check fails */
  uint64_t seed = 5;
  for (size_t i = 0; i < FS_BIG; i++)
    big[i] = (unsigned char)tu_rand(&seed);
  fs_write_file(dir, "big.bin", big, FS_BIG);
  fs_write_file(dir, "index.html", "<p>hi</p>", 9);
  fs_write_file(dir, "sub/a.txt", "0123456789", 10);
  const char *const args[] = {"--root", dir, NULL};
  xt_child *srv = xt_start("file_server", args);

  int ka = xt_connect(srv->port);
  xt_send_str(ka, "GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n");
  fs_expect(ka,
            "HTTP/1.1 200 OK\r\nContent-Length: 307200\r\nContent-Type: "
            "application/octet-stream\r\n\r\n",
            big, FS_BIG, "GET /big.bin");
  /* Pipelined: HEAD, a range, the index, then refusals, on one
   * connection that stays open throughout. */
  xt_send_str(ka, "HEAD /sub/a.txt HTTP/1.1\r\n\r\n"
                  "GET /sub/a.txt HTTP/1.1\r\nRange: bytes=2-4\r\n\r\n"
                  "GET /sub/a.txt HTTP/1.1\r\nrange: bytes=-3\r\n\r\n"
                  "GET / HTTP/1.1\r\n\r\n");
  const char *txt = "Content-Type: text/plain\r\n";
  char want[512];
  snprintf(want, sizeof want,
           "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n%s\r\n"
           "HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\n%s"
           "Content-Range: bytes 2-4/10\r\n\r\n234"
           "HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\n%s"
           "Content-Range: bytes 7-9/10\r\n\r\n789"
           "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Type: "
           "text/html\r\n\r\n<p>hi</p>",
           txt, txt, txt);
  xt_expect(ka, want, strlen(want), "HEAD, two ranges and the index");
  xt_send_str(ka, "GET /missing HTTP/1.1\r\n\r\n"
                  "GET /../etc/passwd HTTP/1.1\r\n\r\n"
                  "GET /sub/%2e%2e/big.bin HTTP/1.1\r\n\r\n"
                  "GET /sub HTTP/1.1\r\n\r\n"
                  "POST / HTTP/1.1\r\n\r\n"
                  "GET /sub/a.txt HTTP/1.1\r\nRange: bytes=10-\r\n\r\n");
  static const char refusals[] =
      "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
      "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
      "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
      "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
      "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n"
      "Allow: GET, HEAD\r\n\r\n"
      "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n"
      "Content-Range: bytes */10\r\n\r\n";
  xt_expect(ka, refusals, sizeof refusals - 1, "the refusals");
  xt_send_str(ka, "GET /sub/a.txt HTTP/1.1\r\nConnection: close\r\n\r\n");
  snprintf(want, sizeof want,
           "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n%s"
           "Connection: close\r\n\r\n0123456789",
           txt);
  assert_string_equal(xt_read_to_close(ka), want);
  close(ka);
  /* Left open across the SIGTERM, in the middle of a large body. */
  int idle = xt_connect(srv->port);
  xt_send_str(idle, "GET /big.bin HTTP/1.1\r\n\r\n");
  xt_stop(srv);
  close(idle);
  const char *names[] = {"big.bin", "index.html", "sub/a.txt", "sub", ""};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    assert_int_equal(i < 3 ? unlink(path) : rmdir(path), 0);
  }
}

/* ------------------------------------------------------------------ main */

/* Each check once per backend, named after both. */
#define XT_ON(fn, backend)                                                     \
  { #fn "/" backend, fn, NULL, xt_teardown, backend }
#define XT_BOTH(fn) XT_ON(fn, "epoll"), XT_ON(fn, "uring")

int main(void) {
  tu_watchdog_start();
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      XT_BOTH(test_echo), XT_BOTH(test_echo_unix),   XT_BOTH(test_udp_echo),
      XT_BOTH(test_http), XT_BOTH(test_file_server), XT_BOTH(test_proxy),
      XT_BOTH(test_chat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
