/*
 * unix.c - Unix domain stream sockets (unix.h): the address helper, a
 * listener's socket file, and the peer's credentials. Owns nothing but the
 * file a listener bound: connections and listeners on Unix sockets are
 * tcp.c's and listen.c's, through the same verbs as TCP.
 *
 * A socket file outlives its socket: a server that crashed leaves one,
 * and bind(2) on it fails with EADDRINUSE. At bind, weft replaces a file
 * that is a socket nobody listens on (a connect to it is refused) and
 * leaves anything else alone: a live listener, or a file that is not a
 * socket, gives -EADDRINUSE. The check and the replacement are not atomic:
 * two processes binding the same stale path at once may both see it
 * stale, and the later bind removes the earlier's file (its socket keeps
 * listening, unreachable by the path). Servers that can start twice at
 * once serialize their start (a lock file) or use the abstract namespace.
 * At close a listener removes its file if the path still names it (same
 * device and inode as after bind), so a file another server bound since
 * stays.
 */
#include "unix.h"

#include "rt.h"
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define PATH_OFF offsetof(struct sockaddr_un, sun_path)

int weft_unix_addr(struct sockaddr_un *sa, const char *path) {
  if (!sa || !path || !path[0])
    return -EINVAL;
  bool abstract = path[0] == '@';
  size_t n = strlen(path);
  /* A path needs its NUL inside sun_path; an abstract name's bytes are
   * the '@' turned into a NUL and the rest, with no NUL after them. */
  if (n + !abstract > sizeof(sa->sun_path))
    return -ENAMETOOLONG;
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, path, n);
  if (abstract)
    sa->sun_path[0] = '\0';
  return (int)(PATH_OFF + n + !abstract);
}

bool weft__unix_is_path(const struct sockaddr_storage *addr, unsigned len) {
  const struct sockaddr_un *u = (const struct sockaddr_un *)addr;
  return len > PATH_OFF && u->sun_path[0] != '\0';
}

/* The path of addr as a C string, in buf (sun_path need not hold a NUL
 * when the address fills it). len may count one byte past sun_path: for
 * a path of all 108 bytes, getsockname reports the length with the NUL
 * the kernel adds after it (into the sockaddr_storage). */
static const char *
path_of(const struct sockaddr_storage *addr, unsigned len,
        char buf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1]) {
  const struct sockaddr_un *u = (const struct sockaddr_un *)addr;
  size_t n = len - PATH_OFF;
  if (n > sizeof(u->sun_path))
    n = sizeof(u->sun_path);
  n = strnlen(u->sun_path, n);
  memcpy(buf, u->sun_path, n);
  buf[n] = '\0';
  return buf;
}

/* Whether the socket file at addr is stale: a socket whose connect is
 * refused. A full backlog (EAGAIN) is a live listener. */
static bool stale(const struct sockaddr_storage *addr, unsigned len,
                  const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
    return false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return false;
  int r = connect(fd, (const struct sockaddr *)addr, len);
  bool refused = r < 0 && errno == ECONNREFUSED;
  close(fd);
  return refused;
}

int weft__unix_bind(int fd, const struct sockaddr_storage *addr, unsigned len,
                    struct weft__unix_file *f) {
  f->bound = false;
  const struct sockaddr *sa = (const struct sockaddr *)addr;
  if (bind(fd, sa, len) < 0) {
    int err = errno;
    char buf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    if (err != EADDRINUSE || !weft__unix_is_path(addr, len))
      return -err;
    const char *path = path_of(addr, len, buf);
    if (!stale(addr, len, path) || unlink(path) < 0 || bind(fd, sa, len) < 0)
      return -EADDRINUSE;
  }
  if (weft__unix_is_path(addr, len)) {
    char buf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    struct stat st;
    if (lstat(path_of(addr, len, buf), &st) == 0) {
      f->bound = true;
      f->dev = st.st_dev;
      f->ino = st.st_ino;
    }
  }
  return 0;
}

/* A Unix connect never waits for the network: it succeeds, or fails at
 * once with EAGAIN when the listener's backlog is full. It is made here
 * with a direct connect(2) on both backends: io_uring's connect of a
 * Unix socket whose listener's backlog is full does not fail but waits
 * until the listener accepts (seen on Linux 6.18), and the io_uring
 * backend's sockets are blocking, so O_NONBLOCK is set around the call. */
int weft__unix_connect(int fd, const struct sockaddr *addr, unsigned len) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0)
    return -errno;
  if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -errno;
  int r;
  do
    r = connect(fd, addr, len);
  while (r < 0 && errno == EINTR);
  int err = r < 0 ? errno : 0;
  if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl) < 0 && !err)
    err = errno;
  return -err;
}

void weft__unix_unlink(const struct sockaddr_storage *addr, unsigned len,
                       struct weft__unix_file *f) {
  if (!f->bound)
    return;
  f->bound = false;
  char buf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
  const char *path = path_of(addr, len, buf);
  struct stat st;
  if (lstat(path, &st) == 0 && st.st_dev == f->dev && st.st_ino == f->ino)
    unlink(path);
}

int weft_tcp_peer_cred(weft_tcp *c, weft_cred *out) {
  struct weft__sock *s = c ? &weft__conn_of(c)->s : NULL;
  if (!s || !out || s->kind != SK_CONN)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(s)))
    return -ECHILD;
  if (!weft__sock_on_strand(s))
    return weft__tcp_off_strand(weft__conn_of(c), "weft_tcp_peer_cred");
  if (s->fd < 0)
    return -EBADF;
  int r = weft__unix_conn_check(weft__conn_of(c));
  if (r)
    return r;
  struct ucred uc;
  socklen_t len = sizeof(uc);
  if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
    return -errno;
  out->pid = uc.pid;
  out->uid = uc.uid;
  out->gid = uc.gid;
  return 0;
}
