/*
 * test_tcp_read_until: weft_tcp_read_until returns one message per call,
 * ending with the delimiter, and keeps what follows in the caller's
 * buffer.
 *
 *  - Lines ("...\r\n") sent one byte at a time, several in one send, and
 *    with the delimiter split across sends: every line comes back whole
 *    and in order, the count is exact, and a line already held in the
 *    buffer is answered without a read, after the call returns (never
 *    inside it).
 *  - A buffer filled without the delimiter: -EMSGSIZE with have == len.
 *  - End of file in the middle of a line: 0, with the partial line's
 *    length in have.
 *  - A close while a read waits: -ECANCELED, then the close callback.
 *  - Bad input: NULL delim, dlen 0 or above len, have above len: -EINVAL;
 *    a second read while one waits: -EBUSY.
 */
#include "testutil.h"

#define NLINES 200
#define BUFSZ 64

typedef struct lines {
  char buf[BUFSZ];
  size_t have;
  unsigned got, bad;
  bool in_call; /* inside weft_tcp_read_until: no callback may come */
  long last_n;
  size_t last_have;
  tu_event done, closed;
} lines;

static void on_line(void *arg, weft_tcp *c, long n, size_t have);

static void next(lines *l, weft_tcp *c) {
  l->in_call = true;
  int r = weft_tcp_read_until(c, l->buf, sizeof(l->buf), l->have, "\r\n", 2,
                              on_line, l);
  l->in_call = false;
  TU_CHECKF(r == 0, "read_until: %d", r);
  if (r)
    tu_event_add(&l->done, 1);
}

static void on_line(void *arg, weft_tcp *c, long n, size_t have) {
  lines *l = arg;
  TU_CHECK(!l->in_call);
  l->last_n = n;
  l->last_have = have;
  if (n <= 0) {
    tu_event_add(&l->done, 1);
    return;
  }
  char want[32];
  int wl = snprintf(want, sizeof(want), "line %u\r\n", l->got);
  if (n != wl || memcmp(l->buf, want, (size_t)wl) != 0) {
    if (l->bad++ < 3)
      TU_CHECKF(false, "message %u: %.*s (%ld bytes)", l->got, (int)n, l->buf,
                n);
  }
  l->got++;
  memmove(l->buf, l->buf + n, have - (size_t)n);
  l->have = have - (size_t)n;
  next(l, c);
}

static void lines_close(void *data, weft_tcp *c) {
  lines *l = data;
  (void)c;
  tu_event_add(&l->closed, 1);
}

static void accept_lines(void *arg, weft_tcp *c) {
  lines *l = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, l, lines_close), 0);
  next(l, c);
}

static weft_rt *g_rt;
static weft_listener *g_l;

static int start(lines *l, weft_accept_fn fn) {
  memset(l, 0, sizeof(*l));
  tu_event_init(&l->done);
  tu_event_init(&l->closed);
  tu_rt_create(&g_rt, 2, 0);
  uint16_t port = tu_tcp_listen(g_rt, NULL, fn, l, &g_l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  return fd;
}

static void stop(lines *l, int fd) {
  tu_listener_close(g_l);
  assert_int_equal(weft_rt_destroy(g_rt), 0);
  close(fd);
  assert_int_equal(tu_event_get(&l->closed), 1);
  tu_event_destroy(&l->done);
  tu_event_destroy(&l->closed);
}

static void test_lines(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("read_until: lines in any split");
  lines l;
  int fd = start(&l, accept_lines);
  char all[NLINES * 16];
  size_t len = 0;
  for (unsigned i = 0; i < NLINES; i++)
    len += (size_t)snprintf(all + len, sizeof(all) - len, "line %u\r\n", i);
  /* a byte at a time, then runs of 1..37 bytes (delimiters split too) */
  size_t off = 0, step = 1;
  while (off < len) {
    size_t k = off < 100 ? 1 : step;
    if (k > len - off)
      k = len - off;
    assert_int_equal(tu_sock_send_all(fd, all + off, k), 0);
    off += k;
    step = step % 37 + 1;
    if (off < 100)
      tu_sleep_ms(1);
  }
  shutdown(fd, SHUT_WR); /* end of file after the last line */
  tu_event_wait(&l.done, 1, "every line, then end of file");
  print_message("[ INFO     ] %u lines, then %ld with %zu bytes held\n", l.got,
                l.last_n, l.last_have);
  assert_int_equal(l.got, NLINES);
  assert_int_equal(l.bad, 0);
  assert_int_equal(l.last_n, 0);
  assert_int_equal(l.last_have, 0);
  stop(&l, fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_eof_mid_line(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("read_until: end of file in a line");
  lines l;
  int fd = start(&l, accept_lines);
  assert_int_equal(tu_sock_send_all(fd, "line 0\r\nline 1\r\nli", 18), 0);
  shutdown(fd, SHUT_WR);
  tu_event_wait(&l.done, 1, "end of file");
  assert_int_equal(l.got, 2);
  assert_int_equal(l.last_n, 0);
  assert_int_equal(l.last_have, 2); /* "li" */
  stop(&l, fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_too_long(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("read_until: no delimiter within the buffer");
  lines l;
  int fd = start(&l, accept_lines);
  char junk[BUFSZ + 10];
  memset(junk, 'x', sizeof(junk));
  assert_int_equal(tu_sock_send_all(fd, junk, sizeof(junk)), 0);
  tu_event_wait(&l.done, 1, "-EMSGSIZE");
  assert_int_equal(l.last_n, -EMSGSIZE);
  assert_int_equal(l.last_have, BUFSZ);
  stop(&l, fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Bad input, -EBUSY, and a close while a read waits. */
static void accept_bad(void *arg, weft_tcp *c) {
  lines *l = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, l, lines_close), 0);
  char *b = l->buf;
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, 0, NULL, 2, on_line, l),
              -EINVAL);
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, 0, "\n", 0, on_line, l),
              -EINVAL);
  TU_CHECK_RC(weft_tcp_read_until(c, b, 1, 0, "\r\n", 2, on_line, l), -EINVAL);
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, BUFSZ + 1, "\n", 1, on_line, l),
              -EINVAL);
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, 0, "\n", 1, NULL, l), -EINVAL);
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, 0, "\n", 1, on_line, l), 0);
  TU_CHECK_RC(weft_tcp_read_until(c, b, BUFSZ, 0, "\n", 1, on_line, l), -EBUSY);
  TU_CHECK_RC(weft_tcp_close(c, 0), 0);
}

static void test_bad_and_close(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("read_until: bad input, and a close while it waits");
  lines l;
  int fd = start(&l, accept_bad);
  tu_event_wait(&l.done, 1, "the cancelled read");
  assert_int_equal(l.last_n, -ECANCELED);
  tu_event_wait(&l.closed, 1, "the close callback");
  stop(&l, fd);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lines),
      cmocka_unit_test(test_eof_mid_line),
      cmocka_unit_test(test_too_long),
      cmocka_unit_test(test_bad_and_close),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
