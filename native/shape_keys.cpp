// shape_keys: the key that ops of one signature share, from their args' JSON text, as
// `pipeline/cost/enrich.py`'s `_shape` makes it with two regex replacements, in one pass.
//
// shape_keys(offsets, data, first, n, keys) -> (offsets, data):
//   `n` strings of an Arrow large-string array from its `first` (offsets: int64, n + 1 of them
//   from `first`; data: the bytes they point into); `keys`: the signature keys (str). Returns the
//   keys' int64 offsets (from 0) and bytes; a null string's entry is empty (its validity is the
//   caller's).
//
// The rule, as the regexes state it (_SCALAR_SIGNATURE, then _SCALAR_MEMBER): at each quote, a
// member `"name":` (name: no quote, no backslash), whitespace, then a JSON scalar (number, true,
// false, null) ending at a word boundary. Where the name is a signature key, the member is written
// `"name"=scalar`; any other such member is removed; everything else is kept as it is. A number
// is tried as the regex tries it: with its fraction and exponent, then shorter, the first that
// ends at a word boundary.
//
// Where the keys differ from the regexes', the compiled one keeps more, so it is finer, never
// coarser (ops of different signatures still never share one):
// - whitespace is ASCII's, and a byte of a multi-byte character counts as a word character (the
//   regexes read Unicode): this differs only on text no JSON writer makes (a non-ASCII space
//   right after a scalar, or inside a string that begins with `:`);
// - the regexes' second pass may start at the quote that closes a member the first rewrote
//   (`"Group size"=8}, ": 5"`: a string beginning with `:` after it, with no quote between),
//   which one pass never revisits.
// tests/test_link.py checks the two against each other on random and on every shared trace's args.
//
// MIT licence, as tracepipe.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

bool is_word(const char *p, const char *end) {  // \b's side: past the text is not a word
  if (p >= end) return false;
  unsigned char c = (unsigned char)*p;
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

const char *digits(const char *p, const char *end) {
  while (p < end && *p >= '0' && *p <= '9') ++p;
  return p;
}

// the end of the scalar at `p` followed by a word boundary, or nullptr
const char *scalar_end(const char *p, const char *end) {
  const char *q = p;
  if (q < end && *q == '-') ++q;
  if (q < end && *q >= '0' && *q <= '9') {
    const char *whole = *q == '0' ? q + 1 : digits(q + 1, end);  // 0 | [1-9][0-9]*
    const char *frac = nullptr, *exp = nullptr;
    if (whole + 1 < end && *whole == '.' && whole[1] >= '0' && whole[1] <= '9') frac = digits(whole + 1, end);
    auto exponent = [&](const char *at) -> const char * {  // [eE][+-]?[0-9]+
      if (at >= end || (*at != 'e' && *at != 'E')) return nullptr;
      const char *e = at + 1;
      if (e < end && (*e == '+' || *e == '-')) ++e;
      return e < end && *e >= '0' && *e <= '9' ? digits(e, end) : nullptr;
    };
    // in the regex's order: the fraction, with and without an exponent; then none, the same
    const char *tries[4] = {frac ? exponent(frac) : nullptr, frac, exponent(whole), whole};
    for (const char *t : tries)
      if (t && !is_word(t, end)) return t;  // each try ends in a digit: a word character
    return nullptr;  // a number that ends at no word boundary is no scalar, nor are the words then
  }
  for (const char *word : {"true", "false", "null"}) {
    size_t len = std::strlen(word);
    if ((size_t)(end - p) >= len && std::memcmp(p, word, len) == 0 && !is_word(p + len, end)) return p + len;
  }
  return nullptr;
}

void shape_of(const char *p, const char *end, const std::vector<std::string_view> &keys, std::string &out) {
  while (p < end) {
    const char *quote = (const char *)std::memchr(p, '"', (size_t)(end - p));
    if (!quote) break;
    out.append(p, (size_t)(quote - p));
    const char *name = quote + 1, *close = name;
    while (close < end && *close != '"' && *close != '\\') ++close;
    const char *value = close + 2;
    if (close < end && *close == '"' && close + 1 < end && close[1] == ':') {
      while (value < end && is_space(*value)) ++value;
      if (const char *done = scalar_end(value, end)) {
        std::string_view key(name, (size_t)(close - name));
        for (const auto &k : keys) {
          if (k == key) {
            out.append(quote, (size_t)(close + 1 - quote)).push_back('=');
            out.append(value, (size_t)(done - value));
            break;
          }
        }
        p = done;
        continue;
      }
    }
    out.push_back('"');
    p = quote + 1;
  }
  if (p < end) out.append(p, (size_t)(end - p));
}

struct Held {
  Py_buffer buf{};
  bool held = false;
  ~Held() {
    if (held) PyBuffer_Release(&buf);
  }
};

}  // namespace

PyObject *shape_keys(PyObject *, PyObject *args) {
  PyObject *offsets_o, *data_o, *keys_o;
  Py_ssize_t first, n;
  if (!PyArg_ParseTuple(args, "OOnnO", &offsets_o, &data_o, &first, &n, &keys_o)) return nullptr;
  Held offsets, data;
  if (PyObject_GetBuffer(offsets_o, &offsets.buf, PyBUF_C_CONTIGUOUS) != 0) return nullptr;
  offsets.held = true;
  if (PyObject_GetBuffer(data_o, &data.buf, PyBUF_C_CONTIGUOUS) != 0) return nullptr;
  data.held = true;
  if (first < 0 || n < 0 || offsets.buf.len % 8 != 0 || offsets.buf.len / 8 < first + n + 1) {
    PyErr_SetString(PyExc_ValueError, "shape_keys: offsets shorter than the strings");
    return nullptr;
  }
  PyObject *seq = PySequence_Fast(keys_o, "shape_keys: keys must be a sequence of str");
  if (!seq) return nullptr;
  std::vector<std::string_view> keys;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    Py_ssize_t len;
    const char *k = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &len);
    if (!k) {
      Py_DECREF(seq);
      return nullptr;
    }
    keys.emplace_back(k, (size_t)len);  // the str objects stay alive in `keys_o`
  }
  const int64_t *off = (const int64_t *)offsets.buf.buf + first;
  const char *text = (const char *)data.buf.buf;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > data.buf.len) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "shape_keys: offsets out of the data");
      return nullptr;
    }
  }
  std::vector<int64_t> out_offsets((size_t)n + 1, 0);
  std::string out;
  out.reserve((size_t)(off[n] - off[0]));
  Py_BEGIN_ALLOW_THREADS;
  for (Py_ssize_t i = 0; i < n; ++i) {
    shape_of(text + off[i], text + off[i + 1], keys, out);
    out_offsets[(size_t)i + 1] = (int64_t)out.size();
  }
  Py_END_ALLOW_THREADS;
  Py_DECREF(seq);
  PyObject *o = PyBytes_FromStringAndSize((const char *)out_offsets.data(), (Py_ssize_t)(out_offsets.size() * 8));
  PyObject *d = o ? PyBytes_FromStringAndSize(out.data(), (Py_ssize_t)out.size()) : nullptr;
  if (!d) {
    Py_XDECREF(o);
    return nullptr;
  }
  return Py_BuildValue("(NN)", o, d);
}
