// peer_args.h - command-line helpers the Asio peers share: "--name=value"
// or "--name value", and unsigned values within bounds. Header-only.
#ifndef WEFT_PEER_ARGS_H
#define WEFT_PEER_ARGS_H

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace peer {

// argv[*i] split at its first '=' when it starts with "--": name, and
// value (NULL without '='). value_of takes the value: after '=', else the
// next argument (which *i then skips), else NULL.
struct arg {
  std::string name;
  const char *value = nullptr;
  bool inline_value = false;

  arg(int i, char **argv) : name(argv[i]) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      value = argv[i] + eq + 1;
      inline_value = true;
    }
  }

  const char *value_of(int argc, char **argv, int *i) const {
    return inline_value ? value : (*i + 1 < argc ? argv[++*i] : nullptr);
  }
};

// *out = s as a decimal in [lo, hi]; false (nothing written) otherwise.
inline bool parse_u64(const char *s, std::uint64_t lo, std::uint64_t hi,
                      std::uint64_t *out) {
  if (s == nullptr || *s == '\0' || *s == '-' || *s == '+')
    return false;
  char *end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

} // namespace peer

#endif
