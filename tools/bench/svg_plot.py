#!/usr/bin/env python3
"""A line chart as a standalone SVG file, with no plotting library (the
machines here have none): the curves of docs/benchmarks.md.

  python3 tools/bench/svg_plot.py --out docs/plot.svg --title "..." \
      --x-label "context (tokens)" --y-label "ms" --log-x --log-y \
      --series "measured=8192:1.3,32768:1.5" --series "floor=8192:0.03,32768:0.04"

Each --series is NAME=X:Y,X:Y,...; a name ending in "(dashed)" is drawn dashed.
"""
import argparse
import math
import sys

WIDTH, HEIGHT = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 230, 50, 60
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#7f7f7f", "#9467bd", "#ff7f0e"]


def parse_series(text):
    name, _, points = text.partition("=")
    if not points:
        raise ValueError(f"series '{text}': expected NAME=X:Y,X:Y,...")
    pairs = []
    for point in points.split(","):
        x, _, y = point.partition(":")
        pairs.append((float(x), float(y)))
    return name.strip(), pairs


def ticks(low, high, log):
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        return [10.0 ** e for e in range(first, last + 1)]
    step = 10 ** math.floor(math.log10((high - low) or 1))
    start = math.floor(low / step) * step
    return [start + i * step for i in range(int((high - start) / step) + 2)]


def label(value):
    if value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"{int(value // (1024 * 1024))}M"
    if value >= 1024 and value % 1024 == 0:
        return f"{int(value // 1024)}K"
    return f"{value:g}"


def line_chart(path, series, title="", x_label="", y_label="", log_x=False, log_y=False,
               x_ticks=None):
    """Writes the chart of `series` ([(name, [(x, y), ...]), ...]) to `path`."""
    xs = [x for _, points in series for x, _ in points]
    ys = [y for _, points in series for _, y in points]
    if not xs:
        raise ValueError("no points")
    if (log_x and min(xs) <= 0) or (log_y and min(ys) <= 0):
        raise ValueError("log axes need positive values")
    x_ticks = list(x_ticks) if x_ticks else ticks(min(xs), max(xs), log_x)
    y_ticks = ticks(min(ys), max(ys), log_y)
    x_low, x_high = min(x_ticks + xs), max(x_ticks + xs)
    y_low, y_high = min(y_ticks + ys), max(y_ticks + ys)

    def scale(value, low, high, log):
        if log:
            value, low, high = math.log10(value), math.log10(low), math.log10(high)
        return (value - low) / ((high - low) or 1)

    def px(x):
        return LEFT + scale(x, x_low, x_high, log_x) * (WIDTH - LEFT - RIGHT)

    def py(y):
        return HEIGHT - BOTTOM - scale(y, y_low, y_high, log_y) * (HEIGHT - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15">{title}</text>']
    for x in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{HEIGHT - BOTTOM}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{px(x):.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">'
                   f'{label(x)}</text>')
    for y in y_ticks:
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{WIDTH - RIGHT}" y2="{py(y):.1f}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{label(y)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
               f'height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 18}" text-anchor="middle">'
               f'{x_label}</text>')
    out.append(f'<text x="18" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(TOP + HEIGHT - BOTTOM) / 2})">{y_label}</text>')
    for i, (name, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        dashed = ' stroke-dasharray="6 4"' if name.endswith("(dashed)") else ""
        name = name.removesuffix("(dashed)").strip()
        path_points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{path_points}" fill="none" stroke="{color}" '
                   f'stroke-width="2"{dashed}/>')
        for x, y in points:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        legend_y = TOP + 10 + 20 * i
        out.append(f'<line x1="{WIDTH - RIGHT + 12}" y1="{legend_y}" x2="{WIDTH - RIGHT + 36}" '
                   f'y2="{legend_y}" stroke="{color}" stroke-width="2"{dashed}/>')
        out.append(f'<text x="{WIDTH - RIGHT + 42}" y="{legend_y + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as file:
        file.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="")
    parser.add_argument("--x-label", default="")
    parser.add_argument("--y-label", default="")
    parser.add_argument("--log-x", action="store_true")
    parser.add_argument("--log-y", action="store_true")
    parser.add_argument("--x-ticks", help="comma list of x tick values (default: decades)")
    parser.add_argument("--series", action="append", required=True)
    args = parser.parse_args()
    try:
        series = [parse_series(s) for s in args.series]
        x_ticks = [float(v) for v in args.x_ticks.split(",")] if args.x_ticks else None
        line_chart(args.out, series, args.title, args.x_label, args.y_label, args.log_x,
                   args.log_y, x_ticks)
    except ValueError as error:
        print(f"svg_plot: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
