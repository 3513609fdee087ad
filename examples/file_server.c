/*
 * file_server - a static file server on weft: HTTP/1.1 GET and HEAD of the
 * files under a directory, with keep-alive, single byte ranges, and the
 * bodies sent with no copy through user space (weft_tcp_sendfile).
 *
 *   file_server --root DIR [--port P] [--threads N] [--host ADDR]
 *               [--unix PATH]
 *
 * A request's path is taken below DIR ("/a/b.txt" is DIR/a/b.txt; "/" and
 * paths ending in "/" get index.html there). Paths with "..", "//", a
 * percent sign or a NUL are refused (400): nothing outside DIR can be
 * named, though symbolic links inside it are followed. Answers: 200, 206
 * for "Range: bytes=A-B", "bytes=A-" or "bytes=-N", 416 for a range
 * past the end, 404, 403, 405 for other methods, 400, 431 for a head over
 * 4 KiB. Requests are answered one at a time, pipelined ones included.
 *
 * The file is opened with weft_fs_open (the lookup may read directories
 * from disk: on the ring, or on the blocking pool, never on a worker);
 * fstat and close of a descriptor already open never wait for a disk, so
 * they are called directly. The body goes with weft_tcp_sendfile after the
 * header, and its callback closes the file and goes on to the next
 * request. Per-connection state is freed once the connection is closed
 * and no file operation of it is in flight.
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit 0).
 */
#include <weft.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "netutil.h"

#define HEAD_MAX 4096
#define PATH_MAX_LEN 1024

static weft_rt *g_rt;
static const char *g_root;

struct fconn {
  weft_tcp *c;
  bool closed;       /* the close callback ran */
  bool opening;      /* a weft_fs_open is in flight */
  bool last;         /* close once this answer is sent */
  bool head;         /* HEAD: no body */
  bool ranged;       /* a Range header asked for part of the file */
  int fd;            /* the file being sent, or -1 */
  size_t used;       /* bytes of buf the request being answered takes */
  size_t len;        /* bytes in buf */
  int64_t first;     /* range: first byte, or -1 for a suffix of last bytes */
  int64_t last_byte; /* range: last byte, or -1 for "to the end" */
  char out[512];     /* the response head */
  char path[PATH_MAX_LEN];
  char buf[HEAD_MAX];
};

static void next_request(struct fconn *f);

static void fconn_free(struct fconn *f) {
  if (f->fd >= 0)
    close(f->fd);
  free(f);
}

static void on_close(void *data, weft_tcp *c) {
  (void)c;
  struct fconn *f = data;
  f->closed = true;
  if (!f->opening)
    fconn_free(f);
}

/* The answer is sent (or failed): the next request, or the end. */
static void on_sent(void *arg, weft_tcp *c, int status) {
  struct fconn *f = arg;
  if (f->fd >= 0) {
    close(f->fd);
    f->fd = -1;
  }
  if (status < 0 || f->last) {
    weft_tcp_close(c, 0);
    return;
  }
  memmove(f->buf, f->buf + f->used, f->len - f->used);
  f->len -= f->used;
  f->used = 0;
  next_request(f);
}

/* Sends head (and, when fd >= 0 and len > 0, len bytes of fd from off). */
static void send_answer(struct fconn *f, int len_head, int64_t off,
                        size_t len) {
  bool body = f->fd >= 0 && len > 0 && !f->head;
  int r =
      weft_tcp_write(f->c, f->out, (size_t)len_head, body ? NULL : on_sent, f);
  if (r == 0 && body)
    r = weft_tcp_sendfile(f->c, f->fd, off, len, on_sent, f);
  if (r < 0)
    weft_tcp_close(f->c, 0);
}

static void send_error(struct fconn *f, int code, const char *reason,
                       const char *extra) {
  int n = snprintf(
      f->out, sizeof f->out, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n%s%s\r\n",
      code, reason, extra ? extra : "", f->last ? "Connection: close\r\n" : "");
  send_answer(f, n, 0, 0);
}

static const char *content_type(const char *path) {
  static const char *const types[][2] = {
      {".html", "text/html"},        {".txt", "text/plain"},
      {".css", "text/css"},          {".js", "text/javascript"},
      {".json", "application/json"}, {".png", "image/png"},
      {".jpg", "image/jpeg"},        {".svg", "image/svg+xml"},
  };
  const char *dot = strrchr(path, '.');
  for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
    if (!strcmp(dot, types[i][0]))
      return types[i][1];
  return "application/octet-stream";
}

/* The file is open: its head, then its bytes (all, or the range). */
static void on_open(void *arg, long result) {
  struct fconn *f = arg;
  f->opening = false;
  if (f->closed) {
    if (result >= 0)
      close((int)result);
    fconn_free(f);
    return;
  }
  if (result < 0) {
    bool denied = result == -EACCES || result == -EPERM;
    send_error(f, denied ? 403 : 404, denied ? "Forbidden" : "Not Found", NULL);
    return;
  }
  f->fd = (int)result;
  struct stat st;
  if (fstat(f->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    send_error(f, 404, "Not Found", NULL);
    return;
  }
  int64_t size = st.st_size, from = 0, to = size - 1;
  if (f->ranged) {
    from = f->first >= 0 ? f->first : size - f->last_byte;
    to = f->first >= 0 && f->last_byte >= 0 && f->last_byte < size
             ? f->last_byte
             : size - 1;
    if (from < 0)
      from = 0;
    if (from >= size || (f->first < 0 && f->last_byte == 0)) {
      char cr[64];
      snprintf(cr, sizeof cr, "Content-Range: bytes */%" PRId64 "\r\n", size);
      send_error(f, 416, "Range Not Satisfiable", cr);
      return;
    }
  }
  size_t len = (size_t)(to - from + 1);
  int n = snprintf(f->out, sizeof f->out,
                   "HTTP/1.1 %s\r\nContent-Length: %zu\r\nContent-Type: "
                   "%s\r\n",
                   f->ranged ? "206 Partial Content" : "200 OK", len,
                   content_type(f->path));
  if (f->ranged)
    n +=
        snprintf(f->out + n, sizeof f->out - (size_t)n,
                 "Content-Range: bytes %" PRId64 "-%" PRId64 "/%" PRId64 "\r\n",
                 from, to, size);
  n += snprintf(f->out + n, sizeof f->out - (size_t)n, "%s\r\n",
                f->last ? "Connection: close\r\n" : "");
  send_answer(f, n, from, len);
}

/* The value of header name in the head [p, end), or NULL; *len its size. */
static const char *header(const char *p, const char *end, const char *name,
                          size_t *len) {
  size_t nl = strlen(name);
  for (const char *line = p; line < end;) {
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol)
      break;
    if ((size_t)(eol - line) > nl && !strncasecmp(line, name, nl) &&
        line[nl] == ':') {
      const char *v = line + nl + 1;
      while (v < eol && (*v == ' ' || *v == '\t'))
        v++;
      const char *ve = eol;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
        ve--;
      *len = (size_t)(ve - v);
      return v;
    }
    line = eol + 1;
  }
  return NULL;
}

/* "bytes=A-B", "bytes=A-" or "bytes=-N" into f; false if it is none. */
static bool parse_range(struct fconn *f, const char *v, size_t n) {
  char s[64];
  if (n < 7 || n >= sizeof s || strncmp(v, "bytes=", 6))
    return false;
  memcpy(s, v + 6, n - 6);
  s[n - 6] = '\0';
  char *dash = strchr(s, '-'), *e;
  if (!dash || strchr(s, ','))
    return false;
  *dash = '\0';
  f->first = f->last_byte = -1;
  if (*s) {
    f->first = strtoll(s, &e, 10);
    if (*e || f->first < 0)
      return false;
  }
  if (dash[1]) {
    f->last_byte = strtoll(dash + 1, &e, 10);
    if (*e || f->last_byte < 0)
      return false;
  }
  if (f->first < 0 && f->last_byte < 0)
    return false;
  return f->first < 0 || f->last_byte < 0 || f->first <= f->last_byte;
}

/* Sets f->path from the request target [t, t + n); false if refused. */
static bool map_path(struct fconn *f, const char *t, size_t n) {
  if (!n || t[0] != '/' || memchr(t, '%', n) || memchr(t, '\0', n))
    return false;
  const char *q = memchr(t, '?', n);
  if (q)
    n = (size_t)(q - t);
  for (size_t i = 0; i + 1 < n; i++)
    if (t[i] == '/' &&
        (t[i + 1] == '/' || (t[i + 1] == '.' && i + 2 < n && t[i + 2] == '.' &&
                             (i + 3 == n || t[i + 3] == '/'))))
      return false;
  int w = snprintf(f->path, sizeof f->path, "%s%.*s%s", g_root, (int)n, t,
                   t[n - 1] == '/' ? "index.html" : "");
  return w > 0 && (size_t)w < sizeof f->path;
}

/* Parses the complete head [buf, buf + end) and starts its answer. */
static void answer(struct fconn *f, size_t end) {
  const char *p = f->buf, *e = f->buf + end;
  f->used = end;
  f->ranged = false;
  const char *sp1 = memchr(p, ' ', (size_t)(e - p));
  const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(e - sp1 - 1)) : NULL;
  size_t n;
  const char *conn = header(p, e, "Connection", &n);
  f->last = conn && n == 5 && !strncasecmp(conn, "close", 5);
  if (!sp2 || strncmp(sp2 + 1, "HTTP/1.", 7)) {
    f->last = true;
    send_error(f, 400, "Bad Request", NULL);
    return;
  }
  if (sp2[8] == '0' &&
      !(conn && n == 10 && !strncasecmp(conn, "keep-alive", 10)))
    f->last = true; /* HTTP/1.0 closes unless asked not to */
  f->head = sp1 - p == 4 && !memcmp(p, "HEAD", 4);
  if (!f->head && !(sp1 - p == 3 && !memcmp(p, "GET", 3))) {
    send_error(f, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
    return;
  }
  if (!map_path(f, sp1 + 1, (size_t)(sp2 - sp1 - 1))) {
    send_error(f, 400, "Bad Request", NULL);
    return;
  }
  const char *range = header(p, e, "Range", &n);
  if (range && parse_range(f, range, n))
    f->ranged = true;
  f->opening = true;
  int r = weft_fs_open(g_rt, weft_tcp_strand(f->c), f->path, O_RDONLY, 0,
                       on_open, f);
  if (r < 0) {
    f->opening = false;
    weft_tcp_close(f->c, 0);
  }
}

static void on_read(void *arg, weft_tcp *c, long n);

/* Answers the next complete request in the buffer, or reads on. */
static void next_request(struct fconn *f) {
  const char *e = f->len ? memmem(f->buf, f->len, "\r\n\r\n", 4) : NULL;
  if (e) {
    answer(f, (size_t)(e - f->buf) + 4);
  } else if (f->len == sizeof f->buf) {
    f->last = true;
    static const char too_big[] = "HTTP/1.1 431 Request Header Fields Too "
                                  "Large\r\nContent-Length: 0\r\nConnection: "
                                  "close\r\n\r\n";
    memcpy(f->out, too_big, sizeof too_big - 1);
    send_answer(f, (int)sizeof too_big - 1, 0, 0);
  } else if (weft_tcp_read(f->c, f->buf + f->len, sizeof f->buf - f->len,
                           on_read, f) < 0) {
    weft_tcp_close(f->c, 0);
  }
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct fconn *f = arg;
  if (n <= 0) {
    weft_tcp_close(c, 0);
    return;
  }
  f->len += (size_t)n;
  next_request(f);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct fconn *f = calloc(1, sizeof *f);
  if (!f) {
    weft_tcp_close(c, 1);
    return;
  }
  f->c = c;
  f->fd = -1;
  weft_tcp_set_data(c, f, on_close);
  weft_tcp_nodelay(c, 1);
  next_request(f);
}

static void usage(void) {
  fprintf(stderr, "usage: file_server --root DIR [--port P] [--threads N] "
                  "[--host ADDR] [--unix PATH]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc)
      usage();
    if (!strcmp(argv[i], "--root"))
      g_root = argv[i + 1];
    else if (ex_common_opt(&o, argv[i], argv[i + 1]) != 1)
      usage();
  }
  struct stat st;
  if (!g_root || stat(g_root, &st) < 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "file_server: --root must name a directory\n");
    usage();
  }
  size_t rl = strlen(g_root);
  while (rl > 1 && g_root[rl - 1] == '/')
    rl--; /* paths start with '/' */
  g_root = strndup(g_root, rl);
  g_rt = ex_rt_create("file_server", &o);
  weft_listener *l = ex_listen("file_server", g_rt, &o, on_accept, NULL);
  return ex_serve("file_server", g_rt, l, NULL, NULL);
}
