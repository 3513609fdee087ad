/*
 * test_unix_fds: passing descriptors over Unix connections
 * (weft_tcp_send_fds, weft_tcp_set_fd_limit, weft_tcp_take_fd).
 *
 *  - Round trip, weft to weft: 20 writes of plain bytes alternate with 20
 *    writes that carry two descriptors each (a pipe's write end, and a
 *    file), read by a server in reads of 16 bytes. Every descriptor taken
 *    names the open file sent (same device and inode), in order, and was
 *    taken in the callback of the read that returned the first byte of
 *    the write that carried it; every write callback runs once, with 0.
 *  - The bound: a peer sends one byte with 3 descriptors to a connection
 *    whose limit is 1, 2 or 3: that many are taken, then -EMFILE (once;
 *    not at 3), then -EAGAIN, and no more ever reach the process (weft
 *    logs an error if the kernel hands it one beyond the limit).
 *    The third never reaches the process: its pipe reads end of file once
 *    the test closes its own copy. With no limit (the default) none is
 *    received (take gives -EAGAIN) and every pipe reads end of file; with
 *    a limit but nothing taken, the close of the connection closes them.
 *  - Bad input, as the calls' errors: -EAFNOSUPPORT on a TCP connection,
 *    -EINVAL (len 0, nfds 0 and 254, fds NULL, a limit over 4096),
 *    -EBADF (a negative descriptor), -EBUSY (a limit set after a read),
 *    -EPERM (off the strand); a descriptor that is not open fails its
 *    write with -EBADF in the write callback.
 */
#include <sys/stat.h>
#include <sys/un.h>

#include "testutil.h"

#define NWORKERS 2
#define NMSG 20
#define NPIPES 4
#define PLAIN "plain..."    /* 8 bytes */
#define CARRIER "F-payload" /* 9 bytes: its first byte carries two fds */
#define UNIT (sizeof(PLAIN) - 1 + sizeof(CARRIER) - 1)
#define RBUF 16
#define MAXTAKEN (2 * NMSG + 8)

static tu_count g_errors; /* weft's WEFT_LOG_ERROR messages */

static void count_errors(void *ctx, int level, const char *msg) {
  (void)ctx;
  fprintf(stderr, "weft: %s\n", msg);
  if (level == WEFT_LOG_ERROR)
    atomic_fetch_add(&g_errors, 1);
}

static void rt_make(weft_rt **rt) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = NWORKERS;
  cfg.log_fn = count_errors;
  tu_assert_rc(weft_rt_create(rt, &cfg), 0);
  tu_assert_backend(*rt);
}

static void rt_end(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static int listen_abstract(weft_rt *rt, const char *tag, weft_accept_fn fn,
                           void *arg, weft_listener **l,
                           struct sockaddr_un *a) {
  char name[64];
  snprintf(name, sizeof name, "@weft-fds-%d-%s", (int)getpid(), tag);
  int len = weft_unix_addr(a, name);
  assert_true(len > 0);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)a, (unsigned)len, NULL,
                               fn, arg, l),
               0);
  return len;
}

/* ------------------------------------------------------------ the server */

typedef struct taken {
  int fd;
  size_t from, to; /* the bytes of the read it came with */
} taken;

typedef struct rcv {
  unsigned limit;
  bool keep; /* leave the descriptors to the close */
  int limit_rc;
  size_t got;
  char buf[RBUF];
  char all[NMSG * UNIT + 16];
  taken t[MAXTAKEN];
  unsigned ntaken, emfile, eagain;
  tu_event done;   /* end of file or an error */
  tu_event closed; /* the close callback */
} rcv;

static void rcv_read(void *arg, weft_tcp *c, long n) {
  rcv *r = arg;
  if (n <= 0) {
    TU_CHECK_RC((int)n, 0);
    weft_tcp_close(c, 0);
    tu_event_add(&r->done, 1);
    return;
  }
  if (r->got + (size_t)n <= sizeof r->all)
    memcpy(r->all + r->got, r->buf, (size_t)n);
  size_t from = r->got;
  r->got += (size_t)n;
  int fd;
  while (!r->keep && (fd = weft_tcp_take_fd(c)) >= 0) {
    TU_CHECK(r->ntaken < MAXTAKEN);
    if (r->ntaken < MAXTAKEN)
      r->t[r->ntaken++] = (taken){fd, from, r->got};
  }
  if (!r->keep) {
    if (fd == -EMFILE)
      r->emfile++;
    else if (fd == -EAGAIN)
      r->eagain++;
    else
      TU_CHECKF(false, "weft_tcp_take_fd: %d", fd);
  }
  TU_CHECK_RC(weft_tcp_read(c, r->buf, sizeof r->buf, rcv_read, r), 0);
}

static void rcv_closed(void *data, weft_tcp *c) {
  (void)c;
  tu_event_add(&((rcv *)data)->closed, 1);
}

static void rcv_accept(void *arg, weft_tcp *c) {
  rcv *r = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, r, rcv_closed), 0);
  r->limit_rc = r->limit ? weft_tcp_set_fd_limit(c, r->limit) : 0;
  TU_CHECK_RC(weft_tcp_read(c, r->buf, sizeof r->buf, rcv_read, r), 0);
}

static void rcv_init(rcv *r, unsigned limit) {
  memset(r, 0, sizeof *r);
  r->limit = limit;
  r->limit_rc = 1;
  tu_event_init(&r->done);
  tu_event_init(&r->closed);
}

static void rcv_fini(rcv *r) {
  for (unsigned i = 0; i < r->ntaken; i++)
    close(r->t[i].fd);
  tu_event_destroy(&r->done);
  tu_event_destroy(&r->closed);
}

/* ------------------------------------------------------------ round trip */

typedef struct snd {
  int fds[NMSG][2];
  tu_count wrote_ok, wrote_bad;
  tu_event closed;
} snd;

static void snd_wrote(void *arg, weft_tcp *c, int status) {
  snd *s = arg;
  (void)c;
  atomic_fetch_add(status == 0 ? &s->wrote_ok : &s->wrote_bad, 1);
  if (atomic_load(&s->wrote_ok) + atomic_load(&s->wrote_bad) == 2 * NMSG)
    weft_tcp_close(c, 0);
}

static void snd_closed(void *data, weft_tcp *c) {
  (void)c;
  tu_event_add(&((snd *)data)->closed, 1);
}

static void snd_connected(void *arg, weft_tcp *c, int status) {
  snd *s = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, s, snd_closed), 0);
  TU_CHECK_RC(status, 0);
  if (status)
    return;
  for (int i = 0; i < NMSG; i++) {
    TU_CHECK_RC(weft_tcp_write(c, PLAIN, sizeof(PLAIN) - 1, snd_wrote, s), 0);
    TU_CHECK_RC(weft_tcp_send_fds(c, CARRIER, sizeof(CARRIER) - 1, s->fds[i], 2,
                                  snd_wrote, s),
                0);
  }
}

static bool same_file(int a, int b) {
  struct stat x, y;
  return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev &&
         x.st_ino == y.st_ino;
}

static void test_round_trip(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  rcv r;
  rcv_init(&r, 8);
  weft_listener *l;
  struct sockaddr_un a;
  int alen = listen_abstract(rt, "rt", rcv_accept, &r, &l, &a);
  int pipes[NPIPES][2];
  for (int i = 0; i < NPIPES; i++)
    assert_int_equal(pipe2(pipes[i], O_CLOEXEC), 0);
  int file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  assert_true(file >= 0);
  static snd s;
  memset(&s, 0, sizeof s);
  tu_event_init(&s.closed);
  for (int i = 0; i < NMSG; i++) {
    s.fds[i][0] = pipes[i % NPIPES][1];
    s.fds[i][1] = file;
  }
  weft_tcp *c;
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, (unsigned)alen,
                                0, snd_connected, &s, &c),
               0);
  tu_event_wait(&r.done, 1, "the server's end of file");
  tu_event_wait(&s.closed, 1, "the sender's close callback");
  tu_event_wait(&r.closed, 1, "the server's close callback");
  tu_listener_close(l);
  rt_end(rt);

  tu_assert_rc(r.limit_rc, 0);
  assert_int_equal(atomic_load(&s.wrote_ok), 2 * NMSG);
  assert_int_equal(atomic_load(&s.wrote_bad), 0);
  assert_int_equal(r.got, NMSG * UNIT);
  for (int i = 0; i < NMSG; i++) {
    assert_memory_equal(r.all + i * UNIT, PLAIN, sizeof(PLAIN) - 1);
    assert_memory_equal(r.all + i * UNIT + sizeof(PLAIN) - 1, CARRIER,
                        sizeof(CARRIER) - 1);
  }
  assert_int_equal(r.ntaken, 2 * NMSG);
  assert_int_equal(r.emfile, 0);
  for (unsigned j = 0; j < r.ntaken; j++) {
    unsigned i = j / 2;
    size_t first = i * UNIT + sizeof(PLAIN) - 1; /* its carrier's byte */
    assert_true(same_file(r.t[j].fd, j % 2 ? file : pipes[i % NPIPES][1]));
    if (r.t[j].from > first || r.t[j].to <= first)
      fail_msg("descriptor %u came with bytes %zu..%zu, not with byte %zu", j,
               r.t[j].from, r.t[j].to, first);
    int fl = fcntl(r.t[j].fd, F_GETFD);
    assert_true(fl >= 0 && (fl & FD_CLOEXEC));
  }
  rcv_fini(&r);
  for (int i = 0; i < NPIPES; i++) {
    close(pipes[i][0]);
    close(pipes[i][1]);
  }
  close(file);
  tu_event_destroy(&s.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------------- the bound */

/* Waits until pipe p's read end sees end of file: every write end closed,
 * in this process too. */
static void wait_eof(int p[2], const char *what) {
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  int fl = fcntl(p[0], F_GETFL);
  assert_int_equal(fcntl(p[0], F_SETFL, fl | O_NONBLOCK), 0);
  for (;;) {
    char ch;
    ssize_t n = read(p[0], &ch, 1);
    if (n == 0)
      return;
    if (tu_now_ns() > deadline)
      fail_msg("%s: a write end is still open", what);
    tu_sleep_ms(2);
  }
}

/* One byte carrying the write ends of 3 pipes, from a plain client; the
 * server's limit is limit (keep: it takes none). */
static void bound_case(unsigned limit, bool keep, const char *tag) {
  weft_rt *rt;
  rt_make(&rt);
  rcv r;
  rcv_init(&r, limit);
  r.keep = keep;
  weft_listener *l;
  struct sockaddr_un a;
  int alen = listen_abstract(rt, tag, rcv_accept, &r, &l, &a);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, (socklen_t)alen), 0);
  int p[3][2];
  for (int i = 0; i < 3; i++)
    assert_int_equal(pipe2(p[i], O_CLOEXEC), 0);
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(3 * sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec v = {.iov_base = "x", .iov_len = 1};
  struct msghdr m = {.msg_iov = &v,
                     .msg_iovlen = 1,
                     .msg_control = ctl.b,
                     .msg_controllen = sizeof ctl.b};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(3 * sizeof(int));
  int ends[3] = {p[0][1], p[1][1], p[2][1]};
  memcpy(CMSG_DATA(cm), ends, sizeof ends);
  assert_int_equal(sendmsg(fd, &m, MSG_NOSIGNAL), 1);
  for (int i = 0; i < 3; i++)
    close(p[i][1]);
  close(fd);
  tu_event_wait(&r.done, 1, "the server's end of file");
  tu_event_wait(&r.closed, 1, "the server's close callback");
  tu_listener_close(l);
  rt_end(rt);
  assert_int_equal(atomic_load(&g_errors), 0); /* none beyond the room */
  tu_assert_rc(r.limit_rc, 0);
  assert_int_equal(r.got, 1);
  unsigned want = keep ? 0 : limit < 3 ? limit : 3;
  assert_int_equal(r.ntaken, want);
  if (!keep) {
    assert_int_equal(r.emfile, limit && limit < 3 ? 1 : 0);
    assert_int_equal(r.emfile + r.eagain, 1);
  }
  for (unsigned j = 0; j < r.ntaken; j++)
    assert_true(same_file(r.t[j].fd, p[j][0])); /* pipe j, in order */
  rcv_fini(&r);                                 /* closes what was taken */
  for (int i = 0; i < 3; i++) {
    wait_eof(p[i], tag);
    close(p[i][0]);
  }
}

static void test_bound(void **state) {
  (void)state;
  tu_reset_async_errors();
  bound_case(1, false, "limit1"); /* odd: the control buffer's padding */
  bound_case(2, false, "limit2");
  bound_case(3, false, "limit3");
  bound_case(0, false, "none");
  bound_case(8, false, "limit8");
  bound_case(4, true, "kept");
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------------- bad input */

typedef struct bad {
  weft_tcp *c;
  int rc[16];
  int closed_fd;
  char buf[8];
  tu_count wrote;
  int wrote_status;
  tu_event done, closed;
} bad;

static void bad_wrote(void *arg, weft_tcp *c, int status) {
  bad *b = arg;
  (void)c;
  b->wrote_status = status;
  atomic_fetch_add(&b->wrote, 1);
  tu_event_add(&b->done, 1);
}

static void bad_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  if (n <= 0)
    weft_tcp_close(c, 0);
}

static void bad_closed(void *data, weft_tcp *c) {
  (void)c;
  tu_event_add(&((bad *)data)->closed, 1);
}

static void bad_accept(void *arg, weft_tcp *c) {
  bad *b = arg;
  int fds[254] = {0};
  TU_CHECK_RC(weft_tcp_set_data(c, b, bad_closed), 0);
  b->c = c;
  b->rc[0] = weft_tcp_set_fd_limit(c, WEFT_FDS_HELD_MAX + 1);
  b->rc[1] = weft_tcp_send_fds(c, "x", 0, fds, 1, NULL, NULL);
  b->rc[2] = weft_tcp_send_fds(c, "x", 1, fds, 0, NULL, NULL);
  b->rc[3] = weft_tcp_send_fds(c, "x", 1, fds, 254, NULL, NULL);
  b->rc[4] = weft_tcp_send_fds(c, "x", 1, NULL, 1, NULL, NULL);
  fds[0] = -1;
  b->rc[5] = weft_tcp_send_fds(c, "x", 1, fds, 1, NULL, NULL);
  b->rc[6] = weft_tcp_set_fd_limit(c, 4);
  b->rc[7] = weft_tcp_take_fd(c);
  b->rc[8] = weft_tcp_read(c, b->buf, sizeof b->buf, bad_read, b);
  b->rc[9] = weft_tcp_set_fd_limit(c, 8);
  b->rc[10] = weft_tcp_take_fd(NULL);
  b->rc[11] = weft_tcp_set_fd_limit(NULL, 1);
  fds[0] = b->closed_fd;
  b->rc[12] = weft_tcp_send_fds(c, "x", 1, fds, 1, bad_wrote, b);
}

static void tcp_accept(void *arg, weft_tcp *c) {
  bad *b = arg;
  int fd = 0;
  TU_CHECK_RC(weft_tcp_set_data(c, b, bad_closed), 0);
  b->rc[13] = weft_tcp_set_fd_limit(c, 1);
  b->rc[14] = weft_tcp_send_fds(c, "x", 1, &fd, 1, NULL, NULL);
  weft_tcp_close(c, 0);
  tu_event_add(&b->done, 1);
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  static bad b;
  memset(&b, 0, sizeof b);
  tu_event_init(&b.done);
  tu_event_init(&b.closed);
  /* A descriptor number that is not open (one above those in use, since
   * the runtime opens more of its own). */
  b.closed_fd = 900;
  while (fcntl(b.closed_fd, F_GETFD) >= 0)
    b.closed_fd++;
  weft_listener *l;
  struct sockaddr_un a;
  int alen = listen_abstract(rt, "bad", bad_accept, &b, &l, &a);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, (socklen_t)alen), 0);
  tu_event_wait(&b.done, 1, "the write of a closed descriptor");
  assert_int_equal(b.rc[0], -EINVAL);
  assert_int_equal(b.rc[1], -EINVAL);
  assert_int_equal(b.rc[2], -EINVAL);
  assert_int_equal(b.rc[3], -EINVAL);
  assert_int_equal(b.rc[4], -EINVAL);
  assert_int_equal(b.rc[5], -EBADF);
  assert_int_equal(b.rc[6], 0);
  assert_int_equal(b.rc[7], -EAGAIN);
  assert_int_equal(b.rc[8], 0);
  assert_int_equal(b.rc[9], -EBUSY);
  assert_int_equal(b.rc[10], -EINVAL);
  assert_int_equal(b.rc[11], -EINVAL);
  assert_int_equal(b.rc[12], 0);
  assert_int_equal(atomic_load(&b.wrote), 1);
  assert_int_equal(b.wrote_status, -EBADF);
  tu_assert_rc(weft_tcp_take_fd(b.c), -EPERM); /* off the strand */
  close(fd);
  tu_event_wait(&b.closed, 1, "the Unix connection's close callback");
  tu_listener_close(l);

  weft_listener *tl;
  uint16_t port = tu_tcp_listen(rt, NULL, tcp_accept, &b, &tl);
  int tfd = tu_sock_connect(port, 0, 0);
  assert_true(tfd >= 0);
  tu_event_wait(&b.done, 2, "the TCP connection's calls");
  assert_int_equal(b.rc[13], -EAFNOSUPPORT);
  assert_int_equal(b.rc[14], -EAFNOSUPPORT);
  tu_event_wait(&b.closed, 2, "the TCP connection's close callback");
  close(tfd);
  tu_listener_close(tl);
  rt_end(rt);
  tu_event_destroy(&b.done);
  tu_event_destroy(&b.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
