/*
 * unix.h, unix.c - what is particular to Unix domain stream sockets, which
 * otherwise are connections and listeners like TCP's (tcp.c, listen.c):
 * the address helper, the socket file of a listener bound to a path (a
 * stale one replaced at bind, its own removed at close), and the peer's
 * credentials.
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

#endif
