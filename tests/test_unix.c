/*
 * test_unix: Unix domain stream sockets through the weft_tcp calls.
 *
 *  - Echo on a path: a weft client writes 256 KiB (scaled) in pieces to a
 *    weft server that echoes them; every byte comes back in order. Both
 *    ends see the test process as the peer (weft_tcp_peer_cred: pid, uid,
 *    gid); weft_listener_addr gives the path; TCP-only options fail with
 *    -EOPNOTSUPP; each close callback runs once; the listener's close
 *    removes its socket file before its done runs.
 *  - Abstract and autobound names: a plain client reaches a listener on
 *    "@name" and one on an address the kernel named; no file is made.
 *  - Socket files: a stale one (bound, never listened on, its socket
 *    closed) is replaced; one whose path fills sun_path (no NUL) is removed
 *    by the close; a live listener's file gives -EADDRINUSE and
 *    keeps serving; a regular file gives -EADDRINUSE and is left alone; a
 *    missing directory gives -ENOENT; a file replaced after the bind is
 *    not removed by the close.
 *  - Connects: to a missing path -ENOENT, to a stale file -ECONNREFUSED,
 *    to a listener whose backlog is full -EAGAIN: each through the connect
 *    callback, and the connection then closes itself (one close callback).
 *  - Bad input: weft_unix_addr's limits (107 bytes of path, 107 of abstract
 *    name after the '@'), NULL and empty paths; WEFT_LISTEN_SHARE with a
 *    Unix address; an addrlen larger than sockaddr_un; peer_cred of a TCP
 *    connection (-EAFNOSUPPORT), off the strand (-EPERM), NULL (-EINVAL).
 *  - Shutdown with Unix connections open: every close callback runs once.
 */
#include <sys/stat.h>
#include <sys/un.h>

#include "testutil.h"

#define NWORKERS 2

static char g_dir[64];

static void dir_make(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/weft-unix-XXXXXX");
  if (!mkdtemp(g_dir))
    fail_msg("mkdtemp: %s", strerror(errno));
}

static void path_in_dir(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", g_dir, name);
}

static bool file_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void rt_end(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static void rt_make(weft_rt **rt) {
  tu_rt_create(rt, NWORKERS, 0);
  tu_assert_backend(*rt);
}

/* ------------------------------------------------------------ echo server */

typedef struct srv {
  tu_event closed; /* server connections' close callbacks */
  tu_count accepted;
  weft_cred cred;
  int cred_rc, opt_rc;
} srv;

typedef struct sconn {
  srv *sv;
  weft_tcp *c;
  char buf[8192];
} sconn;

static void srv_read(void *arg, weft_tcp *c, long n);

static void srv_wrote(void *arg, weft_tcp *c, int status) {
  sconn *sc = arg;
  if (status != 0 ||
      weft_tcp_read(c, sc->buf, sizeof sc->buf, srv_read, sc) != 0)
    weft_tcp_close(c, 0);
}

static void srv_read(void *arg, weft_tcp *c, long n) {
  sconn *sc = arg;
  if (n <= 0 || weft_tcp_write(c, sc->buf, (size_t)n, srv_wrote, sc) != 0)
    weft_tcp_close(c, 0);
}

static void srv_closed(void *data, weft_tcp *c) {
  sconn *sc = data;
  (void)c;
  tu_event_add(&sc->sv->closed, 1);
  free(sc);
}

static void srv_accept(void *arg, weft_tcp *c) {
  srv *sv = arg;
  sconn *sc = calloc(1, sizeof *sc);
  TU_CHECK(sc != NULL);
  sc->sv = sv;
  sc->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, sc, srv_closed), 0);
  if (atomic_fetch_add(&sv->accepted, 1) == 0) {
    sv->cred_rc = weft_tcp_peer_cred(c, &sv->cred);
    sv->opt_rc = weft_tcp_nodelay(c, 1);
  }
  if (weft_tcp_read(c, sc->buf, sizeof sc->buf, srv_read, sc) != 0)
    weft_tcp_close(c, 0);
}

static void srv_init(srv *sv) {
  memset(sv, 0, sizeof *sv);
  tu_event_init(&sv->closed);
  sv->cred_rc = sv->opt_rc = 1;
}

/* ------------------------------------------------------------- weft client */

typedef struct cli {
  weft_tcp *c;
  unsigned char *out, *in;
  size_t len, sent, got;
  int status; /* connect's */
  weft_cred cred;
  int cred_rc, tcp_rc;
  tu_event done;   /* every byte back, or a failure */
  tu_event closed; /* the close callback */
  unsigned closes;
} cli;

#define PIECE 3000

static void cli_read(void *arg, weft_tcp *c, long n) {
  cli *cl = arg;
  if (n <= 0) {
    TU_CHECKF(false, "client read %ld at %zu of %zu", n, cl->got, cl->len);
    tu_event_add(&cl->done, 1);
    return;
  }
  cl->got += (size_t)n;
  if (cl->got == cl->len) {
    tu_event_add(&cl->done, 1);
    return;
  }
  size_t want = cl->len - cl->got;
  TU_CHECK_RC(weft_tcp_read(c, cl->in + cl->got, want, cli_read, cl), 0);
}

static void cli_wrote(void *arg, weft_tcp *c, int status) {
  cli *cl = arg;
  TU_CHECK_RC(status, 0);
  if (cl->sent < cl->len) {
    size_t n = cl->len - cl->sent < PIECE ? cl->len - cl->sent : PIECE;
    const unsigned char *p = cl->out + cl->sent;
    cl->sent += n;
    TU_CHECK_RC(weft_tcp_write(c, p, n, cli_wrote, cl), 0);
  }
}

static void cli_closed(void *data, weft_tcp *c) {
  cli *cl = data;
  (void)c;
  cl->closes++;
  tu_event_add(&cl->closed, 1);
}

static void cli_connected(void *arg, weft_tcp *c, int status) {
  cli *cl = arg;
  cl->status = status;
  TU_CHECK_RC(weft_tcp_set_data(c, cl, cli_closed), 0);
  if (status != 0) {
    tu_event_add(&cl->done, 1);
    return;
  }
  cl->cred_rc = weft_tcp_peer_cred(c, &cl->cred);
  TU_CHECK_RC(weft_tcp_read(c, cl->in, cl->len, cli_read, cl), 0);
  cli_wrote(cl, c, 0);
}

static void cli_init(cli *cl, size_t len) {
  memset(cl, 0, sizeof *cl);
  cl->len = len;
  cl->cred_rc = 1;
  cl->status = 1;
  tu_event_init(&cl->done);
  tu_event_init(&cl->closed);
  if (len) {
    cl->out = malloc(len);
    cl->in = calloc(1, len);
    assert_non_null(cl->out);
    assert_non_null(cl->in);
    uint64_t seed = 42;
    for (size_t i = 0; i < len; i++)
      cl->out[i] = (unsigned char)tu_rand(&seed);
  }
}

static void cli_fini(cli *cl) {
  free(cl->out);
  free(cl->in);
  tu_event_destroy(&cl->done);
  tu_event_destroy(&cl->closed);
}

static void cli_close(void *arg) {
  cli *cl = arg;
  TU_CHECK_RC(weft_tcp_close(cl->c, 0), 0);
}

static void assert_cred_is_me(const weft_cred *cr) {
  assert_int_equal(cr->pid, (int32_t)getpid());
  assert_int_equal(cr->uid, (uint32_t)getuid());
  assert_int_equal(cr->gid, (uint32_t)getgid());
}

/* --------------------------------------------------------------- the tests */

static void test_echo_path(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  char path[128];
  path_in_dir(path, sizeof path, "echo.sock");
  struct sockaddr_un a;
  int len = weft_unix_addr(&a, path);
  assert_true(len > 0);
  srv sv;
  srv_init(&sv);
  weft_listener *l;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               0);
  assert_true(file_exists(path));
  struct sockaddr_un got;
  unsigned glen = sizeof got;
  tu_assert_rc(weft_listener_addr(l, (struct sockaddr *)&got, &glen), 0);
  assert_int_equal(got.sun_family, AF_UNIX);
  assert_string_equal(got.sun_path, path);

  cli cl;
  cli_init(&cl, TU_SCALED(256 * 1024, 16 * 1024));
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, (unsigned)len,
                                0, cli_connected, &cl, &cl.c),
               0);
  tu_event_wait(&cl.done, 1, "the echo of every byte");
  assert_int_equal(cl.status, 0);
  assert_int_equal(cl.got, cl.len);
  assert_memory_equal(cl.in, cl.out, cl.len);
  tu_assert_rc(cl.cred_rc, 0);
  assert_cred_is_me(&cl.cred);
  tu_assert_rc(sv.cred_rc, 0);
  assert_cred_is_me(&sv.cred);
  tu_assert_rc(sv.opt_rc, -EOPNOTSUPP);

  tu_on_strand(weft_tcp_strand(cl.c), cli_close, &cl);
  tu_event_wait(&cl.closed, 1, "the client's close callback");
  tu_event_wait(&sv.closed, 1, "the server connection's close callback");
  tu_listener_close(l);
  assert_false(file_exists(path));
  rt_end(rt);
  assert_int_equal(cl.closes, 1);
  assert_int_equal(tu_event_get(&sv.closed), 1);
  cli_fini(&cl);
  tu_event_destroy(&sv.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A plain client: connects to a, sends "ping", expects it back. */
static void plain_ping(const struct sockaddr_un *a, unsigned len) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct timeval tv = {TU_WAIT_S, 0};
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  if (connect(fd, (const struct sockaddr *)a, len) != 0)
    fail_msg("connect: %s", strerror(errno));
  assert_int_equal(write(fd, "ping", 4), 4);
  char buf[4];
  size_t got = 0;
  while (got < 4) {
    ssize_t n = read(fd, buf + got, 4 - got);
    if (n <= 0)
      fail_msg("read: %zd (%s)", n, strerror(errno));
    got += (size_t)n;
  }
  assert_memory_equal(buf, "ping", 4);
  close(fd);
}

static void test_abstract(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  srv sv;
  srv_init(&sv);
  char name[64];
  snprintf(name, sizeof name, "@weft-test-unix-%d", (int)getpid());
  struct sockaddr_un a;
  int len = weft_unix_addr(&a, name);
  assert_int_equal(
      len, (int)(offsetof(struct sockaddr_un, sun_path) + strlen(name)));
  weft_listener *l1, *l2;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l1),
               0);
  plain_ping(&a, (unsigned)len);
  /* The name is taken while l1 listens. */
  weft_listener *l3;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l3),
               -EADDRINUSE);

  /* Autobind: the family alone. */
  struct sockaddr_un fam = {.sun_family = AF_UNIX};
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&fam, sizeof(sa_family_t),
                               NULL, srv_accept, &sv, &l2),
               0);
  struct sockaddr_un got;
  unsigned glen = sizeof got;
  tu_assert_rc(weft_listener_addr(l2, (struct sockaddr *)&got, &glen), 0);
  assert_true(glen > offsetof(struct sockaddr_un, sun_path));
  assert_int_equal(got.sun_path[0], '\0');
  plain_ping(&got, glen);

  tu_wait_count(&sv.accepted, 2, "both accepts");
  tu_event_wait(&sv.closed, 2, "both server connections' close callbacks");
  tu_listener_close(l1);
  tu_listener_close(l2);
  rt_end(rt);
  tu_event_destroy(&sv.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Binds a plain socket to path and closes it without listening: a stale
 * socket file (what a crashed server leaves). */
static void make_stale(const char *path) {
  struct sockaddr_un a;
  int len = weft_unix_addr(&a, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  if (bind(fd, (struct sockaddr *)&a, (socklen_t)len) != 0)
    fail_msg("bind %s: %s", path, strerror(errno));
  close(fd);
}

static void test_socket_files(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  srv sv;
  srv_init(&sv);
  char path[128];
  struct sockaddr_un a;
  weft_listener *l;

  /* Stale: replaced. */
  path_in_dir(path, sizeof path, "stale.sock");
  make_stale(path);
  int len = weft_unix_addr(&a, path);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               0);
  plain_ping(&a, (unsigned)len);
  tu_listener_close(l);
  assert_false(file_exists(path));

  /* A path of all 108 bytes of sun_path, with no NUL: its close removes
   * its file (the length getsockname gives counts a byte past sun_path). */
  {
    struct sockaddr_un full = {.sun_family = AF_UNIX};
    char p[sizeof(full.sun_path) + 1];
    int n = snprintf(p, sizeof p, "%s/", g_dir);
    memset(p + n, 'f', sizeof(full.sun_path) - (size_t)n);
    p[sizeof(full.sun_path)] = '\0';
    memcpy(full.sun_path, p, sizeof(full.sun_path));
    tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&full, sizeof(full),
                                 NULL, srv_accept, &sv, &l),
                 0);
    assert_true(file_exists(p));
    tu_listener_close(l);
    assert_false(file_exists(p));
  }

  /* Live (a plain listener): -EADDRINUSE, and it keeps listening. */
  path_in_dir(path, sizeof path, "live.sock");
  len = weft_unix_addr(&a, path);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, (socklen_t)len), 0);
  assert_int_equal(listen(lfd, 4), 0);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               -EADDRINUSE);
  assert_true(file_exists(path));
  int cfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_int_equal(connect(cfd, (struct sockaddr *)&a, (socklen_t)len), 0);
  close(cfd);
  close(lfd);

  /* A regular file: -EADDRINUSE, untouched. */
  path_in_dir(path, sizeof path, "regular");
  int ffd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  assert_true(ffd >= 0);
  assert_int_equal(write(ffd, "keep", 4), 4);
  close(ffd);
  len = weft_unix_addr(&a, path);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               -EADDRINUSE);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(st.st_size, 4);

  /* A missing directory. */
  path_in_dir(path, sizeof path, "nodir/x.sock");
  len = weft_unix_addr(&a, path);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               -ENOENT);

  /* Replaced after the bind: the close leaves the newcomer's file. */
  path_in_dir(path, sizeof path, "replaced.sock");
  len = weft_unix_addr(&a, path);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               0);
  assert_int_equal(unlink(path), 0);
  make_stale(path);
  tu_listener_close(l);
  assert_true(file_exists(path));

  tu_wait_count(&sv.accepted, 1, "the accept");
  tu_event_wait(&sv.closed, 1, "the server connection's close callback");
  rt_end(rt);
  tu_event_destroy(&sv.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Connects a weft client to a (len bytes) and returns its status; the
 * failed connection then closes itself, once. */
static int weft_connect_status(weft_rt *rt, const struct sockaddr_un *a,
                               int len) {
  cli cl;
  cli_init(&cl, 0);
  tu_assert_rc(weft_tcp_connect(rt, NULL, (const struct sockaddr *)a,
                                (unsigned)len, 0, cli_connected, &cl, &cl.c),
               0);
  tu_event_wait(&cl.done, 1, "the connect callback");
  tu_event_wait(&cl.closed, 1, "the failed connection's close callback");
  int status = cl.status;
  assert_int_equal(cl.closes, 1);
  cli_fini(&cl);
  return status;
}

static void test_connect_errors(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  char path[128];
  struct sockaddr_un a;
  path_in_dir(path, sizeof path, "missing.sock");
  int len = weft_unix_addr(&a, path);
  assert_int_equal(weft_connect_status(rt, &a, len), -ENOENT);

  path_in_dir(path, sizeof path, "refused.sock");
  make_stale(path);
  len = weft_unix_addr(&a, path);
  assert_int_equal(weft_connect_status(rt, &a, len), -ECONNREFUSED);

  /* A listener that never accepts, backlog 0: the kernel queues one
   * connection more than the backlog, then refuses with EAGAIN. */
  path_in_dir(path, sizeof path, "full.sock");
  len = weft_unix_addr(&a, path);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, (socklen_t)len), 0);
  assert_int_equal(listen(lfd, 0), 0);
  int fill[4], nfill = 0;
  for (; nfill < 4; nfill++) {
    fill[nfill] =
        socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fill[nfill] >= 0);
    if (connect(fill[nfill], (struct sockaddr *)&a, (socklen_t)len) != 0) {
      assert_int_equal(errno, EAGAIN);
      close(fill[nfill]);
      break;
    }
  }
  assert_true(nfill < 4);
  assert_int_equal(weft_connect_status(rt, &a, len), -EAGAIN);
  for (int i = 0; i < nfill; i++)
    close(fill[i]);
  close(lfd);
  rt_end(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void cred_off_strand(void *arg) {
  weft_tcp *c = arg;
  weft_cred cr;
  TU_CHECK_RC(weft_tcp_peer_cred(c, NULL), -EINVAL);
  TU_CHECK_RC(weft_tcp_peer_cred(c, &cr), -EAFNOSUPPORT);
}

typedef struct tcp_pair {
  tu_event acc, closed;
  weft_tcp *c;
} tcp_pair;

static void tcp_closed(void *data, weft_tcp *c) {
  (void)c;
  tu_event_add(data, 1);
}

static void tcp_accept(void *arg, weft_tcp *c) {
  tcp_pair *p = arg;
  p->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, &p->closed, tcp_closed), 0);
  tu_event_add(&p->acc, 1);
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  struct sockaddr_un a;
  char path[200];
  memset(path, 'x', sizeof path);
  path[0] = '/';
  path[107] = '\0'; /* 107 bytes: the most a path may have */
  assert_int_equal(weft_unix_addr(&a, path),
                   (int)(offsetof(struct sockaddr_un, sun_path) + 108));
  path[107] = 'x';
  path[108] = '\0';
  tu_assert_rc(weft_unix_addr(&a, path), -ENAMETOOLONG);
  path[0] = '@'; /* '@' and 107 bytes of name */
  assert_int_equal(weft_unix_addr(&a, path),
                   (int)(offsetof(struct sockaddr_un, sun_path) + 108));
  path[108] = 'x';
  path[109] = '\0';
  tu_assert_rc(weft_unix_addr(&a, path), -ENAMETOOLONG);
  tu_assert_rc(weft_unix_addr(&a, ""), -EINVAL);
  tu_assert_rc(weft_unix_addr(NULL, "/x"), -EINVAL);
  tu_assert_rc(weft_unix_addr(&a, NULL), -EINVAL);
  tu_assert_rc(weft_tcp_peer_cred(NULL, NULL), -EINVAL);

  weft_rt *rt;
  rt_make(&rt);
  srv sv;
  srv_init(&sv);
  weft_listener *l;
  path_in_dir(path, sizeof path, "bad.sock");
  int len = weft_unix_addr(&a, path);
  weft_listen_opts share = {.flags = WEFT_LISTEN_SHARE};
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, &share,
                               srv_accept, &sv, &l),
               -EINVAL);
  struct sockaddr_storage big;
  memset(&big, 0, sizeof big);
  memcpy(&big, &a, sizeof a);
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&big, sizeof big, NULL,
                               srv_accept, &sv, &l),
               -EINVAL);
  assert_false(file_exists(path));

  /* peer_cred of a TCP connection, and off the strand. */
  tcp_pair p;
  tu_event_init(&p.acc);
  tu_event_init(&p.closed);
  weft_listener *tl;
  uint16_t port = tu_tcp_listen(rt, NULL, tcp_accept, &p, &tl);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&p.acc, 1, "the TCP accept");
  weft_cred cr;
  tu_assert_rc(weft_tcp_peer_cred(p.c, &cr), -EPERM);
  tu_on_strand(weft_tcp_strand(p.c), cred_off_strand, p.c);
  tu_assert_rc(weft_tcp_close(p.c, 0), 0);
  tu_event_wait(&p.closed, 1, "the TCP close callback");
  close(fd);
  tu_listener_close(tl);
  rt_end(rt);
  tu_event_destroy(&p.acc);
  tu_event_destroy(&p.closed);
  tu_event_destroy(&sv.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

#define NOPEN 8

static void test_shutdown_open(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  rt_make(&rt);
  srv sv;
  srv_init(&sv);
  char path[128];
  path_in_dir(path, sizeof path, "shut.sock");
  struct sockaddr_un a;
  int len = weft_unix_addr(&a, path);
  weft_listener *l;
  tu_assert_rc(weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)len, NULL,
                               srv_accept, &sv, &l),
               0);
  cli cl[NOPEN];
  for (int i = 0; i < NOPEN; i++) {
    cli_init(&cl[i], 4096);
    tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a,
                                  (unsigned)len, 0, cli_connected, &cl[i],
                                  &cl[i].c),
                 0);
    tu_event_wait(&cl[i].done, 1, "an echo");
  }
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_false(file_exists(path)); /* the shutdown closed the listener */
  for (int i = 0; i < NOPEN; i++) {
    assert_int_equal(cl[i].closes, 1);
    cli_fini(&cl[i]);
  }
  assert_int_equal(tu_event_get(&sv.closed), NOPEN);
  tu_event_destroy(&sv.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static int dir_remove(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  if (d) {
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(g_dir);
  return 0;
}

static int dir_setup(void **state) {
  (void)state;
  dir_make();
  return 0;
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_echo_path, dir_setup, dir_remove),
      cmocka_unit_test_setup_teardown(test_abstract, dir_setup, dir_remove),
      cmocka_unit_test_setup_teardown(test_socket_files, dir_setup, dir_remove),
      cmocka_unit_test_setup_teardown(test_connect_errors, dir_setup,
                                      dir_remove),
      cmocka_unit_test_setup_teardown(test_bad_input, dir_setup, dir_remove),
      cmocka_unit_test_setup_teardown(test_shutdown_open, dir_setup,
                                      dir_remove),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
