/*
 * unix.h, unix.c - what is particular to Unix domain stream sockets, which
 * otherwise are connections and listeners like TCP's (tcp.c, listen.c):
 * the address helper, the socket file of a listener bound to a path (a
 * stale one replaced at bind, its own removed at close), and the peer's
 * credentials. unix_fds.c: passing descriptors, the receiving side (the
 * sending side is a write: tcp_send.c).
 */
#ifndef WEFT_UNIX_H
#define WEFT_UNIX_H

#include "core.h"

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

/* The socket file a listener bound, to remove at close only if it is still
 * the one bound (nobody replaced it meanwhile). */
struct weft__unix_file {
  bool bound; /* a path (not abstract, not autobound), and bound */
  dev_t dev;
  ino_t ino;
};

/* Whether addr names a path in the file system (not the abstract
 * namespace, not autobind). */
bool weft__unix_is_path(const struct sockaddr_storage *addr, unsigned len);
/* bind(2) of fd to a Unix address, replacing a stale socket file: one
 * where nobody listens (connect refused). 0 or a negative errno. */
int weft__unix_bind(int fd, const struct sockaddr_storage *addr, unsigned len,
                    struct weft__unix_file *f);
/* A Unix connect, answered at once: 0 or a negative errno (-EAGAIN: the
 * listener's backlog is full). */
int weft__unix_connect(int fd, const struct sockaddr *addr, unsigned len);
/* Removes f's file if it is still the one bound. */
void weft__unix_unlink(const struct sockaddr_storage *addr, unsigned len,
                       struct weft__unix_file *f);

struct weft__conn;
/* 0 if c's socket is a Unix one, else -EAFNOSUPPORT (or getsockopt's
 * error). */
int weft__unix_conn_check(struct weft__conn *c);

/* Descriptors received on a connection and not yet taken (a ring of max),
 * and the msghdr of its receive, which io_uring reads and writes back
 * until the receive completes. */
struct weft__fdq {
  unsigned max, head, count;
  bool dropped; /* some were closed on arrival since the last take */
  struct msghdr msg;
  struct iovec iov;
  union {
    size_t align; /* a cmsghdr's (its cmsg_len) */
    /* CMSG_SPACE(sizeof(int) * 253), which clang does not take as a
     * constant, is 1032 on Linux: rounded up here */
    char buf[sizeof(struct cmsghdr) + sizeof(int) * 256];
  } ctl;
  int fds[];
};

/* The msghdr for a receive into c's read buffer, with room for as many
 * descriptors as c may still hold (none: the kernel closes them). */
struct msghdr *weft__fdq_msg(struct weft__conn *c);
/* After a receive that returned bytes: keeps the descriptors it carried. */
void weft__fdq_collect(struct weft__conn *c);
/* Closing: the descriptors not taken are closed, the queue freed. */
void weft__fdq_free(struct weft__conn *c);

#endif
