/*
 * test_tcp_listen_watch_fail: a weft_tcp_listen whose second socket cannot
 * be watched (epoll_ctl fails, as at max_user_watches) fails cleanly, even
 * though clients already wait on its first socket, which was watched.
 *
 * This program wraps epoll_ctl (the link's --wrap reaches weft's calls):
 * once armed, the second listening socket's EPOLL_CTL_ADD first connects
 * CLIENTS clients to the group's port, so that some wait on the socket
 * watched before it (the kernel spreads them over the group by a hash),
 * waits for the first socket's thread to see them, then fails with ENOMEM.
 *
 *  - weft_tcp_listen returns -ENOMEM;
 *  - no accept callback runs, then or later: the listen failed;
 *  - every client sees its connection end (EOF or a reset): no listening
 *    socket of the failed listen is left open, and none was freed while
 *    an event still had it queued (ASan);
 *  - a listen on the same port afterwards succeeds, and the runtime shuts
 *    down and is destroyed cleanly.
 * Run with WEFT_BACKEND=epoll: on io_uring no listening socket is watched
 * before it is live, and the wrap is never called.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define CLIENTS 16

int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

static atomic_int armed;     /* 1: fail the second listening socket's ADD */
static atomic_int adds_seen; /* listening sockets' ADDs since armed */
static atomic_int accepts;
static int clients[CLIENTS];
static uint16_t group_port; /* the failed group's, in host order */

static bool listening(int fd) {
  int v = 0;
  socklen_t len = sizeof(v);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

static void connect_clients(int lfd) {
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  if (getsockname(lfd, (struct sockaddr *)&a, &len) < 0)
    fail_msg("getsockname: %s", strerror(errno));
  group_port = ntohs(a.sin_port);
  for (int i = 0; i < CLIENTS; i++) {
    clients[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (clients[i] < 0 || connect(clients[i], (struct sockaddr *)&a, len) < 0)
      fail_msg("client %d: %s", i, strerror(errno));
  }
}

int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev) {
  if (op == EPOLL_CTL_ADD && atomic_load(&armed) && listening(fd) &&
      atomic_fetch_add(&adds_seen, 1) == 1) {
    connect_clients(fd);
    /* Time for the first socket's thread, asleep in epoll_wait, to take
     * its event and run it. */
    tu_sleep_ms(100);
    errno = ENOMEM;
    return -1;
  }
  return __real_epoll_ctl(epfd, op, fd, ev);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  atomic_fetch_add(&accepts, 1);
  weft_tcp_close(c, 1);
}

static void closed(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

static int listen_on(weft_rt *rt, uint16_t port, weft_listener **l) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof(a), NULL, on_accept,
                         NULL, l);
}

/* Whether the client's connection has ended (EOF or an error), waiting up
 * to TU_WAIT_S seconds. */
static bool ends(int fd) {
  struct timeval tv = {.tv_sec = TU_WAIT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char b;
  ssize_t n;
  while ((n = recv(fd, &b, 1, 0)) < 0 && errno == EINTR)
    ;
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static void test_second_watch_fails(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2; /* a group of two sockets, one a shard */
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  tu_assert_backend(rt);
  if (weft_rt_backend(rt) != WEFT_BACKEND_EPOLL) {
    weft_rt_destroy(rt);
    skip();
  }
  /* A first listener sets up both shards' epoll sets, so that both
   * threads sleep in epoll_wait when the failing listen runs. */
  weft_listener *l;
  atomic_int done = 0;
  assert_int_equal(listen_on(rt, 0, &l), 0);
  assert_int_equal(weft_listener_close(l, closed, &done), 0);
  while (!atomic_load(&done))
    tu_sleep_ms(1);
  tu_sleep_ms(20);

  atomic_store(&armed, 1);
  int r = listen_on(rt, 0, &l);
  atomic_store(&armed, 0);
  assert_int_equal(atomic_load(&adds_seen), 2);
  assert_int_equal(r, -ENOMEM);

  for (int i = 0; i < CLIENTS; i++) {
    if (!ends(clients[i]))
      fail_msg("client %d: still connected after the listen failed", i);
    close(clients[i]);
  }
  tu_sleep_ms(50);
  assert_int_equal(atomic_load(&accepts), 0);

  /* The port is free again: the failed group's sockets are all closed. */
  weft_listener *again;
  assert_int_equal(listen_on(rt, group_port, &again), 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_watch_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
