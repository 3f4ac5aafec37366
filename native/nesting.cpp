// nesting: which interval on a thread encloses each point in time, by one sweep per thread
// (`pipeline/link/nesting.py`'s rule, which it answers with sorts and binary searches in polars).
//
// around(iv_g, iv_ts, iv_end, iv_idx, pt_g, pt_t, pt_outer, order, out):
//   intervals (thread number g >= 0, start, end, idx; no nulls), points (thread number, or -1 for
//   a point on no thread of the intervals; time; 1 where the outermost interval is wanted, else
//   the innermost); order 0: intervals starting at one instant nest by idx (file order), 1: longer
//   first, then by idx. Writes, for each point, the row of the interval that encloses it, or -1.
//
// around_keyed(iv_a, iv_b, iv_c, iv_ts, iv_end, iv_idx, pt_a, pt_b, pt_c, pt_known, pt_t, pt_outer, order, out):
//   `around` with each thread named by three int64 keys (a, b, c) rather than a number: linking's
//   (pid, tid, nest), numbered here (a small hash table) instead of by polars' ranks and joins;
//   points with pt_known 0 are on no thread.
//
// nest(iv_g, iv_ts, iv_end, iv_idx, order, rows, depth, parent):
//   the same intervals and orders; writes, for the k-th interval in start order (by thread, then
//   start, then the order), its row, its depth and the row of its parent (the last start at
//   depth - 1 before it), or -1.
//
// The rule, as nesting.py states it: the depth at t is the number of starts at or before t minus
// the number of effective ends at or before t (the end, or end + 1 for a zero-length interval);
// an interval's depth is that of its start, counting itself and the starts before it in start
// order; the innermost interval around a point at depth d is the last one at depth d to start
// before it (the outermost: at depth 1), if it has not ended before t.
//
// MIT licence, as tracepipe.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

struct View {
  Py_buffer buf{};
  bool held = false;
  ~View() {
    if (held) PyBuffer_Release(&buf);
  }
};

// a C-contiguous buffer of `n` items of `itemsize` bytes (n < 0: any length; it is then set)
bool get(PyObject *o, View &v, Py_ssize_t itemsize, Py_ssize_t &n, bool writable) {
  if (PyObject_GetBuffer(o, &v.buf, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) return false;
  v.held = true;
  if (v.buf.len % itemsize != 0 || (n >= 0 && v.buf.len / itemsize != n)) {
    PyErr_SetString(PyExc_ValueError, "around: arrays of unequal lengths or item sizes");
    return false;
  }
  n = v.buf.len / itemsize;
  return true;
}

// the rows of the intervals in start order: by thread, start, then (order 1: longer first) end
// descending, then idx
std::vector<int64_t> start_order(Py_ssize_t n, const int64_t *g, const int64_t *ts, const int64_t *end,
                                 const int64_t *idx, int order) {
  std::vector<int64_t> iv(n);
  for (Py_ssize_t i = 0; i < n; ++i) iv[i] = i;
  std::stable_sort(iv.begin(), iv.end(), [&](int64_t a, int64_t b) {
    if (g[a] != g[b]) return g[a] < g[b];
    if (ts[a] != ts[b]) return ts[a] < ts[b];
    if (order == 1 && end[a] != end[b]) return end[a] > end[b];
    return idx[a] < idx[b];
  });
  return iv;
}

// one thread's intervals, positions [a, b) of the start order: their effective ends sorted into
// `ends`, and each one's depth (the starts so far, itself included, minus the ends at or before
// its start) into depth[a..b)
void depths(const std::vector<int64_t> &iv, Py_ssize_t a, Py_ssize_t b, const int64_t *ts, const int64_t *end,
            std::vector<int64_t> &ends, int64_t *depth) {
  ends.clear();
  for (Py_ssize_t k = a; k < b; ++k) {
    const int64_t i = iv[k];
    ends.push_back(end[i] == ts[i] ? end[i] + 1 : end[i]);
  }
  std::sort(ends.begin(), ends.end());
  size_t e = 0;
  for (Py_ssize_t k = a; k < b; ++k) {
    while (e < ends.size() && ends[e] <= ts[iv[k]]) ++e;
    depth[k] = (k - a + 1) - (int64_t)e;
  }
}

// the sweep of `around`: intervals `iv` in start order (by thread number `g`), points `pts` by
// thread number `pg` (>= 0) and time; writes out[j] for each point an interval encloses
void sweep(const std::vector<int64_t> &iv, const int64_t *g, const int64_t *ts, const int64_t *end,
           const std::vector<int64_t> &pts, const int64_t *pg, const int64_t *pt, const uint8_t *outer, int64_t *out) {
  const Py_ssize_t n = (Py_ssize_t)iv.size();
  std::vector<int64_t> ends, depth(n), last;
  size_t p = 0, e;
  for (Py_ssize_t a = 0; a < n;) {  // one thread: positions [a, b) of the start order
    Py_ssize_t b = a;
    const int64_t thread = g[iv[a]];
    while (b < n && g[iv[b]] == thread) ++b;
    while (p < pts.size() && pg[pts[p]] < thread) ++p;  // points on threads without intervals: -1
    if (p == pts.size() || pg[pts[p]] != thread) {
      a = b;
      continue;
    }
    depths(iv, a, b, ts, end, ends, depth.data());
    last.assign(b - a + 2, -1);  // depth -> position of the last start at that depth so far
    Py_ssize_t s = a;
    e = 0;
    for (; p < pts.size() && pg[pts[p]] == thread; ++p) {
      const int64_t j = pts[p], t = pt[j];
      for (; s < b && ts[iv[s]] <= t; ++s)
        if (depth[s] >= 1) last[depth[s]] = s;
      while (e < ends.size() && ends[e] <= t) ++e;
      const int64_t d = (s - a) - (int64_t)e;
      if (d <= 0) continue;
      const int64_t at = last[outer[j] ? 1 : d];
      if (at >= 0 && end[iv[at]] >= t) out[j] = iv[at];
    }
    a = b;
  }
}

// the items make(i) of rows i < n with a group g[i] >= 0 (of `groups`), by group (in the rows'
// order: a counting sort), then each group's sorted by the items' < unless in order already
template <class T, class Make>
void grouped(Py_ssize_t n, const int64_t *g, int64_t groups, std::vector<T> &out, Make make) {
  std::vector<int64_t> at(groups + 1, 0);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (g[i] >= 0) ++at[g[i] + 1];
  for (int64_t k = 0; k < groups; ++k) at[k + 1] += at[k];
  out.resize(at[groups]);
  std::vector<int64_t> next(at.begin(), at.end() - 1);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (g[i] >= 0) out[next[g[i]]++] = make(i);
  for (int64_t k = 0; k < groups; ++k) {
    auto a = out.begin() + at[k], b = out.begin() + at[k + 1];
    if (!std::is_sorted(a, b)) std::sort(a, b);
  }
}

// three int64 keys of a row, compared in order
struct Keys3 {
  const int64_t *a, *b, *c;
  int cmp(const Keys3 &o, int64_t i, int64_t j) const {  // this one's row i against o's row j
    if (a[i] != o.a[j]) return a[i] < o.a[j] ? -1 : 1;
    if (b[i] != o.b[j]) return b[i] < o.b[j] ? -1 : 1;
    if (c[i] != o.c[j]) return c[i] < o.c[j] ? -1 : 1;
    return 0;
  }
};

// (a, b, c) -> a number, the first met numbered 0: linear probing in a power-of-two table that
// grows at half full (a cell's threads: a few hundred at most)
class ThreadTable {
  struct Slot {
    int64_t a, b, c, number;  // number -1: empty
  };
  std::vector<Slot> slots_ = std::vector<Slot>(64, Slot{0, 0, 0, -1});
  int64_t size_ = 0;
  static uint64_t hash(int64_t a, int64_t b, int64_t c) {
    uint64_t h = uint64_t(a) * 0x9E3779B97F4A7C15ull;
    h ^= uint64_t(b) + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
    h ^= uint64_t(c) + 0x94D049BB133111EBull + (h << 6) + (h >> 2);
    return h ^ (h >> 31);
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{0, 0, 0, -1});
    for (const Slot &s : old)
      if (s.number >= 0) slot(s.a, s.b, s.c) = s;
  }
  Slot &slot(int64_t a, int64_t b, int64_t c) {
    const size_t mask = slots_.size() - 1;
    for (size_t k = hash(a, b, c) & mask;; k = (k + 1) & mask) {
      Slot &s = slots_[k];
      if (s.number < 0 || (s.a == a && s.b == b && s.c == c)) return s;
    }
  }

 public:
  int64_t size() const { return size_; }
  // the number of (a, b, c); a new one numbered when `add`, else -1
  int64_t number(int64_t a, int64_t b, int64_t c, bool add) {
    Slot &s = slot(a, b, c);
    if (s.number >= 0 || !add) return s.number;
    s = Slot{a, b, c, size_++};
    if (size_t(size_) * 2 > slots_.size()) grow();
    return size_ - 1;
  }
};

}  // namespace

PyObject *nesting_around(PyObject *, PyObject *args) {
  PyObject *og, *ots, *oend, *oidx, *opg, *opt, *oouter, *oout;
  int order;
  if (!PyArg_ParseTuple(args, "OOOOOOOiO", &og, &ots, &oend, &oidx, &opg, &opt, &oouter, &order, &oout)) return nullptr;
  View vg, vts, vend, vidx, vpg, vpt, vouter, vout;
  Py_ssize_t n = -1, m = -1;
  if (!get(og, vg, 8, n, false) || !get(ots, vts, 8, n, false) || !get(oend, vend, 8, n, false) ||
      !get(oidx, vidx, 8, n, false) || !get(opg, vpg, 8, m, false) || !get(opt, vpt, 8, m, false) ||
      !get(oouter, vouter, 1, m, false) || !get(oout, vout, 8, m, true))
    return nullptr;
  const int64_t *g = static_cast<const int64_t *>(vg.buf.buf), *ts = static_cast<const int64_t *>(vts.buf.buf),
                *end = static_cast<const int64_t *>(vend.buf.buf), *idx = static_cast<const int64_t *>(vidx.buf.buf),
                *pg = static_cast<const int64_t *>(vpg.buf.buf), *pt = static_cast<const int64_t *>(vpt.buf.buf);
  const uint8_t *outer = static_cast<const uint8_t *>(vouter.buf.buf);
  int64_t *out = static_cast<int64_t *>(vout.buf.buf);

  Py_BEGIN_ALLOW_THREADS;
  std::vector<int64_t> iv = start_order(n, g, ts, end, idx, order);
  // points by thread and time (points on no thread are answered -1 at once)
  std::vector<int64_t> pts;
  pts.reserve(m);
  for (Py_ssize_t j = 0; j < m; ++j) {
    out[j] = -1;
    if (pg[j] >= 0) pts.push_back(j);
  }
  std::stable_sort(pts.begin(), pts.end(), [&](int64_t a, int64_t b) {
    return pg[a] != pg[b] ? pg[a] < pg[b] : pt[a] < pt[b];
  });
  sweep(iv, g, ts, end, pts, pg, pt, outer, out);
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject *nesting_around_keyed(PyObject *, PyObject *args) {
  PyObject *oa, *ob, *oc, *ots, *oend, *oidx, *opa, *opb, *opc, *oknown, *opt, *oouter, *oout;
  int order;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOiO", &oa, &ob, &oc, &ots, &oend, &oidx, &opa, &opb, &opc, &oknown, &opt,
                        &oouter, &order, &oout))
    return nullptr;
  View va, vb, vc, vts, vend, vidx, vpa, vpb, vpc, vknown, vpt, vouter, vout;
  Py_ssize_t n = -1, m = -1;
  if (!get(oa, va, 8, n, false) || !get(ob, vb, 8, n, false) || !get(oc, vc, 8, n, false) ||
      !get(ots, vts, 8, n, false) || !get(oend, vend, 8, n, false) || !get(oidx, vidx, 8, n, false) ||
      !get(opa, vpa, 8, m, false) || !get(opb, vpb, 8, m, false) || !get(opc, vpc, 8, m, false) ||
      !get(oknown, vknown, 1, m, false) || !get(opt, vpt, 8, m, false) || !get(oouter, vouter, 1, m, false) ||
      !get(oout, vout, 8, m, true))
    return nullptr;
  auto i64 = [](View &v) { return static_cast<const int64_t *>(v.buf.buf); };
  const Keys3 ik{i64(va), i64(vb), i64(vc)}, pk{i64(vpa), i64(vpb), i64(vpc)};
  const int64_t *ts = i64(vts), *end = i64(vend), *idx = i64(vidx), *pt = i64(vpt);
  const uint8_t *known = static_cast<const uint8_t *>(vknown.buf.buf);
  const uint8_t *outer = static_cast<const uint8_t *>(vouter.buf.buf);
  int64_t *out = static_cast<int64_t *>(vout.buf.buf);

  Py_BEGIN_ALLOW_THREADS;
  // threads numbered as first met (the sweep needs one number per thread, in any order), in a
  // small open-addressing table
  ThreadTable table;
  std::vector<int64_t> g(n), pg(m, -1);
  for (Py_ssize_t i = 0; i < n; ++i) g[i] = table.number(ik.a[i], ik.b[i], ik.c[i], true);
  // the intervals in start order: thread, start, (order 1: longer first), idx. Rows come
  // grouped by thread (a counting sort, which keeps their order), then each thread's sorted
  // unless it is in order already: a cell's slices and launches come nearly in time order, and
  // one sort of all of them by the three keys took 8.5 ms of a cell of 64K slices
  struct Row {
    int64_t ts, tie, idx, row;
    bool operator<(const Row &o) const {
      if (ts != o.ts) return ts < o.ts;
      if (tie != o.tie) return tie < o.tie;
      return idx != o.idx ? idx < o.idx : row < o.row;
    }
  };
  std::vector<Row> rows(n);
  grouped(n, g.data(), table.size(), rows, [&](int64_t i) { return Row{ts[i], order == 1 ? -end[i] : 0, idx[i], i}; });
  std::vector<int64_t> iv(n);
  for (Py_ssize_t k = 0; k < n; ++k) iv[k] = rows[k].row;
  std::vector<Row>().swap(rows);
  // the points on a thread of the intervals, by thread and time
  struct Point {
    int64_t t, row;
    bool operator<(const Point &o) const { return t != o.t ? t < o.t : row < o.row; }
  };
  for (Py_ssize_t j = 0; j < m; ++j) {
    out[j] = -1;
    if (known[j]) pg[j] = table.number(pk.a[j], pk.b[j], pk.c[j], false);
  }
  std::vector<Point> on;
  grouped(m, pg.data(), table.size(), on, [&](int64_t j) { return Point{pt[j], j}; });
  std::vector<int64_t> pts(on.size());
  for (size_t q = 0; q < on.size(); ++q) pts[q] = on[q].row;
  sweep(iv, g.data(), ts, end, pts, pg.data(), pt, outer, out);
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject *nesting_nest(PyObject *, PyObject *args) {
  PyObject *og, *ots, *oend, *oidx, *orows, *odepth, *oparent;
  int order;
  if (!PyArg_ParseTuple(args, "OOOOiOOO", &og, &ots, &oend, &oidx, &order, &orows, &odepth, &oparent)) return nullptr;
  View vg, vts, vend, vidx, vrows, vdepth, vparent;
  Py_ssize_t n = -1;
  if (!get(og, vg, 8, n, false) || !get(ots, vts, 8, n, false) || !get(oend, vend, 8, n, false) ||
      !get(oidx, vidx, 8, n, false) || !get(orows, vrows, 8, n, true) || !get(odepth, vdepth, 8, n, true) ||
      !get(oparent, vparent, 8, n, true))
    return nullptr;
  const int64_t *g = static_cast<const int64_t *>(vg.buf.buf), *ts = static_cast<const int64_t *>(vts.buf.buf),
                *end = static_cast<const int64_t *>(vend.buf.buf), *idx = static_cast<const int64_t *>(vidx.buf.buf);
  int64_t *rows = static_cast<int64_t *>(vrows.buf.buf), *depth = static_cast<int64_t *>(vdepth.buf.buf),
          *parent = static_cast<int64_t *>(vparent.buf.buf);

  Py_BEGIN_ALLOW_THREADS;
  std::vector<int64_t> iv = start_order(n, g, ts, end, idx, order);
  std::vector<int64_t> ends, last;
  for (Py_ssize_t a = 0; a < n;) {  // one thread: positions [a, b) of the start order
    Py_ssize_t b = a;
    while (b < n && g[iv[b]] == g[iv[a]]) ++b;
    depths(iv, a, b, ts, end, ends, depth);
    last.assign(b - a + 2, -1);  // depth -> row of the last start at that depth so far
    for (Py_ssize_t k = a; k < b; ++k) {
      rows[k] = iv[k];
      parent[k] = depth[k] >= 2 ? last[depth[k] - 1] : -1;
      last[depth[k]] = iv[k];
    }
    a = b;
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}
