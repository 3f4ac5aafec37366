// tracepipe_native: one chunk of traceEvents text -> the column buffers tracepipe's struct builder
// (pipeline/read/by_struct.py) builds, in one native pass with simdjson On-Demand.
//
// The contract is narrow on purpose: `build(text)` either returns every column exactly as the
// Python builder would make it, or None, and then the Python builders take the chunk. Anything
// the fast path does not cover (a key beyond the plain event's, a value of another type, an id
// beyond int64, a \u escape of no character (a lone surrogate), a timestamp with an exponent, a
// number that is not its float's exact text, nesting deeper than MAX_DEPTH, invalid JSON
// anywhere) is None.
// Every value is validated, args included (they are walked, not skipped): a chunk the Python
// builders would refuse is refused here.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#if defined(__AVX2__) && (defined(__GNUC__) || defined(__clang__))
#define TS_KEYS_AVX2 1
#include <immintrin.h>
#endif

#include "simdjson/simdjson.h"

using namespace simdjson;

namespace {

struct Bail {};  // the chunk is not for the fast path: the Python builders take it

constexpr int MAX_DEPTH = 64;               // nesting the fast path walks (pipeline.read.tame: 64)
constexpr double FLOAT_EXACT_US = 4.39e12;  // pipeline.read.values.FLOAT_EXACT_US
constexpr double EXACT_TEXT_MAX_US = 9.2e15;
constexpr int64_t INT64_MIN_ = INT64_MIN;

// ------------------------------------------------------------------ column buffers (Arrow layout)
struct Validity {
  std::vector<uint8_t> bits;
  int64_t nulls = 0;
  void clear() {
    bits.clear();
    nulls = 0;
  }
  void push(bool valid, int64_t i) {
    if ((i & 7) == 0) bits.push_back(0);
    if (valid)
      bits.back() |= uint8_t(1u << (i & 7));
    else
      ++nulls;
  }
};

struct StrCol {
  std::vector<int32_t> offsets{0};
  std::string data;
  Validity valid;
  void clear() {
    offsets.assign(1, 0);
    data.clear();
    valid.clear();
  }
  void push(std::string_view s, int64_t i) {
    data.append(s);
    if (data.size() > INT32_MAX) throw Bail{};
    offsets.push_back(int32_t(data.size()));
    valid.push(true, i);
  }
  void push_null(int64_t i) {
    offsets.push_back(int32_t(data.size()));
    valid.push(false, i);
  }
  std::string_view at(int64_t i) const {  // row i's text
    return std::string_view(data).substr(size_t(offsets[i]), size_t(offsets[i + 1] - offsets[i]));
  }
};

template <typename T>
struct NumCol {
  std::vector<T> v;
  Validity valid;
  void clear() {
    v.clear();
    valid.clear();
  }
  void push(T x, int64_t i) {
    v.push_back(x);
    valid.push(true, i);
  }
  void push_null(int64_t i) {
    v.push_back(0);
    valid.push(false, i);
  }
};
using IntCol = NumCol<int64_t>;
using DblCol = NumCol<double>;

inline std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

thread_local ondemand::parser *t_parser = nullptr;

// ------------------------------------------------------------------ GPU args (configured from Python)
// kinds of the GPU arg fields: an int, a list of >= 3 ints (x, y, z), a number kept as a float64
enum Kind { K_INT = 0, K_DIMS = 1, K_FLOAT = 2 };
struct GpuKey {
  std::string key;
  int field;     // index into the fields
  int priority;  // 0: the key itself; 1, 2, ...: a backend's alias, read where the ones before are null
};
std::vector<GpuKey> g_gpu_keys;
std::vector<int> g_field_kinds;

// `configure_rows`: what picks a chunk's GPU activity, flow endpoints and launch calls
// (pipeline/read/tables.py's gpu_and_flow_rows, launches.py's launch_counts)
struct RowRules {
  bool set = false;
  std::vector<std::string> gpu_cats;                        // GPU_KINDS' categories
  std::vector<std::pair<std::string, int64_t>> on_device;  // a category on a device's process: pid below
  std::vector<std::string> flow_phases;
  std::vector<std::string> launch_cats;  // lower case
};
RowRules g_rows;

// ------------------------------------------------------------------ numbers
struct Number {
  bool is_int = false;  // written without '.', 'e', 'E'
  int64_t i = 0;
  double d = 0;
  std::string_view text;  // the token, trailing whitespace trimmed
};

Number number_of(ondemand::value &v) {
  Number n;
  n.text = trim_right(v.raw_json_token());
  bool has_exp = false, has_dot = false;
  for (char c : n.text) {
    if (c == '.') has_dot = true;
    if (c == 'e' || c == 'E') has_exp = true;
  }
  n.is_int = !has_dot && !has_exp;
  if (n.is_int) {
    auto r = v.get_int64();  // validates; a uint64 or a bigger integer is an error: Bail
    if (r.error()) throw Bail{};
    n.i = r.value_unsafe();
    if (n.i == INT64_MIN_) throw Bail{};
    n.d = double(n.i);
  } else {
    auto r = v.get_double();
    if (r.error()) throw Bail{};
    n.d = r.value_unsafe();
  }
  return n;
}

// exact ns of a µs decimal text (-?digits[.digits]), digits below a ns rounded half to even; false if
// the text is not such a number or the result would not fit (pipeline.read.timestamps.ns_of_decimal_texts)
bool exact_ns(std::string_view t, int64_t &out) {
  size_t p = 0;
  bool neg = false;
  if (p < t.size() && t[p] == '-') {
    neg = true;
    ++p;
  }
  size_t w0 = p;
  __int128 whole = 0;
  while (p < t.size() && t[p] >= '0' && t[p] <= '9') {
    whole = whole * 10 + (t[p] - '0');
    if (whole > (__int128)10000000000000000000ULL) return false;
    ++p;
  }
  if (p == w0) return false;
  __int128 frac3 = 0;
  int nfrac = 0;
  bool below_any = false;  // digits after the third decimal: first one and whether others are non-zero
  int below_first = -1;
  bool below_rest_nonzero = false;
  if (p < t.size() && t[p] == '.') {
    ++p;
    size_t f0 = p;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') {
      int d = t[p] - '0';
      if (nfrac < 3)
        frac3 = frac3 * 10 + d;
      else if (nfrac == 3)
        below_first = d, below_any = true;
      else if (d)
        below_rest_nonzero = true;
      ++nfrac;
      ++p;
    }
    if (p == f0) return false;
  }
  if (p != t.size()) return false;
  for (int k = nfrac; k < 3; ++k) frac3 *= 10;
  __int128 ns = whole * 1000 + frac3;
  if (below_any) {
    bool up = below_first > 5 || (below_first == 5 && (below_rest_nonzero || (ns & 1)));
    if (up) ns += 1;
  }
  if (neg) ns = -ns;
  if (ns > (__int128)INT64_MAX || ns <= (__int128)INT64_MIN) return false;
  out = (int64_t)ns;
  return true;
}

// ------------------------------------------------------------------ validation of a whole value
void walk(ondemand::value &v, int depth);

void walk_object(ondemand::object o, int depth) {
  for (auto &&f : o) {  // bound, not copied: copies of simdjson's iterators through the stack stalled
    if (f.error()) throw Bail{};
    ondemand::field &field = f.value_unsafe();
    std::string_view key = field.escaped_key();
    if (key.find('\\') != std::string_view::npos) {
      auto u = field.unescaped_key();  // validates the escapes
      if (u.error()) throw Bail{};
    }
    walk(field.value(), depth + 1);
  }
}

void walk(ondemand::value &v, int depth) {
  if (depth > MAX_DEPTH) throw Bail{};
  switch (v.type().value()) {
    case ondemand::json_type::object:
      walk_object(v.get_object().value(), depth);
      break;
    case ondemand::json_type::array:
      for (auto e : v.get_array().value()) walk(e.value(), depth + 1);
      break;
    case ondemand::json_type::string: {
      std::string_view tok = v.raw_json_token();
      for (unsigned char c : trim_right(tok))
        if (c < 0x20) throw Bail{};
      if (tok.find('\\') != std::string_view::npos) {
        if (v.get_string().error()) throw Bail{};  // validates the escapes (a lone surrogate is an error)
      } else if (v.get_raw_json_string().error()) {  // consumed: see string_of
        throw Bail{};
      }
      break;
    }
    case ondemand::json_type::number: {
      auto r = v.get_number();  // validates; a big integer is an error
      if (r.error()) throw Bail{};
      break;
    }
    case ondemand::json_type::boolean:
      if (v.get_bool().error()) throw Bail{};
      break;
    case ondemand::json_type::null:
      if (!v.is_null().value()) throw Bail{};
      break;
    default:
      throw Bail{};
  }
}

// a string value's text (unescaped); Bail on control characters and invalid escapes
std::string_view string_of(ondemand::value &v) {
  std::string_view tok = trim_right(v.raw_json_token());
  if (tok.size() < 2 || tok.front() != '"' || tok.back() != '"') throw Bail{};
  std::string_view inner = tok.substr(1, tok.size() - 2);
  for (unsigned char c : inner)
    if (c < 0x20) throw Bail{};
  if (inner.find('\\') == std::string_view::npos) {
    // consumed (a value left unconsumed is skipped by bracket depth alone, unchecked)
    if (v.get_raw_json_string().error()) throw Bail{};
    return inner;
  }
  auto r = v.get_string();  // \u escapes to UTF-8, as the Python builders read them; a lone surrogate fails
  if (r.error()) throw Bail{};
  return r.value_unsafe();
}

// ------------------------------------------------------------------ the chunk
enum EvKey { E_PH, E_CAT, E_NAME, E_PID, E_TID, E_TS, E_DUR, E_ID, E_ARGS, E_BP, E_S, E_N };

int event_key(std::string_view k) {
  switch (k.size()) {
    case 1:
      if (k[0] == 's') return E_S;
      break;
    case 2:
      if (k == "ph") return E_PH;
      if (k == "ts") return E_TS;
      if (k == "id") return E_ID;
      if (k == "bp") return E_BP;
      break;
    case 3:
      if (k == "cat") return E_CAT;
      if (k == "pid") return E_PID;
      if (k == "tid") return E_TID;
      if (k == "dur") return E_DUR;
      break;
    case 4:
      if (k == "name") return E_NAME;
      if (k == "args") return E_ARGS;
      break;
  }
  return -1;
}

struct IdOrStr {
  IntCol ints;
  StrCol strs;
  void clear() {
    ints.clear();
    strs.clear();
  }
  void push(ondemand::value &v, int64_t i) {
    switch (v.type().value()) {
      case ondemand::json_type::number: {
        Number n = number_of(v);
        if (!n.is_int) throw Bail{};  // a float id: the Python builders coerce it
        ints.push(n.i, i);
        strs.push_null(i);
        break;
      }
      case ondemand::json_type::string:
        strs.push(string_of(v), i);
        ints.push_null(i);
        break;
      case ondemand::json_type::null:
        if (!v.is_null().value()) throw Bail{};
        push_null(i);
        break;
      default:
        throw Bail{};
    }
  }
  void push_null(int64_t i) {
    ints.push_null(i);
    strs.push_null(i);
  }
};

// µs times (ts, dur) as the Python builder makes them: every int -> *1000 (checked); with a float
// in the chunk, all below FLOAT_EXACT_US -> round(v * 1000.0) half to even, of the float (as the
// Python builder computes it: a text with digits below a ns, as a scaled trace's shifted times
// have, need not give its exact decimal), else (ts only) the exact decimal text
struct Times {
  std::vector<int64_t> exact;  // exact ns from the text
  std::vector<double> us;      // the value as a float64
  Validity valid;
  bool has_float = false, all_int_fit = true, all_exact = true, all_small = true, all_below_text_max = true;
  bool ints_exact_as_float = true;
  int64_t n_present = 0;
  bool takes_strings = false;  // decimal strings (torch_npu's ts), as timestamps.ns_column_of_strings
  int64_t n_strings = 0, n_numbers = 0;
  void clear() {
    exact.clear();
    us.clear();
    valid.clear();
    has_float = false;
    all_int_fit = all_exact = all_small = all_below_text_max = ints_exact_as_float = true;
    n_present = n_strings = n_numbers = 0;
  }
  void push(ondemand::value &v, int64_t i) {
    auto t = v.type().value();
    if (t == ondemand::json_type::null) {
      if (!v.is_null().value()) throw Bail{};
      push_null(i);
      return;
    }
    if (t == ondemand::json_type::string && takes_strings) {
      push_string(v, i);
      return;
    }
    if (t != ondemand::json_type::number) throw Bail{};
    ++n_numbers;
    Number n = number_of(v);
    int64_t ns = 0;
    if (n.is_int) {
      if (__builtin_mul_overflow(n.i, int64_t(1000), &ns)) all_int_fit = false;
      if (n.i > (int64_t(1) << 53) || n.i < -(int64_t(1) << 53)) ints_exact_as_float = false;
    } else {
      has_float = true;
      if (!exact_ns(n.text, ns)) all_exact = false;  // an exponent, say
    }
    double a = std::fabs(n.d);
    if (!(a < FLOAT_EXACT_US)) all_small = false;
    if (!(a < EXACT_TEXT_MAX_US)) all_below_text_max = false;
    exact.push_back(ns);
    us.push_back(n.d);
    valid.push(true, i);
    ++n_present;
  }
  void push_null(int64_t i) {
    exact.push_back(0);
    us.push_back(0);
    valid.push(false, i);
  }
  // `"ts": "1736405443863674.400"`: exact ns from the string's digits (half to even below a ns),
  // never through a float; anything but -?digits[.digits] below 9.2e15 µs is the Python builders'
  void push_string(ondemand::value &v, int64_t i) {
    std::string_view text = v.get_string().value();  // the string's value, as Python reads it
    int64_t ns = 0;
    if (!exact_ns(text, ns)) throw Bail{};
    double d = std::strtod(std::string(text).c_str(), nullptr);  // the Python route's float cast
    if (!(std::fabs(d) < EXACT_TEXT_MAX_US)) throw Bail{};
    exact.push_back(ns);
    us.push_back(d);
    valid.push(true, i);
    ++n_present;
    ++n_strings;
  }
  // the ns column, or Bail. `ts_keys`: how many `"ts":` keys the chunk text holds (the exact-text
  // route pairs them with the timestamps; -1: not for this column)
  void settle(int64_t ts_keys) {
    if (n_strings) {  // strings only (and nulls): exact already; beside numbers, the Python builders
      if (n_numbers) throw Bail{};
      return;
    }
    if (!has_float) {
      if (!all_int_fit) throw Bail{};
      return;
    }
    if (!ints_exact_as_float) throw Bail{};
    if (all_small) {  // the Python builder's float route, whatever the text's digits below a ns
      for (size_t k = 0; k < exact.size(); ++k) {
        if (!(valid.bits[k >> 3] >> (k & 7) & 1)) continue;
        double r = std::nearbyint(us[k] * 1000.0);  // what pc.round(v * 1000.0) gives (half to even)
        if (std::fabs(r) > 9.0e18) throw Bail{};
        exact[k] = (int64_t)r;
      }
      return;
    }
    if (!all_exact) throw Bail{};
    if (ts_keys < 0 || !all_below_text_max || ts_keys != n_present) throw Bail{};
  }
};

// how many `"ts"` keys (`"ts"`, whitespace, `:`) the text holds, as timestamps._TS_TEXT finds them;
// the search goes on 4 bytes past each `"ts"` it finds. Where the module is built for AVX2, 32
// places are compared at once: JSON has a quote every few bytes, and `string_view::find`, which
// memchr's the first byte of the needle, stopped at each (2.35 ms of a 4 MB chunk's ~10.5 ms
// native pass; compared 32 at a time: 0.15 ms). Elsewhere a Horspool search (1.84 ms).
bool ts_key_at(const char *s, size_t n, size_t at) {  // `"ts"` at `at`: is a `:` next?
  size_t q = at + 4;
  while (q < n && (s[q] == ' ' || s[q] == '\t' || s[q] == '\n' || s[q] == '\r' || s[q] == '\f' || s[q] == '\v')) ++q;
  return q < n && s[q] == ':';
}

int64_t count_ts_keys(const char *s, size_t n) {
  int64_t count = 0;
  size_t at = 0;  // where the search goes on
#ifdef TS_KEYS_AVX2
  const __m256i quote = _mm256_set1_epi8('"'), tee = _mm256_set1_epi8('t'), ess = _mm256_set1_epi8('s');
  size_t base = 0;
  for (; base + 35 <= n; base += 32) {
    // bit j of `hit`: the 4 bytes from base + j are `"ts"`
    auto bytes_from = [&](size_t k) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + base + k)); };
    const __m256i hit =
        _mm256_and_si256(_mm256_and_si256(_mm256_cmpeq_epi8(bytes_from(0), quote), _mm256_cmpeq_epi8(bytes_from(1), tee)),
                         _mm256_and_si256(_mm256_cmpeq_epi8(bytes_from(2), ess), _mm256_cmpeq_epi8(bytes_from(3), quote)));
    for (uint32_t bits = uint32_t(_mm256_movemask_epi8(hit)); bits; bits &= bits - 1) {
      const size_t found = base + size_t(__builtin_ctz(bits));
      if (found < at) continue;  // inside the 4 bytes past the one before
      count += ts_key_at(s, n, found);
      at = found + 4;
    }
  }
  if (at < base) at = base;
#endif
  while (at + 4 <= n) {
    const char last = s[at + 3];
    if (last == '"' && s[at] == '"' && s[at + 1] == 't' && s[at + 2] == 's') {
      count += ts_key_at(s, n, at);
      at += 4;
    } else {
      at += last == '"' ? 3 : last == 't' ? 2 : last == 's' ? 1 : 4;  // to its last place in `"ts`
    }
  }
  return count;
}

struct GpuField {
  IntCol ints[3];  // K_INT: ints[0]; K_DIMS: x, y, z
  DblCol dbl;
};

struct Chunk {
  int64_t n = 0;
  StrCol ph, cat, name, args, bp, s, extra;
  IdOrStr pid, tid, id;
  Times ts, dur;
  IntCol correlation, external_id;
  std::vector<GpuField> gpu;
  std::vector<uint8_t> gpu_bad;  // per event: its GPU args are not of the plain shape
  bool any_bp = false, any_s = false;
  // made after reading (`pick_rows`): GPU activity rows, flow endpoint rows, the categories held
  // (and whether a null is), the launch calls' names and counts; calls_known false: not counted
  std::vector<int64_t> gpu_rows, flow_rows;
  std::vector<std::string_view> cats;
  bool null_cat = false, calls_known = false;
  std::vector<std::pair<std::string_view, int64_t>> calls;
  ondemand::document *doc = nullptr;  // the chunk being read (for positions in its text)
  // emptied for the next chunk, the buffers' memory kept: no allocation per chunk once they have
  // grown to a chunk's size (allocating and freeing them per chunk fragmented the C heap: a
  // workers=1 flatten's peak RSS grew with the trace's size)
  void clear(size_t n_fields) {
    n = 0;
    for (StrCol *c : {&ph, &cat, &name, &args, &bp, &s, &extra}) c->clear();
    for (IdOrStr *c : {&pid, &tid, &id}) c->clear();
    ts.clear();
    ts.takes_strings = true;
    dur.clear();
    correlation.clear();
    external_id.clear();
    gpu.resize(n_fields);
    for (GpuField &g : gpu) {
      for (IntCol &c : g.ints) c.clear();
      g.dbl.clear();
    }
    gpu_bad.clear();
    any_bp = any_s = false;
    gpu_rows.clear();
    flow_rows.clear();
    cats.clear();
    calls.clear();
    null_cat = calls_known = false;
  }
};

struct ArgsFound {
  bool correlation_seen = false, ext_seen = false, ext_lower_seen = false;
  bool has_corr = false, has_ext = false, has_ext_lower = false;
  int64_t corr = 0, ext = 0, ext_lower = 0;
  // GPU fields: the value of the lowest priority number seen (non-null)
  int best_priority[16];
  int64_t ints[16][3];
  double dbl[16];
  uint32_t seen_keys = 0;  // bit per GPU key index: duplicates
  bool bad = false;
};

// an int arg (`int | None`); Bail if it is of another type
bool id_arg(ondemand::value &v, int64_t &out) {
  auto t = v.type().value();
  if (t == ondemand::json_type::null) {
    if (!v.is_null().value()) throw Bail{};
    return false;
  }
  if (t != ondemand::json_type::number) throw Bail{};
  Number n = number_of(v);
  if (!n.is_int) throw Bail{};
  out = n.i;
  return true;
}

void gpu_arg(ondemand::value &v, const GpuKey &gk, ArgsFound &a, int depth) {
  int kind = g_field_kinds[gk.field];
  auto t = v.type().value();
  if (t == ondemand::json_type::null) {
    if (!v.is_null().value()) throw Bail{};
    return;
  }
  bool ok = true;
  int64_t xs[3] = {0, 0, 0};
  double d = 0;
  if (kind == K_INT) {
    if (t != ondemand::json_type::number) {
      ok = false;
      walk(v, depth);
    } else {
      auto tok = trim_right(v.raw_json_token());
      if (tok.find_first_of(".eE") != std::string_view::npos) {
        ok = false;
        walk(v, depth);
      } else {
        auto r = v.get_int64();
        if (r.error() || r.value_unsafe() == INT64_MIN_) throw Bail{};  // beyond int64: the Python builders
        xs[0] = r.value_unsafe();
      }
    }
  } else if (kind == K_DIMS) {
    if (t != ondemand::json_type::array) {
      ok = false;
      walk(v, depth);
    } else {
      int k = 0;
      for (auto e : v.get_array().value()) {
        ondemand::value ev = e.value();
        if (ok && ev.type().value() == ondemand::json_type::number) {
          auto tok = trim_right(ev.raw_json_token());
          if (tok.find_first_of(".eE") == std::string_view::npos) {
            auto r = ev.get_int64();
            if (r.error() || r.value_unsafe() == INT64_MIN_) throw Bail{};
            if (k < 3) xs[k] = r.value_unsafe();
            ++k;
            continue;
          }
        }
        ok = false;
        walk(ev, depth + 1);
      }
      if (k < 3) ok = false;
    }
  } else {
    if (t != ondemand::json_type::number) {
      ok = false;
      walk(v, depth);
    } else {
      Number n = number_of(v);
      if (n.is_int && (n.i > (int64_t(1) << 53) || n.i < -(int64_t(1) << 53))) throw Bail{};
      d = n.d;
    }
  }
  if (!ok) {
    a.bad = true;
    return;
  }
  if (gk.priority < a.best_priority[gk.field]) {
    a.best_priority[gk.field] = gk.priority;
    a.ints[gk.field][0] = xs[0];
    a.ints[gk.field][1] = xs[1];
    a.ints[gk.field][2] = xs[2];
    a.dbl[gk.field] = d;
  }
}

void read_args(ondemand::value &v, Chunk &c, int64_t i) {
  auto t = v.type().value();
  ArgsFound a;
  size_t nf = g_field_kinds.size();
  for (size_t f = 0; f < nf; ++f) a.best_priority[f] = 1 << 30;
  if (t == ondemand::json_type::null) {
    if (!v.is_null().value()) throw Bail{};
    c.args.push_null(i);
  } else if (t == ondemand::json_type::object) {
    const char *start = v.raw_json_token().data();  // at its '{'
    ondemand::object o = v.get_object().value();
    for (auto &&f : o) {  // bound, not copied: copies of simdjson's iterators through the stack stalled
      if (f.error()) throw Bail{};
      ondemand::field &field = f.value_unsafe();
      std::string_view key = field.escaped_key();
      if (key.find('\\') != std::string_view::npos) {  // compared unescaped: "\u0063orrelation" is ours
        auto u = field.unescaped_key();  // in the parser's string buffer, alive for the chunk
        if (u.error()) throw Bail{};
        key = u.value_unsafe();
      }
      ondemand::value &fv = field.value();
      if (key == "correlation") {
        if (a.correlation_seen) throw Bail{};
        a.correlation_seen = true;
        a.has_corr = id_arg(fv, a.corr);
        continue;
      }
      if (key == "External id") {
        if (a.ext_seen) throw Bail{};
        a.ext_seen = true;
        a.has_ext = id_arg(fv, a.ext);
        continue;
      }
      if (key == "external id") {
        if (a.ext_lower_seen) throw Bail{};
        a.ext_lower_seen = true;
        a.has_ext_lower = id_arg(fv, a.ext_lower);
        continue;
      }
      bool matched = false;
      for (size_t g = 0; g < g_gpu_keys.size(); ++g) {
        if (key == g_gpu_keys[g].key) {
          if (a.seen_keys >> g & 1) throw Bail{};
          a.seen_keys |= 1u << g;
          gpu_arg(fv, g_gpu_keys[g], a, 2);
          matched = true;
          break;
        }
      }
      if (!matched) walk(fv, 2);
    }
    // the object's text as written: from its '{' to the '}' before the token that follows it
    const char *next = c.doc->current_location().value();
    std::string_view raw = trim_right(std::string_view(start, size_t(next - start)));
    if (raw.empty() || raw.back() != '}') throw Bail{};
    c.args.push(raw, i);
  } else {
    throw Bail{};  // args that are not an object: the Python builders
  }
  if (a.has_corr)
    c.correlation.push(a.corr, i);
  else
    c.correlation.push_null(i);
  if (a.has_ext)
    c.external_id.push(a.ext, i);
  else if (a.has_ext_lower)
    c.external_id.push(a.ext_lower, i);
  else
    c.external_id.push_null(i);
  for (size_t f = 0; f < nf; ++f) {
    GpuField &g = c.gpu[f];
    bool has = a.best_priority[f] < (1 << 30);
    if (g_field_kinds[f] == K_FLOAT) {
      if (has)
        g.dbl.push(a.dbl[f], i);
      else
        g.dbl.push_null(i);
    } else {
      int m = g_field_kinds[f] == K_DIMS ? 3 : 1;
      for (int k = 0; k < m; ++k) {
        if (has)
          g.ints[k].push(a.ints[f][k], i);
        else
          g.ints[k].push_null(i);
      }
    }
  }
  c.gpu_bad.push_back(a.bad ? 1 : 0);
}

void args_absent(Chunk &c, int64_t i) {
  c.args.push_null(i);
  c.correlation.push_null(i);
  c.external_id.push_null(i);
  for (size_t f = 0; f < g_field_kinds.size(); ++f) {
    GpuField &g = c.gpu[f];
    if (g_field_kinds[f] == K_FLOAT) {
      g.dbl.push_null(i);
    } else {
      int m = g_field_kinds[f] == K_DIMS ? 3 : 1;
      for (int k = 0; k < m; ++k) g.ints[k].push_null(i);
    }
  }
  c.gpu_bad.push_back(0);
}

// a raw extra value (bp, s): its JSON text as written
std::string_view raw_value(ondemand::value &v) {
  auto t = v.type().value();
  if (t == ondemand::json_type::object || t == ondemand::json_type::array) {
    // validated, then its text: walk a copy is not possible forward-only; such values are rare
    throw Bail{};
  }
  std::string_view tok = trim_right(v.raw_json_token());
  walk(v, 2);
  return tok;
}

void read_event(ondemand::object o, Chunk &c, int64_t i) {
  bool seen[E_N] = {false};
  for (auto &&f : o) {  // bound, not copied: copies of simdjson's iterators through the stack stalled
    if (f.error()) throw Bail{};
    ondemand::field &field = f.value_unsafe();
    std::string_view key = field.escaped_key();
    int k = event_key(key);
    if (k < 0 || seen[k]) throw Bail{};  // another key (or an escaped one), or a key twice
    seen[k] = true;
    ondemand::value &v = field.value();
    switch (k) {
      case E_PH:
      case E_CAT:
      case E_NAME: {
        StrCol &col = k == E_PH ? c.ph : k == E_CAT ? c.cat : c.name;
        auto t = v.type().value();
        if (t == ondemand::json_type::string)
          col.push(string_of(v), i);
        else if (t == ondemand::json_type::null && v.is_null().value())
          col.push_null(i);
        else
          throw Bail{};
        break;
      }
      case E_PID:
        c.pid.push(v, i);
        break;
      case E_TID:
        c.tid.push(v, i);
        break;
      case E_ID:
        c.id.push(v, i);
        break;
      case E_TS:
        c.ts.push(v, i);
        break;
      case E_DUR:
        c.dur.push(v, i);
        break;
      case E_ARGS:
        read_args(v, c, i);
        break;
      case E_BP:
        c.bp.push(raw_value(v), i);
        c.any_bp = true;
        break;
      case E_S:
        c.s.push(raw_value(v), i);
        c.any_s = true;
        break;
    }
  }
  if (!seen[E_PH]) c.ph.push_null(i);
  if (!seen[E_CAT]) c.cat.push_null(i);
  if (!seen[E_NAME]) c.name.push_null(i);
  if (!seen[E_PID]) c.pid.push_null(i);
  if (!seen[E_TID]) c.tid.push_null(i);
  if (!seen[E_ID]) c.id.push_null(i);
  if (!seen[E_TS]) c.ts.push_null(i);
  if (!seen[E_DUR]) c.dur.push_null(i);
  if (!seen[E_ARGS]) args_absent(c, i);
  if (!seen[E_BP]) c.bp.push("", i);  // absent: empty text, as msgspec.Raw(b"")
  if (!seen[E_S]) c.s.push("", i);
}

// ------------------------------------------------------------------ rows of the chunk's tables
bool valid_at(const Validity &v, int64_t i) { return !v.nulls || ((v.bits[size_t(i >> 3)] >> (i & 7)) & 1); }

bool one_of(std::string_view x, const std::vector<std::string> &set) {
  for (const auto &y : set)
    if (x == y) return true;
  return false;
}

// the rows tables.py's gpu_and_flow_rows picks (GPU activity but the device tasks without a cat,
// which it adds; flow endpoints), the categories the chunk holds, and the names of its launch
// calls with their counts (launches.py's launch_counts, before its name patterns): ph X, a
// category that is one of LAUNCH_CATS in lower case. A category of a byte above ASCII leaves
// the calls uncounted (Python's lower() of it is not ASCII's): Python counts them then.
void pick_rows(Chunk &c) {
  if (!g_rows.set) return;
  const RowRules &r = g_rows;
  c.calls_known = true;
  std::vector<std::pair<std::string_view, bool>> cat_launch;  // each category seen: is it a launch category
  for (int64_t i = 0; i < c.n; ++i) {
    bool has_ph = valid_at(c.ph.valid, i), has_cat = valid_at(c.cat.valid, i);
    std::string_view ph = has_ph ? c.ph.at(i) : std::string_view();
    if (has_ph && one_of(ph, r.flow_phases)) c.flow_rows.push_back(i);
    if (!has_cat) {
      c.null_cat = true;
      continue;
    }
    std::string_view cat = c.cat.at(i);
    const std::pair<std::string_view, bool> *known = nullptr;
    for (const auto &k : cat_launch)
      if (k.first == cat) known = &k;
    if (!known) {
      std::string lower(cat);
      for (char &ch : lower) {
        if ((unsigned char)ch >= 0x80) c.calls_known = false;
        if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
      }
      cat_launch.emplace_back(cat, one_of(lower, r.launch_cats));
      c.cats.push_back(cat);
      known = &cat_launch.back();
    }
    if (!has_ph || ph != "X") continue;
    if (known->second && valid_at(c.name.valid, i)) {
      std::string_view name = c.name.at(i);
      bool counted = false;
      for (auto &call : c.calls)
        if (call.first == name) {
          ++call.second;
          counted = true;
          break;
        }
      if (!counted) c.calls.emplace_back(name, 1);
    }
    if (!one_of(cat, r.gpu_cats)) continue;
    bool elsewhere = false;  // a category the host uses too, not on a device's process (or no pid)
    for (const auto &d : r.on_device)
      if (cat == d.first) elsewhere = !valid_at(c.pid.ints.valid, i) || c.pid.ints.v[size_t(i)] >= d.second;
    if (!elsewhere) c.gpu_rows.push_back(i);
  }
}

// ------------------------------------------------------------------ to Python
// a read-only view of the module's own buffer, valid until this thread's next build(): the caller
// copies what it keeps into Arrow's memory pool (long-lived C-heap blocks fragmented the heap)
char g_empty[8];
PyObject *bytes_of(const void *p, size_t n) {
  return PyMemoryView_FromMemory(n ? (char *)p : g_empty, (Py_ssize_t)n, PyBUF_READ);
}

PyObject *validity_of(const Validity &v) {
  if (!v.nulls) Py_RETURN_NONE;
  return bytes_of(v.bits.data(), v.bits.size());
}

PyObject *str_col(const StrCol &c) {
  return Py_BuildValue("(NNNL)", bytes_of(c.offsets.data(), c.offsets.size() * 4), bytes_of(c.data.data(), c.data.size()),
                       validity_of(c.valid), (long long)c.valid.nulls);
}

PyObject *int_col(const std::vector<int64_t> &v, const Validity &valid) {
  return Py_BuildValue("(NNL)", bytes_of(v.data(), v.size() * 8), validity_of(valid), (long long)valid.nulls);
}

PyObject *dbl_col(const DblCol &c) {
  return Py_BuildValue("(NNL)", bytes_of(c.v.data(), c.v.size() * 8), validity_of(c.valid), (long long)c.valid.nulls);
}

int set(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int r = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return r;
}


// ------------------------------------------------------------------ extra_json
// a value every JSON writer writes the same way (by_struct._PLAIN_JSON_VALUE): null, or a string
// without a quote, a backslash or a control character
bool plain_json_value(std::string_view v) {
  if (v == "null") return true;
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return false;
  for (size_t k = 1; k + 1 < v.size(); ++k) {
    const unsigned char ch = (unsigned char)v[k];
    if (ch == '"' || ch == '\\' || ch < 0x20) return false;
  }
  return true;
}

// each event's extra_json from its `bp` or `s` (`{"bp":"e"}`), as by_struct.extra_json_of_struct_keys
// makes it; Bail (the Python builders decide) where an event has both (their order in the event is
// not kept) or a value is not plain
void settle_extra(Chunk &c) {
  if (!c.any_bp && !c.any_s) return;
  for (int64_t i = 0; i < c.n; ++i) {
    const std::string_view bp = c.any_bp ? c.bp.at(i) : std::string_view(), s = c.any_s ? c.s.at(i) : std::string_view();
    if (!bp.empty() && !s.empty()) throw Bail{};
    const std::string_view v = bp.empty() ? s : bp;
    if (v.empty()) {
      c.extra.push_null(i);
      continue;
    }
    if (!plain_json_value(v)) throw Bail{};
    c.extra.data.append(bp.empty() ? "{\"s\":" : "{\"bp\":");
    c.extra.data.append(v);
    c.extra.push("}", i);  // the row ends with its last piece: push appends it and sets the offset
  }
}

PyObject *build(PyObject *, PyObject *arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return nullptr;
  const char *text = (const char *)view.buf;
  size_t len = (size_t)view.len;
  // one per thread, reached through a pointer: with `thread_local Chunk c` passed down, GCC
  // propagated the TLS address into read_event and read_args and looked it up on every access
  thread_local std::unique_ptr<Chunk> own;  // freed when its thread ends
  if (!own) own = std::make_unique<Chunk>();
  Chunk &c = *own;
  c.clear(g_field_kinds.size());
  bool ok = false;
  int64_t ts_keys = -1;
  Py_BEGIN_ALLOW_THREADS;
  try {
    // the chunk in brackets, in a buffer kept for the next chunk (no allocation per chunk)
    thread_local std::vector<char> buffer;
    if (buffer.size() < len + 2 + SIMDJSON_PADDING) buffer.resize(len + 2 + SIMDJSON_PADDING + (len >> 3));
    char *p = buffer.data();
    p[0] = '[';
    memcpy(p + 1, text, len);
    p[len + 1] = ']';
    padded_string_view json(p, len + 2, buffer.size());
    if (!t_parser) t_parser = new ondemand::parser();
    ondemand::document doc = t_parser->iterate(json);
    c.doc = &doc;
    ondemand::array events = doc.get_array();
    int64_t i = 0;
    for (auto e : events) {
      ondemand::value v = e.value();
      if (v.type().value() != ondemand::json_type::object) throw Bail{};
      read_event(v.get_object().value(), c, i);
      ++i;
    }
    if (!doc.at_end()) throw Bail{};
    c.n = i;
    if (c.n == 0) throw Bail{};
    if (c.ts.has_float && !c.ts.all_small) ts_keys = count_ts_keys(text, len);
    c.ts.settle(ts_keys);
    c.dur.settle(-1);
    settle_extra(c);
    pick_rows(c);
    ok = true;
  } catch (Bail &) {
  } catch (simdjson_error &) {
  } catch (std::bad_alloc &) {
  }
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&view);
  if (!ok) Py_RETURN_NONE;

  PyObject *d = PyDict_New();
  if (!d) return nullptr;
  auto ns_col = [](const Times &t) {
    // ints (no float in the chunk): v * 1000; otherwise the exact decimal, checked in settle
    return int_col(t.exact, t.valid);
  };
  bool fail = set(d, "n", PyLong_FromLongLong(c.n)) || set(d, "ph", str_col(c.ph)) || set(d, "cat", str_col(c.cat)) ||
              set(d, "name", str_col(c.name)) || set(d, "pid", int_col(c.pid.ints.v, c.pid.ints.valid)) ||
              set(d, "pid_str", str_col(c.pid.strs)) || set(d, "tid", int_col(c.tid.ints.v, c.tid.ints.valid)) ||
              set(d, "tid_str", str_col(c.tid.strs)) || set(d, "id", int_col(c.id.ints.v, c.id.ints.valid)) ||
              set(d, "id_str", str_col(c.id.strs)) || set(d, "ts_ns", ns_col(c.ts)) || set(d, "dur_ns", ns_col(c.dur)) ||
              set(d, "correlation", int_col(c.correlation.v, c.correlation.valid)) ||
              set(d, "external_id", int_col(c.external_id.v, c.external_id.valid)) ||
              set(d, "args_json", str_col(c.args)) || set(d, "gpu_bad", bytes_of(c.gpu_bad.data(), c.gpu_bad.size())) ||
              set(d, "ts_strings", PyLong_FromLongLong(c.ts.n_strings));
  if (!fail && c.any_bp) fail = set(d, "bp", str_col(c.bp));
  if (!fail && c.any_s) fail = set(d, "s", str_col(c.s));
  if (!fail && (c.any_bp || c.any_s)) fail = set(d, "extra_json", str_col(c.extra));
  if (!fail && g_rows.set) {
    fail = set(d, "gpu_rows", bytes_of(c.gpu_rows.data(), c.gpu_rows.size() * 8)) ||
           set(d, "flow_rows", bytes_of(c.flow_rows.data(), c.flow_rows.size() * 8));
    PyObject *cats = fail ? nullptr : PyList_New(0);
    fail = fail || !cats;
    for (size_t k = 0; !fail && k < c.cats.size(); ++k) {
      PyObject *t = PyUnicode_DecodeUTF8(c.cats[k].data(), (Py_ssize_t)c.cats[k].size(), "surrogatepass");
      fail = !t || PyList_Append(cats, t) != 0;
      Py_XDECREF(t);
    }
    if (!fail && c.null_cat) fail = PyList_Append(cats, Py_None) != 0;
    if (cats) fail = set(d, "cats", cats) || fail;
    if (!fail && c.calls_known) {
      PyObject *calls = PyDict_New();
      fail = !calls;
      for (size_t k = 0; !fail && k < c.calls.size(); ++k) {
        PyObject *name = PyUnicode_DecodeUTF8(c.calls[k].first.data(), (Py_ssize_t)c.calls[k].first.size(), "surrogatepass");
        PyObject *n = PyLong_FromLongLong(c.calls[k].second);
        fail = !name || !n || PyDict_SetItem(calls, name, n) != 0;
        Py_XDECREF(name);
        Py_XDECREF(n);
      }
      if (calls) fail = set(d, "calls", calls) || fail;
    }
  }
  if (!fail) {
    PyObject *gpu = PyList_New((Py_ssize_t)g_field_kinds.size());
    if (!gpu) fail = true;
    for (size_t f = 0; !fail && f < g_field_kinds.size(); ++f) {
      PyObject *item;
      const GpuField &g = c.gpu[f];
      if (g_field_kinds[f] == K_FLOAT)
        item = dbl_col(g.dbl);
      else if (g_field_kinds[f] == K_DIMS)
        item = Py_BuildValue("(NNN)", int_col(g.ints[0].v, g.ints[0].valid), int_col(g.ints[1].v, g.ints[1].valid),
                             int_col(g.ints[2].v, g.ints[2].valid));
      else
        item = int_col(g.ints[0].v, g.ints[0].valid);
      if (!item) {
        fail = true;
        break;
      }
      PyList_SET_ITEM(gpu, (Py_ssize_t)f, item);
    }
    if (!fail) fail = set(d, "gpu", gpu);
  }
  if (fail) {
    Py_DECREF(d);
    return nullptr;
  }
  // the times' own ints when the chunk has no float: multiply done in settle's exact (ints * 1000)
  return d;
}

// configure(kinds: list[int], keys: list[tuple[str, int, int]]): the GPU arg fields' kinds, and
// every key read for one: (key, field index, priority)
PyObject *configure(PyObject *, PyObject *args) {
  PyObject *kinds, *keys;
  if (!PyArg_ParseTuple(args, "OO", &kinds, &keys)) return nullptr;
  std::vector<int> k2;
  std::vector<GpuKey> g2;
  Py_ssize_t nk = PySequence_Size(kinds);
  if (nk < 0 || nk > 16) {
    PyErr_SetString(PyExc_ValueError, "at most 16 GPU arg fields");
    return nullptr;
  }
  for (Py_ssize_t j = 0; j < nk; ++j) {
    PyObject *o = PySequence_GetItem(kinds, j);
    long v = o ? PyLong_AsLong(o) : -1;
    Py_XDECREF(o);
    if (v < 0 || v > 2) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a kind is 0, 1 or 2");
      return nullptr;
    }
    k2.push_back((int)v);
  }
  Py_ssize_t n = PySequence_Size(keys);
  if (n < 0 || n > 32) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "at most 32 GPU arg keys");
    return nullptr;
  }
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject *o = PySequence_GetItem(keys, j);
    if (!o) return nullptr;
    const char *key;
    Py_ssize_t klen;
    int field, priority;
    int r = PyArg_ParseTuple(o, "s#ii", &key, &klen, &field, &priority);
    Py_DECREF(o);
    if (!r) return nullptr;
    if (field < 0 || field >= (int)nk) {
      PyErr_SetString(PyExc_ValueError, "field index out of range");
      return nullptr;
    }
    g2.push_back(GpuKey{std::string(key, (size_t)klen), field, priority});
  }
  g_field_kinds = k2;
  g_gpu_keys = g2;
  Py_RETURN_NONE;
}

// configure_rows(gpu_cats: list[str], on_device: list[tuple[str, int]], flow_phases: list[str],
// launch_cats: list[str]): what picks a chunk's rows (`pick_rows`); build() then returns them
PyObject *configure_rows(PyObject *, PyObject *args) {
  PyObject *gpu, *dev, *flows, *launch;
  if (!PyArg_ParseTuple(args, "OOOO", &gpu, &dev, &flows, &launch)) return nullptr;
  RowRules r;
  auto strings = [](PyObject *seq, std::vector<std::string> &out) -> bool {
    PyObject *it = PyObject_GetIter(seq);
    if (!it) return false;
    while (PyObject *x = PyIter_Next(it)) {
      Py_ssize_t len;
      const char *p = PyUnicode_AsUTF8AndSize(x, &len);
      if (p) out.emplace_back(p, (size_t)len);
      Py_DECREF(x);
      if (!p) {
        Py_DECREF(it);
        return false;
      }
    }
    Py_DECREF(it);
    return !PyErr_Occurred();
  };
  if (!strings(gpu, r.gpu_cats) || !strings(flows, r.flow_phases) || !strings(launch, r.launch_cats)) return nullptr;
  PyObject *it = PyObject_GetIter(dev);
  if (!it) return nullptr;
  while (PyObject *x = PyIter_Next(it)) {
    const char *cat;
    Py_ssize_t len;
    long long below;
    int got = PyArg_ParseTuple(x, "s#L", &cat, &len, &below);
    Py_DECREF(x);
    if (!got) {
      Py_DECREF(it);
      return nullptr;
    }
    r.on_device.emplace_back(std::string(cat, (size_t)len), (int64_t)below);
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) return nullptr;
  r.set = true;
  g_rows = r;
  Py_RETURN_NONE;
}

}  // namespace

PyObject *nesting_around(PyObject *, PyObject *args);  // nesting.cpp
PyObject *nesting_nest(PyObject *, PyObject *args);    // nesting.cpp
PyObject *nesting_around_keyed(PyObject *, PyObject *args);  // nesting.cpp
PyObject *shape_keys(PyObject *, PyObject *args);      // shape_keys.cpp

namespace {

PyMethodDef methods[] = {
    {"build", build, METH_O,
     "build(text) -> dict of column buffers (memoryviews valid until the next build) for one chunk of traceEvents "
     "text, or None (the Python builders)"},
    {"configure", configure, METH_VARARGS, "configure(kinds, keys): the GPU arg fields read from args"},
    {"configure_rows", configure_rows, METH_VARARGS,
     "configure_rows(gpu_cats, on_device, flow_phases, launch_cats): build() then also returns the chunk's GPU "
     "and flow rows, its categories and its launch calls' counts by name"},
    {"around", nesting_around, METH_VARARGS,
     "around(iv_g, iv_ts, iv_end, iv_idx, pt_g, pt_t, pt_outer, order, out): the interval around each point "
     "(nesting.cpp)"},
    {"around_keyed", nesting_around_keyed, METH_VARARGS,
     "around_keyed(iv_a, iv_b, iv_c, iv_ts, iv_end, iv_idx, pt_a, pt_b, pt_c, pt_known, pt_t, pt_outer, order, out): "
     "`around` with threads named by three keys (nesting.cpp)"},
    {"nest", nesting_nest, METH_VARARGS,
     "nest(iv_g, iv_ts, iv_end, iv_idx, order, rows, depth, parent): each interval's depth and parent, in start "
     "order (nesting.cpp)"},
    {"shape_keys", shape_keys, METH_VARARGS,
     "shape_keys(offsets, data, first, n, keys) -> (offsets, data): the key ops of one signature share, of "
     "each args text (shape_keys.cpp)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "tracepipe_native",
                      "simdjson On-Demand chunk builder for tracepipe (optional)", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_tracepipe_native(void) {
#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
  // built for the building machine's CPU (AVX2): refuse to load on one without it
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("bmi2") || !__builtin_cpu_supports("pclmul")) {
    PyErr_SetString(PyExc_ImportError, "tracepipe_native was built for a CPU with AVX2");
    return nullptr;
  }
#endif
  return PyModule_Create(&module);
}
