// nesting: which interval on a thread encloses each point in time, by one sweep per thread
// (`pipeline/link/nesting.py`'s rule, which it answers with sorts and binary searches in polars).
//
// around(iv_g, iv_ts, iv_end, iv_idx, pt_g, pt_t, pt_outer, order, out):
//   intervals (thread number g >= 0, start, end, idx; no nulls), points (thread number, or -1 for
//   a point on no thread of the intervals; time; 1 where the outermost interval is wanted, else
//   the innermost); order 0: intervals starting at one instant nest by idx (file order), 1: longer
//   first, then by idx. Writes, for each point, the row of the interval that encloses it, or -1.
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
