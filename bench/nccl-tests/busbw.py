#!/usr/bin/env python3
"""Turns nccl-tests output into a bus-bandwidth table against the NICs' line rate.

    busbw.py [--op all_reduce] [--ranks N] [--line-rate-gbps 400] [--json] [FILE]

busbw is recomputed from algbw with nccl-tests' factors (all-reduce 2(n-1)/n;
all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, sendrecv 1)
and checked against the busbw column nccl-tests printed: a mismatch means the
rank count is wrong (exit status 1). The operation and rank count are read from
the output ("# Collective test starting: X_perf", one "#  Rank" line per rank)
unless given. --line-rate-gbps is the line rate in Gbit/s of the NICs one node's
traffic crosses (ebmgn9g: 2 eRDMA NICs); "% line" is busbw*8 / line rate, which
is how far the inter-node links are used when they are the bottleneck.
"""
import argparse
import json
import re
import sys

FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def bus_factor(op, nranks):
    if op not in FACTORS:
        raise ValueError(f"unknown operation {op!r}; one of {', '.join(sorted(FACTORS))}")
    if nranks < 1:
        raise ValueError("the rank count must be at least 1")
    return FACTORS[op](nranks)


def human_size(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.0f} {unit}"
        nbytes /= 1024.0
    return str(nbytes)


def to_float(text):
    try:
        return float(text)
    except ValueError:
        return None


def parse(text):
    """Returns (op or None, nranks or None, rows, reported average busbw or None)."""
    op = None
    m = re.search(r"Collective test starting:\s*(\w+?)_perf", text)
    if m:
        op = m.group(1)
    ranks = set(re.findall(r"^#\s+Rank\s+(\d+)\s", text, re.M))
    header = None
    rows = []
    for line in text.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] == "#" and "algbw" in tokens and "size" in tokens:
            header = tokens[1:]
            continue
        if header is None or not tokens[0].isdigit() or len(tokens) != len(header):
            continue
        cols = {}
        for name, value in zip(header, tokens):
            cols.setdefault(name, []).append(value)
        rows.append({
            "size": int(cols["size"][0]),
            "count": int(cols["count"][0]),
            "time_us": [to_float(v) for v in cols["time"]],
            "algbw": [to_float(v) for v in cols["algbw"]],
            "busbw": [to_float(v) for v in cols["busbw"]],
        })
    m = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", text)
    avg = float(m.group(1)) if m else None
    return op, (len(ranks) or None), rows, avg


def analyse(rows, factor, line_rate_gbps):
    """Adds computed busbw and % of line rate; returns the rows whose busbw disagrees."""
    mismatches = []
    for r in rows:
        r["busbw_calc"] = [None if a is None else a * factor for a in r["algbw"]]
        r["pct_line"] = [
            None if (b is None or not line_rate_gbps) else 100.0 * b * 8.0 / line_rate_gbps
            for b in r["busbw_calc"]
        ]
        for calc, shown in zip(r["busbw_calc"], r["busbw"]):
            # algbw is printed with 2 decimals: allow its rounding, scaled, or 1%
            if calc is not None and shown is not None and \
                    abs(calc - shown) > max(0.006 * factor + 0.005, 0.01 * shown):
                mismatches.append((r["size"], calc, shown))
    return mismatches


def markdown(op, nranks, factor, rows, line_rate_gbps, avg):
    out = [f"{op} over {nranks} ranks: busbw = algbw x {factor:.4g}"
           + (f"; line rate {line_rate_gbps:g} Gbit/s = {line_rate_gbps / 8:g} GB/s"
              if line_rate_gbps else "")]
    out.append("")
    out.append("| size | algbw (GB/s) | busbw (GB/s) | busbw in-place (GB/s) | % line |")
    out.append("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        b = r["busbw_calc"]
        pct = r["pct_line"][0]
        out.append("| {} | {} | {} | {} | {} |".format(
            human_size(r["size"]),
            "-" if r["algbw"][0] is None else f"{r['algbw'][0]:.2f}",
            "-" if b[0] is None else f"{b[0]:.2f}",
            "-" if len(b) < 2 or b[1] is None else f"{b[1]:.2f}",
            "-" if pct is None else f"{pct:.0f}%"))
    best = max((r for r in rows if r["busbw_calc"][0] is not None),
               key=lambda r: r["busbw_calc"][0], default=None)
    out.append("")
    if best:
        line = f"peak busbw {best['busbw_calc'][0]:.2f} GB/s at {human_size(best['size'])}"
        if best["pct_line"][0] is not None:
            line += f" ({best['pct_line'][0]:.0f}% of line rate)"
        out.append(line)
    if avg is not None:
        out.append(f"nccl-tests average busbw {avg:.2f} GB/s")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="nccl-tests output (default: stdin)")
    ap.add_argument("--op", help="all_reduce, all_gather, reduce_scatter, alltoall, ...")
    ap.add_argument("--ranks", type=int, help="number of ranks (default: '#  Rank' lines)")
    ap.add_argument("--line-rate-gbps", type=float, default=0.0,
                    help="line rate of the node's NICs in Gbit/s, e.g. 400 for 2 x 200")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    text = open(args.file).read() if args.file else sys.stdin.read()
    op, nranks, rows, avg = parse(text)
    op = args.op or op
    nranks = args.ranks or nranks
    if not rows:
        print("busbw.py: no nccl-tests result rows found", file=sys.stderr)
        return 2
    if not op or not nranks:
        print("busbw.py: cannot tell the operation or rank count; pass --op and --ranks",
              file=sys.stderr)
        return 2
    try:
        factor = bus_factor(op, nranks)
    except ValueError as e:
        print(f"busbw.py: {e}", file=sys.stderr)
        return 2
    mismatches = analyse(rows, factor, args.line_rate_gbps)
    if args.json:
        json.dump({"op": op, "ranks": nranks, "factor": factor,
                   "line_rate_gbps": args.line_rate_gbps, "avg_busbw": avg, "rows": rows},
                  sys.stdout, indent=1)
        print()
    else:
        sys.stdout.write(markdown(op, nranks, factor, rows, args.line_rate_gbps, avg))
    for size, calc, shown in mismatches:
        print(f"busbw.py: at {size} B nccl-tests printed busbw {shown} but algbw x {factor:.4g} "
              f"= {calc:.2f}: is the rank count ({nranks}) right?", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
