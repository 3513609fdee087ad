/*
 * test_tcp_no_uring: io_uring refused by a seccomp filter. weft.h: "AUTO
 * takes io_uring and falls back to epoll by itself when io_uring is refused
 * (... a seccomp filter, ENOSYS ...)"; "URING or EPOLL forces one:
 * weft_rt_create fails if it cannot be set up".
 *
 * A raw BPF filter (no libseccomp) makes io_uring_setup fail with EPERM,
 * then (a second filter, which takes precedence) with ENOSYS; the test
 * first checks that the raw syscall now fails that way. Then, with
 * WEFT_BACKEND cleared: a default runtime uses epoll and carries a small
 * echo exchange; cfg.backend URING fails to create with the error io_uring
 * setup got (-EPERM, -ENOSYS); WEFT_BACKEND=uring (which overrides AUTO)
 * fails the same way instead of falling back silently; WEFT_BACKEND=epoll
 * and =none are honoured.
 */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "testutil.h"

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425 /* the same on every architecture */
#endif

#if defined(__x86_64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#define ECHO_LEN (64u << 10)

/* Installs a filter on this thread (and the threads it starts later):
 * io_uring_setup fails with err, everything else is allowed. */
static int block_io_uring(int err) {
#ifdef THIS_AUDIT_ARCH
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, THIS_AUDIT_ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K,
               SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
    return -errno;
  return 0;
#else
  (void)err;
  return -ENOTSUP;
#endif
}

/* The raw syscall fails with err (the filter works). */
static void assert_blocked(int err) {
  unsigned char params[120]; /* struct io_uring_params */
  memset(params, 0, sizeof params);
  errno = 0;
  long r = syscall(__NR_io_uring_setup, 4, params);
  if (r >= 0)
    close((int)r);
  if (r != -1 || errno != err)
    fail_msg("io_uring_setup returned %ld (errno %d), expected -1 with "
             "errno %d: the seccomp filter does not work",
             r, errno, err);
}

/* ------------------------------------------------------------------- echo */

typedef struct echo {
  weft_tcp *c;
  unsigned char buf[8192];
  tu_event closed;
} echo;

static void echo_read(echo *e, weft_tcp *c);

static void echo_closed(void *arg, weft_tcp *c) {
  (void)c;
  tu_event_add(&((echo *)arg)->closed, 1);
}

static void echo_written(void *arg, weft_tcp *c, int status) {
  TU_CHECK_RC(status, 0);
  if (status == 0)
    echo_read(arg, c);
}

static void echo_got(void *arg, weft_tcp *c, long n) {
  echo *e = arg;
  if (n <= 0) {
    TU_CHECKF(n == 0, "echo read: %ld (%s)", n, weft_strerror((int)n));
    TU_CHECK_RC(weft_tcp_close(c, 0), 0);
    return;
  }
  TU_CHECK_RC(weft_tcp_write(c, e->buf, (size_t)n, echo_written, e), 0);
}

static void echo_read(echo *e, weft_tcp *c) {
  TU_CHECK_RC(weft_tcp_read(c, e->buf, sizeof e->buf, echo_got, e), 0);
}

static void echo_accept(void *arg, weft_tcp *c) {
  echo *e = arg;
  TU_CHECK(weft_strand_current() == weft_tcp_strand(c));
  e->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, e, echo_closed), 0);
  echo_read(e, c);
}

static void listener_done(void *arg) { tu_event_add(arg, 1); }

/* A default runtime: epoll, and an echo through it works. */
static void run_echo(void) {
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  if (weft_rt_backend(rt) != WEFT_BACKEND_EPOLL)
    fail_msg("io_uring is refused, yet the default runtime uses \"%s\"",
             weft_rt_backend_name(rt));
  assert_string_equal(weft_rt_backend_name(rt), "epoll");
  static echo e;
  memset(&e, 0, sizeof e);
  tu_event_init(&e.closed);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, echo_accept, &e, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  unsigned char *out = malloc(ECHO_LEN), *in = malloc(ECHO_LEN);
  assert_true(out && in);
  tu_pattern_fill(out, ECHO_LEN, 0xEC, 0);
  /* 64 KiB fits in the socket buffers: send all, then read all back */
  assert_int_equal(tu_sock_send_all(fd, out, ECHO_LEN), 0);
  assert_int_equal(shutdown(fd, SHUT_WR), 0);
  assert_int_equal(tu_sock_recv_all(fd, in, ECHO_LEN), 0);
  assert_int_equal(memcmp(in, out, ECHO_LEN), 0);
  assert_int_equal(tu_sock_wait_closed(fd, TU_WAIT_S * 1000, NULL), 0);
  close(fd);
  tu_event_wait(&e.closed, 1, "the server side to close");
  tu_assert_rc(weft_listener_close(l, listener_done, &e.closed), 0);
  tu_event_wait(&e.closed, 2, "the listener's done callback");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_event_destroy(&e.closed);
  free(out);
  free(in);
}

/* --------------------------------------------------------------- backends */

static int create_with(weft_rt **rt, int backend) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.backend = backend;
  *rt = NULL;
  return weft_rt_create(rt, &cfg);
}

/* With WEFT_BACKEND=name, a default runtime: its backend, or -1 if
 * weft_rt_create failed (*rcp: its result). */
static int env_backend(const char *name, int *rcp) {
  weft_rt *rt;
  assert_int_equal(setenv("WEFT_BACKEND", name, 1), 0);
  int rc = create_with(&rt, WEFT_BACKEND_AUTO);
  unsetenv("WEFT_BACKEND");
  *rcp = rc;
  if (rc != 0)
    return -1;
  int b = weft_rt_backend(rt);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  return b;
}

/* err: what io_uring_setup fails with. weft.h: weft_rt_create returns "the
 * error setting up a forced backend (e.g. -EPERM, -ENOSYS for io_uring)". */
static void check_backends(int err) {
  weft_rt *rt;
  int rc = create_with(&rt, WEFT_BACKEND_URING);
  if (rc == 0) {
    int b = weft_rt_backend(rt);
    weft_rt_destroy(rt);
    fail_msg("cfg.backend URING was created (backend %d) although "
             "io_uring_setup is refused",
             b);
  }
  tu_assert_rc(rc, -err);
  tu_assert_rc(create_with(&rt, WEFT_BACKEND_EPOLL), 0);
  assert_int_equal(weft_rt_backend(rt), WEFT_BACKEND_EPOLL);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  int b = env_backend("uring", &rc);
  if (b != -1)
    fail_msg("WEFT_BACKEND=uring with io_uring refused: the runtime was "
             "created with backend %d instead of failing",
             b);
  tu_assert_rc(rc, -err);
  assert_int_equal(env_backend("epoll", &rc), WEFT_BACKEND_EPOLL);
  assert_int_equal(env_backend("none", &rc), WEFT_BACKEND_NONE);
}

static void run_blocked(int err) {
  tu_reset_async_errors();
  unsetenv("WEFT_BACKEND");
  int rc = block_io_uring(err);
  if (rc == -ENOTSUP) {
    print_message("[ SKIP     ] no seccomp filter for this architecture\n");
    skip();
  }
  tu_assert_rc(rc, 0);
  assert_blocked(err);
  run_echo();
  check_backends(err);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_eperm(void **state) {
  (void)state;
  run_blocked(EPERM);
}

/* A second filter: its ENOSYS takes precedence over the first's EPERM
 * (same action; the filter installed last decides). */
static void test_enosys(void **state) {
  (void)state;
  run_blocked(ENOSYS);
}

int main(void) {
  unsetenv("WEFT_BACKEND");
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eperm),
      cmocka_unit_test(test_enosys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
