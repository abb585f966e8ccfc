#!/usr/bin/env python3
"""The stats file the plugin writes, read by a real Prometheus text parser
(prometheus_client, Debian's python3-prometheus-client) and by `nccl-erdma-doctor --stats`.

usage: test_stats_file.py STATS_SAMPLE DOCTOR
"""
import os
import subprocess
import sys
import tempfile

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("FAIL: no prometheus_client for %s: apt-get install python3-prometheus-client "
          "(tests/install-deps.sh does)" % sys.executable)
    sys.exit(1)

sample, doctor = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


with tempfile.TemporaryDirectory() as d:
    tmpl = os.path.join(d, "erdma-%p.prom")
    out = subprocess.run([sample, tmpl], capture_output=True, text=True)
    check(out.returncode == 0, "stats_sample wrote the file: " + out.stderr.strip())
    files = os.listdir(d)
    check(len(files) == 1 and files[0].startswith("erdma-") and files[0].endswith(".prom"),
          "one file named with the pid, no temporary left: %s" % files)
    path = os.path.join(d, files[0])
    pid = files[0][len("erdma-"):-len(".prom")]
    text = open(path).read()

    samples = {}
    types = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            key = (s.name,) + tuple(sorted(s.labels.items()))
            check(key not in samples, "series appears once: %s" % (key,))
            samples[key] = s.value

    def val(name, **labels):
        return samples.get((name,) + tuple(sorted(labels.items())))

    check(len(samples) > 20, "parsed %d samples" % len(samples))
    check(types.get("erdma_device_bytes_sent") == "counter", "bytes sent is a counter")
    check(types.get("erdma_device_request_max_inflight_seconds") == "gauge",
          "max in flight is a gauge")
    check(val("erdma_device_bytes_sent_total", device="erdma_0", pid=pid) == 1048576 + 1000,
          "device bytes sent = live + closed connections")
    check(val("erdma_device_messages_sent_total", device="erdma_0", pid=pid) == 5,
          "device messages sent")
    check(val("erdma_device_bytes_received_total", device="erdma_1", pid=pid) == 4096,
          "device bytes received")
    check(val("erdma_device_flushes_total", device="erdma_1", pid=pid) == 2, "flushes")
    check(val("erdma_device_connects_total", device="erdma_0", pid=pid) == 2, "connects")
    check(val("erdma_device_accepts_total", device="erdma_1", pid=pid) == 1, "accepts")
    check(val("erdma_device_accept_rejections_total", device="erdma_1", pid=pid) == 1,
          "accept rejections")
    check(val("erdma_device_completion_errors_total", device="erdma_0", pid=pid,
              status="retry_exceeded") == 1, "completion errors by status")
    check(val("erdma_device_request_max_inflight_seconds", device="erdma_0", pid=pid) == 0.0025,
          "max in flight in seconds")
    conn_send = [k for k in samples if k[0] == "erdma_conn_bytes_sent_total"
                 and ("peer", "10.0.0.2:41000") in k]
    check(len(conn_send) == 1 and samples[conn_send[0]] == 1048576,
          "per-connection series with its peer")
    odd = [k for k in samples if k[0] == "erdma_conn_bytes_received_total"
           and ("peer", '10.0.0.3:"odd"') in k]
    check(len(odd) == 1 and samples[odd[0]] == 4096, "a quote in a label survives escaping")
    check(not any(("peer", "10.0.0.9:40000") in k for k in samples),
          "a closed connection has no series of its own")

    out = subprocess.run([doctor, "--stats", path], capture_output=True, text=True)
    print(out.stdout)
    check(out.returncode == 0, "doctor --stats exits 0: " + out.stderr.strip())
    o = out.stdout
    check("erdma_0" in o and "1.0 MiB" in o and "retry_exceeded 1" in o,
          "doctor shows erdma_0's bytes and its error by status")
    check("10.0.0.2:41000" in o and "10.0.0.3:\"odd\"" in o, "doctor lists the connections")
    check("2.5 ms" in o, "doctor shows the longest request in flight")
    bad = subprocess.run([doctor, "--stats", os.path.join(d, "missing.prom")],
                         capture_output=True, text=True)
    check(bad.returncode == 2 and "missing.prom" in bad.stderr,
          "doctor --stats on a missing file says so and exits 2")

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
