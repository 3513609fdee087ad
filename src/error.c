/*
 * error.c - error names (errno's, and weft's own WEFT_EAI_*) and the
 * library version. Owns nothing.
 */
#include "core.h"

#include <limits.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

unsigned weft_version(void) { return WEFT_VERSION_HEX; }

const char *weft_version_string(void) {
  return STR(WEFT_VERSION_MAJOR) "." STR(WEFT_VERSION_MINOR) "." STR(
      WEFT_VERSION_PATCH);
}

const char *weft_strerror(int err) {
  if (err == 0)
    return "Success";
  if (err == INT_MIN)
    return "Unknown error";
  if (err < 0)
    err = -err;
  switch (err) {
  case -WEFT_EAI_NONAME:
    return "Name or service not known";
  case -WEFT_EAI_AGAIN:
    return "Temporary failure in name resolution";
  case -WEFT_EAI_FAIL:
    return "Non-recoverable failure in name resolution";
  }
  /* strerrordesc_np (glibc >= 2.32) returns a static string without
   * touching errno or a shared buffer, so it is thread-safe. */
  const char *s = strerrordesc_np(err);
  return s ? s : "Unknown error";
}
