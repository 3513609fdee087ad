/*
 * log.c - weft's messages (log.h): formatting, the level filter, the
 * user's log function or stderr, and naming code addresses. Owns nothing
 * but the runtime's log settings.
 */
#include "log.h"

#include "rt.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int level_from_env(void) {
  const char *v = getenv("WEFT_LOG");
  if (!v)
    return 0;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(v, names[i]) == 0)
      return i + 1;
  return 0;
}

void weft__log_init(struct weft__log *lg, const weft_config *c) {
  lg->fn = c->log_fn;
  lg->ctx = c->log_ctx;
  lg->level = c->log_level;
  if (!lg->level)
    lg->level = level_from_env();
  if (!lg->level)
#ifdef WEFT_DEBUG
    lg->level = WEFT_LOG_DEBUG;
#else
    lg->level = WEFT_LOG_WARN;
#endif
}

void weft__log(weft_rt *rt, int level, const char *fmt, ...) {
  if (level > rt->log.level)
    return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (rt->log.fn)
    rt->log.fn(rt->log.ctx, level, msg);
  else
    fprintf(stderr, "weft: %s\n", msg); /* one write: lines do not mix */
}

const char *weft__addr_name(const void *addr, char *buf, size_t len) {
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (!addr || !dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) ||
      !info.dli_fname) {
    snprintf(buf, len, "%p", addr);
    return buf;
  }
  const char *obj = strrchr(info.dli_fname, '/');
  obj = obj ? obj + 1 : info.dli_fname;
  uintptr_t off = (uintptr_t)addr - (uintptr_t)info.dli_fbase;
  /* dladdr names the nearest exported symbol below addr, which for a
   * static function is some other function: only a symbol whose extent
   * holds addr names it. The object and offset always do (addr2line). */
  size_t in = (size_t)((uintptr_t)addr - (uintptr_t)info.dli_saddr);
  if (info.dli_sname && sym && in < sym->st_size && in == 0)
    snprintf(buf, len, "%s (%s+0x%zx)", info.dli_sname, obj, (size_t)off);
  else if (info.dli_sname && sym && in < sym->st_size)
    snprintf(buf, len, "%s+0x%zx (%s+0x%zx)", info.dli_sname, in, obj,
             (size_t)off);
  else
    snprintf(buf, len, "%s+0x%zx", obj, (size_t)off);
  return buf;
}
