#!/usr/bin/env python3
"""Draws bytes/s per device and direction from snapshots of NCCL_ERDMA_STATS_FILE files
(bench/stats-graph.sh takes them), as rate() over the device counters would: a plain SVG,
no plotting library needed.  usage: stats_graph.py SNAPDIR OUT.svg TITLE"""
import os, re, sys

LINE = re.compile(r'^(erdma_device_bytes_(sent|received)_total)\{([^}]*)\}\s+(\S+)')


def samples(snapdir):
    """{(device, direction, pid): [(t, bytes)]} from the snapshots '<t>-<name>.prom'; t is
    when the plugin wrote the file (its mtime, kept by cp -p), not when it was copied."""
    series, names = {}, [n for n in os.listdir(snapdir) if re.match(r'^[0-9.]+-.*\.prom$', n)]
    if not names:
        return series
    t0 = min(os.stat(os.path.join(snapdir, n)).st_mtime for n in names)
    for name in sorted(names):
        t = os.stat(os.path.join(snapdir, name)).st_mtime - t0
        with open(os.path.join(snapdir, name)) as f:
            for line in f:
                lm = LINE.match(line)
                if not lm:
                    continue
                labels = dict(re.findall(r'(\w+)="([^"]*)"', lm.group(3)))
                key = (labels.get('device', '?'), lm.group(2), labels.get('pid', '?'))
                series.setdefault(key, []).append((t, float(lm.group(4))))
    return series


def rates(points, window=3.0):
    """bytes/s over the last `window` seconds at each change, as rate(x[3s]) would: the file
    is rewritten once a second and its mtime has whole seconds, so single steps are coarse."""
    pts = sorted(set(points))
    changes = [p for i, p in enumerate(pts) if i == 0 or p[1] != pts[i - 1][1]]
    out = []
    for t1, b1 in changes[1:]:
        earlier = [(t, b) for t, b in changes if t <= t1 - window] or changes[:1]
        t0, b0 = earlier[-1]
        if t1 > t0 and b1 >= b0:
            out.append((t1, (b1 - b0) / (t1 - t0)))
    return out


def svg(lines, title, out):
    W, H, L, R, T, B = 720, 360, 70, 20, 40, 50
    allp = [p for _, pts in lines for p in pts]
    if not allp:
        sys.exit('stats_graph: no counter changes in the snapshots (did the bench run?)')
    tmax = max(t for t, _ in allp) or 1
    ymax = max(v for _, v in allp) / 1e6 * 1.1 or 1
    x = lambda t: L + (W - L - R) * t / tmax
    y = lambda v: H - B - (H - T - B) * (v / 1e6) / ymax
    colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd']
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
         f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
         f'<text x="{W/2}" y="{H-12}" text-anchor="middle">seconds</text>',
         f'<text x="16" y="{H/2}" transform="rotate(-90 16 {H/2})" text-anchor="middle">MB/s</text>']
    for i in range(6):
        v = ymax * i / 5
        yy = H - B - (H - T - B) * i / 5
        o.append(f'<text x="{L-6}" y="{yy+4}" text-anchor="end">{v:.0f}</text>')
        o.append(f'<line x1="{L}" y1="{yy}" x2="{W-R}" y2="{yy}" stroke="#ddd"/>')
    step = max(1, round(tmax / 5))
    for t in range(0, int(tmax) + 1, step):
        o.append(f'<text x="{x(t)}" y="{H-B+16}" text-anchor="middle">{t:.0f}</text>')
    for n, (label, pts) in enumerate(lines):
        c = colors[n % len(colors)]
        path = ' '.join(f'{x(t):.1f},{y(v):.1f}' for t, v in pts)
        o.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        o.append(f'<text x="{L+10}" y="{T+14+16*n}" fill="{c}">{label}</text>')
    o.append('</svg>')
    with open(out, 'w') as f:
        f.write('\n'.join(o) + '\n')


def main():
    snapdir, out, title = sys.argv[1], sys.argv[2], sys.argv[3]
    lines = []
    for (dev, direction, pid), pts in sorted(samples(snapdir).items()):
        r = rates(pts)
        if r and any(v > 0 for _, v in r):
            lines.append((f'{dev} bytes {direction} (pid {pid})', r))
    svg(lines, title, out)


if __name__ == '__main__':
    main()
