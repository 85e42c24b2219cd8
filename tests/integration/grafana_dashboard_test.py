#!/usr/bin/env python3
"""deploy/grafana-dashboard.json against a live node's /metrics.

Parses the dashboard, checks its shape (unique panel ids, every panel on the
24-column grid with a Prometheus query, the $datasource and $job variables),
then starts a one-node tierkvd, writes and reads a little, fetches /metrics
and checks every query: each tierkv_* name it uses is a sample name the node
exports; each `label="value"` matcher (and each `label!=`/`=~` one) names a
label that metric has, with, for `=`, a sample carrying that value; each
`by (...)` label other than instance/job exists on the metric. A self-test
first feeds the checker planted bad dashboards (an unknown metric, an unknown
label value, a panel without a query), each of which must be rejected.

usage: grafana_dashboard_test.py TIERKVD DASHBOARD_JSON
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402

SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus, not in /metrics
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"')
SELECTOR = re.compile(r'\b(tierkv_[a-z0-9_]+)\s*(\{[^}]*\})?')
BY = re.compile(r'\b(?:by|without)\s*\(([^)]*)\)')


def parse_metrics(text):
    """{name: [labels dict, ...]} of the exposition's samples."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError("unparsable /metrics line: %r" % line)
        labels = {k: v for k, _, v in LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append(labels)
    return out


def panels_of(dash):
    for p in dash.get("panels", []):
        yield p
        for sub in p.get("panels", []):
            yield sub


def check_shape(dash):
    errs = []
    names = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    for want in ("datasource", "job"):
        if want not in names:
            errs.append("no $%s variable" % want)
    ids = set()
    n_queries = 0
    for p in panels_of(dash):
        pid, title = p.get("id"), p.get("title", "?")
        if pid in ids:
            errs.append("panel id %r repeats (%s)" % (pid, title))
        ids.add(pid)
        g = p.get("gridPos", {})
        if not all(k in g for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24:
            errs.append("panel %r: bad gridPos %r" % (title, g))
        if p.get("type") == "row":
            continue
        targets = [t for t in p.get("targets", []) if t.get("expr")]
        if not targets:
            errs.append("panel %r has no query" % title)
        n_queries += len(targets)
    if n_queries == 0:
        errs.append("no queries at all")
    return errs


def check_queries(dash, metrics):
    """The queries' metric names and labels against parse_metrics output."""
    errs, used = [], set()
    for p in panels_of(dash):
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            sels = SELECTOR.findall(expr)
            if not sels:
                errs.append("panel %r: query uses no tierkv metric: %s" % (p.get("title"), expr))
            for name, sel in sels:
                used.add(name)
                if name not in metrics:
                    errs.append("%s: not in /metrics (panel %r)" % (name, p.get("title")))
                    continue
                samples = metrics[name]
                have = set().union(*[s.keys() for s in samples])
                for label, op, value in LABEL.findall(sel or ""):
                    if label in SCRAPE_LABELS:
                        continue
                    if label not in have:
                        errs.append("%s has no label %s (panel %r)" % (name, label, p.get("title")))
                    elif op == "=" and not any(s.get(label) == value for s in samples):
                        errs.append('%s{%s="%s"}: no such sample (panel %r)'
                                    % (name, label, value, p.get("title")))
            for group in BY.findall(expr):
                for label in [x.strip() for x in group.split(",") if x.strip()]:
                    if label in SCRAPE_LABELS:
                        continue
                    if not any(label in set().union(*[s.keys() for s in metrics.get(n, [{}])])
                               for n, _ in sels):
                        errs.append("by (%s): no metric of %r has it" % (label, expr))
    return errs, used


def self_test(dash, metrics):
    def planted(expr):
        d = json.loads(json.dumps(dash))
        d["panels"].append({"type": "timeseries", "id": 9999, "title": "planted",
                            "gridPos": {"x": 0, "y": 999, "w": 12, "h": 8},
                            "targets": [{"expr": expr, "refId": "A"}] if expr else []})
        return d
    cases = [("an unknown metric", planted('rate(tierkv_no_such_metric_total{job=~"$job"}[1m])')),
             ("an unknown label value", planted('tierkv_raft_role{role="boss"}')),
             ("an unknown label", planted('tierkv_raft_term{colour="red"}')),
             ("an unknown by label", planted('sum by (shard) (tierkv_raft_term)')),
             ("a panel without a query", planted(None))]
    for what, d in cases:
        errs = check_shape(d) + check_queries(d, metrics)[0]
        if not errs:
            sys.exit("self-test: the checker accepted a dashboard with %s" % what)
    print("self-test: the checker rejects %d planted bad dashboards" % len(cases))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        dash = json.load(f)
    errs = check_shape(dash)
    c = tk.Cluster(binary, n=1)
    c.start()
    failed = True
    try:
        lead = c.wait_leader(timeout=30)
        port = c.node(lead).http_port
        for i in range(20):
            st, _, _ = tk.request(port, "PUT", "/v1/kv/dash%d" % i, b"v")
            tk.check(st == 200, "PUT answered %d" % st)
        tk.request(port, "GET", "/v1/kv/dash1")
        tk.request(port, "GET", "/v1/kv/no-such-key")
        st, _, body = tk.request(port, "GET", "/metrics")
        tk.check(st == 200, "/metrics answered %d" % st)
        metrics = parse_metrics(body.decode())
        self_test(dash, metrics)
        q_errs, used = check_queries(dash, metrics)
        errs += q_errs
        n_panels = sum(1 for p in panels_of(dash) if p.get("type") != "row")
        print("dashboard: %d panels, %d tierkv metrics used of %d exported"
              % (n_panels, len(used), len(metrics)))
        unused = sorted(n for n in metrics if n not in used
                        and not n.endswith(("_sum", "_count")))
        print("exported but not on the dashboard: %s" % (", ".join(unused) or "none"))
        for e in errs:
            print("FAIL %s" % e)
        failed = bool(errs)
    finally:
        tk.finish(c, failed)


if __name__ == "__main__":
    main()
