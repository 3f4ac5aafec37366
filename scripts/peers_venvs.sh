#!/bin/sh
# The peers `make bench-peers` measures tracepipe beside, each in a virtual environment of its own
# (never tracepipe's): TraceLens from a checkout of its repository, Holistic Trace Analysis 0.5.0
# and traceinsight 0.6.1 (HTA's later name) from PyPI.
#
#   TRACELENS_SRC=/path/to/TraceLens sh scripts/peers_venvs.sh     # makes $PEERS_DIR/{tracelens,hta050,hta061}
#
# PEERS_DIR defaults to /tmp/peers; bench/bench_peers.py finds them there (or through PEERS=...).
set -e
PEERS_DIR=${PEERS_DIR:-/tmp/peers}
PY=${PYTHON:-python3}
mkdir -p "$PEERS_DIR"
if [ -n "$TRACELENS_SRC" ] && [ ! -x "$PEERS_DIR/tracelens/bin/python" ]; then
    "$PY" -m venv "$PEERS_DIR/tracelens"
    "$PEERS_DIR/tracelens/bin/pip" install -q "$TRACELENS_SRC"
fi
if [ ! -x "$PEERS_DIR/hta050/bin/python" ]; then
    "$PY" -m venv "$PEERS_DIR/hta050"
    "$PEERS_DIR/hta050/bin/pip" install -q HolisticTraceAnalysis==0.5.0
fi
if [ ! -x "$PEERS_DIR/hta061/bin/python" ]; then
    "$PY" -m venv "$PEERS_DIR/hta061"
    "$PEERS_DIR/hta061/bin/pip" install -q traceinsight==0.6.1
fi
ls "$PEERS_DIR"
