/*
 * test_tcp_big_write: a large write does not hold its shard. weft.h: "A
 * write call, and each turn of the connection's strand, hands the kernel
 * at most 1 MiB by itself ... a larger write goes on in later turns".
 *
 * One worker, so every strand shares its shard. A plain client thread
 * connects and reads as fast as it can, discarding and counting the
 * bytes. On the
 * accepted connection one 64 MiB weft_tcp_write is made from the accept
 * callback, while a ticker strand re-posts a handler that counts its runs.
 *   - When the write call returns, the client has received at most 1 MiB:
 *     the call sent no more (with a fast reader the epoll backend used to
 *     send all 64 MiB inside the call).
 *   - With epoll, the ticker runs while the transfer is under way (the
 *     client has not yet read everything).
 *   - The write callback comes once with 0, and the client receives
 *     exactly as many bytes as were written.
 * Run on both backends.
 */
#include "testutil.h"

#include <arpa/inet.h>

#define TOTAL ((size_t)64 << 20)
#define CALL_MAX ((size_t)1 << 20)

static unsigned char *g_buf;
static atomic_size_t g_read;      /* bytes the client has received */
static atomic_size_t g_at_return; /* g_read when the write call returned */
static atomic_int g_write_rc = 1, g_write_status = 1;
static tu_count g_write_cbs, g_ticks, g_ticks_mid;
static atomic_bool g_stop;
static tu_event g_done;

static void ticker(void *arg) {
  atomic_fetch_add(&g_ticks, 1);
  size_t got = atomic_load(&g_read);
  if (atomic_load(&g_at_return) && got < TOTAL)
    atomic_fetch_add(&g_ticks_mid, 1);
  /* The shutdown may begin between the load and the post. */
  if (!atomic_load(&g_stop)) {
    int r = weft_post(arg, ticker, arg);
    TU_CHECK(r == 0 || r == -ESHUTDOWN);
  }
}

static void write_cb(void *arg, weft_tcp *c, int status) {
  (void)arg;
  atomic_store(&g_write_status, status);
  atomic_fetch_add(&g_write_cbs, 1);
  TU_CHECK(weft_tcp_close(c, 0) == 0);
  tu_event_add(&g_done, 1);
}

static void accept_cb(void *arg, weft_tcp *c) {
  (void)arg;
  int rc = weft_tcp_write(c, g_buf, TOTAL, write_cb, NULL);
  atomic_store(&g_at_return, atomic_load(&g_read) + 1);
  atomic_store(&g_write_rc, rc);
  if (rc)
    tu_event_add(&g_done, 1);
}

static void *client(void *arg) {
  uint16_t port = *(uint16_t *)arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TU_CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
  /* MSG_TRUNC: the kernel drops what it reads (TCP, Linux 4.x and later)
   * instead of copying it, so the client keeps the window open for as
   * long as the server sends. */
  size_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, NULL, (size_t)1 << 30, MSG_TRUNC);
    if (n <= 0)
      break;
    got += (size_t)n;
    atomic_store(&g_read, got);
  }
  TU_CHECKF(got == TOTAL, "the client got %zu bytes of %zu", got, TOTAL);
  close(fd);
  return NULL;
}

static void test_big_write(void **state) {
  (void)state;
  g_buf = malloc(TOTAL);
  assert_non_null(g_buf);
  for (size_t i = 0; i < TOTAL; i++)
    g_buf[i] = (unsigned char)(i * 7 + (i >> 12));
  tu_event_init(&g_done);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  weft_strand *t;
  assert_int_equal(weft_strand_create(rt, &t), 0);
  assert_int_equal(weft_post(t, ticker, t), 0);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_cb, NULL, &l);
  pthread_t th;
  tu_thread_start(&th, client, &port);
  tu_event_wait(&g_done, 1, "the write callback");
  tu_thread_join(th, "the client");
  atomic_store(&g_stop, true);
  assert_int_equal(atomic_load(&g_write_rc), 0);
  assert_int_equal(atomic_load(&g_write_status), 0);
  assert_int_equal(atomic_load(&g_write_cbs), 1);
  size_t at_return = atomic_load(&g_at_return) - 1;
  if (at_return > CALL_MAX)
    fail_msg("the client had %zu bytes when the write call returned, more "
             "than the call may send (%zu)",
             at_return, CALL_MAX);
  /* With epoll the rest goes in 1 MiB turns, the ticker's between them.
   * The ring takes the rest in one send, which the kernel may finish
   * within a single entry, before the ticker's next turn. */
  if (weft_rt_backend(rt) == WEFT_BACKEND_EPOLL)
    assert_true(atomic_load(&g_ticks_mid) > 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  tu_event_destroy(&g_done);
  free(g_buf);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_big_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
