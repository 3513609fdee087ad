/*
 * test_sendfile: weft_tcp_sendfile, on each backend.
 *
 *  - Order: "HEAD:", 3 MiB + 123 bytes of a file (over the send budget of
 *    one turn and over the socket buffers of a client that starts reading
 *    late, so the socket fills and the strand waits for room), ":MID:",
 *    5000 bytes from offset 1000, a zero-length file send, ":TAIL", then
 *    FIN: the client reads exactly that byte stream, then EOF; the six
 *    write callbacks run once each, in order, with 0; the file's position
 *    is left where it was.
 *  - A file shorter than asked: its bytes go, the send fails with
 *    -ENODATA, a write queued behind it fails the same way, and writes
 *    after that are refused with -EPIPE; the client reads just the
 *    file's bytes.
 *  - Close while a large file send waits for room (the client never
 *    reads): its callback runs once with an error, the close callback
 *    once.
 *  - Bad input: fd -1 or not open -EBADF; a directory, a pipe, a socket,
 *    a negative offset or one that overflows -EINVAL; off the strand
 *    -EPERM; after weft_tcp_shutdown -EPIPE.
 */
#include "testutil.h"

#include <sys/stat.h>

#define NWORKERS 2
#define SMALL_BUF 4096
#define BIG_LEN ((size_t)3 * 1024 * 1024 + 123)

enum { ORDER, SHORT, STUCK, BAD };

typedef struct fix {
  int scenario;
  int file_fd;
  unsigned char *file; /* its bytes */
  weft_tcp *c;
  unsigned wcb;      /* write callbacks run */
  int wstatus[8];    /* their statuses, in order of calls */
  uintptr_t widx[8]; /* which write each was */
  unsigned closes;
  int rcs[16]; /* BAD: return codes; SHORT: the write after */
  tu_event ev; /* accepted, each write callback, close */
} fix;

static fix F;

static void on_write(void *arg, weft_tcp *c, int status) {
  (void)c;
  TU_CHECK(F.wcb < 8);
  if (F.wcb < 8) {
    F.wstatus[F.wcb] = status;
    F.widx[F.wcb] = (uintptr_t)arg;
  }
  F.wcb++;
  if (F.scenario == SHORT && F.wcb == 1)
    F.rcs[0] = weft_tcp_write(c, "late", 4, NULL, NULL);
  tu_event_add(&F.ev, 1);
}

static void on_close(void *data, weft_tcp *c) {
  (void)data;
  (void)c;
  F.closes++;
  tu_event_add(&F.ev, 1);
}

static void bad_input(weft_tcp *c) {
  int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int p[2];
  TU_CHECK(dir >= 0 && pipe(p) == 0);
  int k = 0;
  F.rcs[k++] = weft_tcp_sendfile(c, -1, 0, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, 9999, 0, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, dir, 0, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, p[0], 0, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, p[1], 0, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, F.file_fd, -1, 10, on_write, NULL);
  F.rcs[k++] = weft_tcp_sendfile(c, F.file_fd, INT64_MAX, 2, on_write, NULL);
  F.rcs[k++] = weft_tcp_shutdown(c);
  F.rcs[k++] = weft_tcp_sendfile(c, F.file_fd, 0, 10, on_write, NULL);
  close(dir);
  close(p[0]);
  close(p[1]);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  F.c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, NULL, on_close), 0);
  switch (F.scenario) {
  case ORDER:
    TU_CHECK_RC(weft_tcp_write(c, "HEAD:", 5, on_write, (void *)1), 0);
    TU_CHECK_RC(
        weft_tcp_sendfile(c, F.file_fd, 0, BIG_LEN, on_write, (void *)2), 0);
    TU_CHECK_RC(weft_tcp_write(c, ":MID:", 5, on_write, (void *)3), 0);
    TU_CHECK_RC(
        weft_tcp_sendfile(c, F.file_fd, 1000, 5000, on_write, (void *)4), 0);
    TU_CHECK_RC(weft_tcp_sendfile(c, F.file_fd, 7, 0, on_write, (void *)5), 0);
    TU_CHECK_RC(weft_tcp_write(c, ":TAIL", 5, on_write, (void *)6), 0);
    TU_CHECK_RC(weft_tcp_shutdown(c), 0);
    break;
  case SHORT:
    TU_CHECK_RC(
        weft_tcp_sendfile(c, F.file_fd, BIG_LEN - 10, 100, on_write, (void *)1),
        0);
    /* Queued behind it, unless the send already failed in the call. */
    F.rcs[1] = weft_tcp_write(c, "X", 1, on_write, (void *)2);
    break;
  case STUCK:
    TU_CHECK_RC(
        weft_tcp_sendfile(c, F.file_fd, 0, BIG_LEN, on_write, (void *)1), 0);
    break;
  default:
    bad_input(c);
  }
  tu_event_add(&F.ev, 1);
}

static void make_file(void) {
  char path[] = "/tmp/weft-sendfile-XXXXXX";
  F.file_fd = mkstemp(path);
  assert_true(F.file_fd >= 0);
  unlink(path);
  F.file = malloc(BIG_LEN);
  assert_non_null(F.file);
  uint64_t seed = 42;
  for (size_t i = 0; i < BIG_LEN; i++)
    F.file[i] = (unsigned char)tu_rand(&seed);
  assert_int_equal(pwrite(F.file_fd, F.file, BIG_LEN, 0), (ssize_t)BIG_LEN);
  assert_int_equal(lseek(F.file_fd, 17, SEEK_SET), 17);
}

typedef struct env {
  weft_rt *rt;
  weft_listener *l;
  uint16_t port;
} env;

static void env_start(env *e, int scenario) {
  memset(&F.wcb, 0, sizeof F - offsetof(fix, wcb));
  F.scenario = scenario;
  F.c = NULL;
  tu_event_init(&F.ev);
  tu_rt_create(&e->rt, NWORKERS, 0);
  tu_assert_backend(e->rt);
  e->port = tu_tcp_listen(e->rt, NULL, on_accept, NULL, &e->l);
}

static void env_end(env *e) {
  tu_listener_close(e->l);
  tu_assert_rc(weft_rt_shutdown(e->rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(e->rt), 0);
  tu_event_destroy(&F.ev);
}

/* Reads until EOF into buf (cap bytes); returns the bytes read. */
static size_t read_to_eof(int fd, unsigned char *buf, size_t cap) {
  size_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    assert_true(n >= 0);
    if (n == 0)
      return got;
    got += (size_t)n;
    assert_true(got < cap);
  }
}

static void test_order(void **state) {
  (void)state;
  tu_reset_async_errors();
  env e;
  env_start(&e, ORDER);
  int fd = tu_sock_connect(e.port, SMALL_BUF, 0);
  assert_true(fd >= 0);
  tu_event_wait(&F.ev, 1, "the accept callback");
  tu_sleep_ms(100); /* the socket fills meanwhile */
  size_t want = 5 + BIG_LEN + 5 + 5000 + 5;
  unsigned char *got = malloc(want + 1);
  unsigned char *exp = malloc(want);
  assert_true(got && exp);
  memcpy(exp, "HEAD:", 5);
  memcpy(exp + 5, F.file, BIG_LEN);
  memcpy(exp + 5 + BIG_LEN, ":MID:", 5);
  memcpy(exp + 10 + BIG_LEN, F.file + 1000, 5000);
  memcpy(exp + 5010 + BIG_LEN, ":TAIL", 5);
  assert_int_equal(read_to_eof(fd, got, want + 1), want);
  assert_memory_equal(got, exp, want);
  tu_event_wait(&F.ev, 1 + 6, "the six write callbacks");
  for (unsigned i = 0; i < 6; i++) {
    assert_int_equal(F.wstatus[i], 0);
    assert_int_equal(F.widx[i], i + 1);
  }
  assert_int_equal(lseek(F.file_fd, 0, SEEK_CUR), 17);
  weft_tcp_close(F.c, 0);
  tu_event_wait(&F.ev, 1 + 6 + 1, "the close callback");
  assert_int_equal(F.wcb, 6);
  assert_int_equal(F.closes, 1);
  close(fd);
  free(got);
  free(exp);
  env_end(&e);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_short_file(void **state) {
  (void)state;
  tu_reset_async_errors();
  env e;
  env_start(&e, SHORT);
  int fd = tu_sock_connect(e.port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&F.ev, 1, "the accept callback");
  unsigned want_cbs = F.rcs[1] == 0 ? 2 : 1;
  if (F.rcs[1] != 0)
    tu_assert_rc(F.rcs[1], -EPIPE); /* it failed within the call */
  tu_event_wait(&F.ev, 1 + want_cbs, "the write callbacks");
  assert_int_equal(F.wstatus[0], -ENODATA);
  assert_int_equal(F.widx[0], 1);
  if (want_cbs == 2) {
    assert_int_equal(F.wstatus[1], -ENODATA);
    assert_int_equal(F.widx[1], 2);
  }
  tu_assert_rc(F.rcs[0], -EPIPE);
  weft_tcp_close(F.c, 0);
  tu_event_wait(&F.ev, 1 + want_cbs + 1, "the close callback");
  unsigned char got[64];
  assert_int_equal(read_to_eof(fd, got, sizeof got), 10);
  assert_memory_equal(got, F.file + BIG_LEN - 10, 10);
  assert_int_equal(F.closes, 1);
  close(fd);
  env_end(&e);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_close_while_stuck(void **state) {
  (void)state;
  tu_reset_async_errors();
  env e;
  env_start(&e, STUCK);
  int fd = tu_sock_connect(e.port, SMALL_BUF, 0);
  assert_true(fd >= 0);
  tu_event_wait(&F.ev, 1, "the accept callback");
  tu_sleep_ms(50);
  assert_int_equal(F.wcb, 0); /* the client reads nothing: it waits */
  weft_tcp_close(F.c, 0);
  tu_event_wait(&F.ev, 3, "the write and close callbacks");
  assert_int_equal(F.wcb, 1);
  assert_true(F.wstatus[0] < 0);
  assert_int_equal(F.closes, 1);
  close(fd);
  env_end(&e);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  env e;
  env_start(&e, BAD);
  int fd = tu_sock_connect(e.port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&F.ev, 1, "the accept callback");
  static const int want[] = {-EBADF,  -EBADF,  -EINVAL, -EINVAL, -EINVAL,
                             -EINVAL, -EINVAL, 0,       -EPIPE};
  for (unsigned i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (F.rcs[i] != want[i])
      fail_msg("call %u returned %d (%s), expected %d", i, F.rcs[i],
               weft_strerror(F.rcs[i]), want[i]);
  }
  tu_assert_rc(weft_tcp_sendfile(F.c, F.file_fd, 0, 10, NULL, NULL), -EPERM);
  weft_tcp_close(F.c, 0);
  tu_event_wait(&F.ev, 2, "the close callback");
  assert_int_equal(F.wcb, 0);
  close(fd);
  env_end(&e);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  /* SIGPIPE keeps its default disposition: sendfile(2) has no
   * MSG_NOSIGNAL, and one raised where weft does not block it would end
   * the test. */
  make_file();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_short_file),
      cmocka_unit_test(test_close_while_stuck),
      cmocka_unit_test(test_bad_input),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  close(F.file_fd);
  free(F.file);
  return r;
}
