/*
 * test_epoll_no_pwait2: the epoll backend where epoll_pwait2 is refused.
 *
 * A seccomp filter makes epoll_pwait2 fail with ENOSYS in every thread of
 * the test, as a kernel before 5.11 or a sandbox that does not know the
 * call does. A runtime forced onto epoll must say so once (an INFO
 * message), wait with epoll_wait instead (a wait that failed each time
 * would spin and never see a socket), accept connections and echo bytes,
 * and fire a timer no earlier than asked, at 2 ms and at 10 ms.
 */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "testutil.h"

#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441
#endif

static atomic_uint refused_msgs, accepted, fired;
static uint64_t armed_at, fired_at;

static void on_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  if (level == WEFT_LOG_INFO && strstr(msg, "epoll_pwait2"))
    atomic_fetch_add(&refused_msgs, 1);
}

static void on_read(void *arg, weft_tcp *c, long n);

static char buf[64];

static void on_written(void *arg, weft_tcp *c, int status) {
  TU_CHECK_RC(status, 0);
  TU_CHECK_RC(weft_tcp_read(c, buf, sizeof(buf), on_read, arg), 0);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  if (n <= 0) {
    weft_tcp_close(c, 0);
    return;
  }
  TU_CHECK_RC(weft_tcp_write(c, buf, (size_t)n, on_written, arg), 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  atomic_fetch_add(&accepted, 1);
  TU_CHECK_RC(weft_tcp_read(c, buf, sizeof(buf), on_read, arg), 0);
}

static void on_timer(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  TU_CHECK_RC(status, 0);
  fired_at = weft_now_ns();
  atomic_store(&fired, 1);
}

/* epoll_pwait2 fails with ENOSYS in every thread, now and later. */
static void refuse_pwait2(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_epoll_pwait2, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  assert_int_equal(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
  assert_int_equal(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                           SECCOMP_FILTER_FLAG_TSYNC, &prog),
                   0);
}

static void timer_after(weft_timer *t, uint64_t ns) {
  atomic_store(&fired, 0);
  armed_at = weft_now_ns();
  assert_int_equal(weft_timer_start(t, ns, 0, on_timer, NULL), 0);
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&fired) && tu_now_ns() < deadline)
    tu_sleep_ms(1);
  assert_true(atomic_load(&fired));
  assert_true(fired_at >= armed_at + ns);
}

static void test_epoll_wait_fallback(void **state) {
  (void)state;
  refuse_pwait2();
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.backend = WEFT_BACKEND_EPOLL;
  cfg.log_fn = on_log;
  cfg.log_level = WEFT_LOG_INFO;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  assert_int_equal(weft_rt_backend(rt), WEFT_BACKEND_EPOLL);

  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, on_accept, NULL, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  for (int i = 0; i < 100; i++) {
    char out[8], in[8];
    snprintf(out, sizeof(out), "m%03d", i);
    assert_int_equal(write(fd, out, 4), 4);
    size_t got = 0;
    while (got < 4) {
      ssize_t n = read(fd, in + got, 4 - got);
      assert_true(n > 0);
      got += (size_t)n;
    }
    assert_memory_equal(in, out, 4);
  }
  close(fd);
  assert_int_equal(atomic_load(&accepted), 1);

  weft_timer *t;
  assert_int_equal(weft_timer_create(rt, NULL, &t), 0);
  timer_after(t, 2000000);
  timer_after(t, 10000000);
  weft_timer_destroy(t);

  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(atomic_load(&refused_msgs), 1);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_epoll_wait_fallback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
