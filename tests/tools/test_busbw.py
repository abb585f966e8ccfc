#!/usr/bin/env python3
"""Unit tests of bench/nccl-tests/busbw.py on a sample in nccl-tests' output format
(tests/fixtures/nccl-tests/all_reduce_perf_2x8.txt: 2 nodes x 8 GPUs)."""
import contextlib
import io
import json
import os
import sys
import unittest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench", "nccl-tests"))
import busbw  # noqa: E402

SAMPLE = os.path.join(SRC, "tests", "fixtures", "nccl-tests", "all_reduce_perf_2x8.txt")


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = busbw.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


class Factors(unittest.TestCase):
    def test_nccl_tests_factors(self):
        self.assertAlmostEqual(busbw.bus_factor("all_reduce", 16), 1.875)
        self.assertAlmostEqual(busbw.bus_factor("all_reduce", 2), 1.0)
        self.assertAlmostEqual(busbw.bus_factor("all_gather", 16), 0.9375)
        self.assertAlmostEqual(busbw.bus_factor("reduce_scatter", 4), 0.75)
        self.assertAlmostEqual(busbw.bus_factor("alltoall", 8), 0.875)
        self.assertAlmostEqual(busbw.bus_factor("broadcast", 8), 1.0)
        with self.assertRaises(ValueError):
            busbw.bus_factor("allreduce", 8)
        with self.assertRaises(ValueError):
            busbw.bus_factor("all_reduce", 0)


class Sample(unittest.TestCase):
    def setUp(self):
        with open(SAMPLE) as f:
            self.text = f.read()

    def test_parse(self):
        op, n, rows, avg = busbw.parse(self.text)
        self.assertEqual(op, "all_reduce")
        self.assertEqual(n, 16)
        self.assertEqual(len(rows), 16)
        self.assertEqual(rows[0]["size"], 8)
        self.assertEqual(rows[-1]["size"], 8589934592)
        self.assertEqual(rows[-1]["algbw"], [22.00, 21.78])
        self.assertAlmostEqual(avg, 17.6928, places=3)

    def test_table_against_line_rate(self):
        rc, out, err = run("--line-rate-gbps", "400", SAMPLE)
        self.assertEqual(rc, 0, err)
        self.assertIn("all_reduce over 16 ranks: busbw = algbw x 1.875", out)
        self.assertIn("| 8 GiB | 22.00 | 41.25 | 40.84 | 82% |", out)
        self.assertIn("| 2 MiB | 13.95 | 26.16 | 25.89 | 52% |", out)
        self.assertIn("peak busbw 41.25 GB/s at 8 GiB (82% of line rate)", out)

    def test_wrong_rank_count_is_caught(self):
        rc, out, err = run("--ranks", "8", SAMPLE)
        self.assertEqual(rc, 1)
        self.assertIn("is the rank count (8) right?", err)

    def test_op_override_changes_factor(self):
        # the same numbers read as all_gather: printed busbw no longer matches
        rc, out, err = run("--op", "all_gather", SAMPLE)
        self.assertEqual(rc, 1)
        self.assertIn("all_gather over 16 ranks: busbw = algbw x 0.9375", out)

    def test_json(self):
        rc, out, err = run("--json", "--line-rate-gbps", "400", SAMPLE)
        self.assertEqual(rc, 0, err)
        d = json.loads(out)
        self.assertEqual((d["op"], d["ranks"]), ("all_reduce", 16))
        self.assertAlmostEqual(d["rows"][-1]["busbw_calc"][0], 41.25)
        self.assertAlmostEqual(d["rows"][-1]["pct_line"][0], 82.5)

    def test_no_rows(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("# nThread 1 nGpus 1\n# Out of bounds values : 0 OK\n")
        try:
            rc, out, err = run(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(rc, 2)
        self.assertIn("no nccl-tests result rows", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
