#!/usr/bin/python3
"""Plots bench_dist_neighbors' CSV (--csv): per (cloud, query) panel, the query time against the
rank count for the ring and the spatial-halo strategies, nanoflann called directly at 1 rank as
the anchor line; a second row of panels shows the point data sent (MB, summed over ranks). When a
(N, ranks, cloud, query, strategy) row appears several times (appended runs), the last one counts.

    /usr/bin/python3 bench/plot_dist_neighbors.py results.csv docs/perf/dist_neighbors.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLS = ["n", "ranks", "dist", "query", "strat", "median_ms", "min_ms", "max_ms", "sent_sum", "sent_max",
        "peak_mib", "rss_mib", "check_dist", "check_cnt", "load"]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    rows = {}
    with open(src) as f:
        for r in csv.reader(f):
            d = dict(zip(COLS, r))
            rows[(int(d["n"]), int(d["ranks"]), d["dist"], d["query"], d["strat"])] = d
    ns = sorted({k[0] for k in rows})
    panels = sorted({(k[2], k[3]) for k in rows}, key=lambda p: (p[0] != "uniform", p[1] != "knn"))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7), squeeze=False)
    for j, (dist, query) in enumerate(panels):
        ax, bx = axes[0][j], axes[1][j]
        for n in ns:
            for strat, style in (("ring", "o-"), ("halo", "s-")):
                pts = sorted((k[1], v) for k, v in rows.items() if k[0] == n and k[2:] == (dist, query, strat))
                if not pts:
                    continue
                x = [p[0] for p in pts]
                label = f"{strat}, N={n / 1e6:g}M"
                ax.errorbar(x, [float(p[1]["median_ms"]) / 1e3 for p in pts],
                            yerr=[[(float(p[1]["median_ms"]) - float(p[1]["min_ms"])) / 1e3 for p in pts],
                                  [(float(p[1]["max_ms"]) - float(p[1]["median_ms"])) / 1e3 for p in pts]],
                            fmt=style, capsize=3, label=label)
                if strat == "ring" or any(p[0] > 1 for p in pts):
                    bx.plot([p[0] for p in pts if p[0] > 1], [float(p[1]["sent_sum"]) * 4 / 1e6 for p in pts if p[0] > 1],
                            style, label=label)
            d = rows.get((n, 1, dist, query, "direct"))
            if d:
                ax.axhline(float(d["median_ms"]) / 1e3, ls="--", color="gray", label=f"nanoflann direct, 1 rank, N={n / 1e6:g}M")
        ax.set_title(f"{dist} {query}")
        ax.set_xlabel("ranks")
        ax.set_ylabel("time (s), max over ranks")
        ax.set_yscale("log")
        ax.set_xticks(sorted({k[1] for k in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        bx.set_yscale("log")
        bx.set_xlabel("ranks")
        bx.set_ylabel("point data sent, MB (sum over ranks)")
        bx.set_xticks(sorted({k[1] for k in rows if k[1] > 1}))
        bx.grid(alpha=0.3)
        bx.legend(fontsize=7)
    fig.suptitle("bench_dist_neighbors: distributed kNN (k=16) / radius queries, ring vs spatial halo")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
