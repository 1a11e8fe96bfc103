#!/usr/bin/python3
"""Plots bench/run_dist_fft.sh's CSV: time vs ranks, ours (slab, pencil) vs FFTW-MPI (normal and
TRANSPOSED_OUT), one panel per (kind, dtype); each point is the median over the rounds of each
run's median, the bar the range of those medians. Also prints the markdown table of those medians
and of the per-round ratios ours / FFTW-MPI (median, [min-max] over the rounds).

    /usr/bin/python3 bench/plot_dist_fft.py build/dist_fft_results/fft_n256.csv docs/perf/dist_fft.png
"""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fmt_ratio(vals):
    if not vals:
        return "-"
    return f"{statistics.median(vals):.3f} [{min(vals):.2f}-{max(vals):.2f}]"


def print_table(runs, by_round, loads, cases):
    names = ["ours slab", "FFTW-MPI", "FFTW-MPI TRANSPOSED_OUT", "ours pencil 2x2"]
    print("| case | ranks | load (1 min) | ours slab ms | FFTW-MPI ms | FFTW-MPI TRANSPOSED_OUT ms | ours pencil 2x2 ms"
          " | ours / FFTW-MPI | ours / TRANSPOSED_OUT | pencil / TRANSPOSED_OUT |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, dtype in cases:
        for ranks in sorted({r for (k, d, _, r) in runs if (k, d) == (kind, dtype)}):
            cells = []
            for v in names:
                vals = runs.get((kind, dtype, v, ranks))
                cells.append(f"{statistics.median(vals):.1f}" if vals else "-")
            rr = [m for (k, d, r, _), m in by_round.items() if (k, d, r) == (kind, dtype, ranks)]
            rat = lambda a, b: [m[a] / m[b] for m in rr if a in m and b in m]  # noqa: E731
            ld = loads[ranks]
            print(f"| {kind} {dtype} | {ranks} | {min(ld):.1f}-{max(ld):.1f} | " + " | ".join(cells) + " | "
                  + " | ".join(fmt_ratio(rat(a, b)) for a, b in [("ours slab", "FFTW-MPI"),
                                                                 ("ours slab", "FFTW-MPI TRANSPOSED_OUT"),
                                                                 ("ours pencil 2x2", "FFTW-MPI TRANSPOSED_OUT")])
                  + " |")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    # round,load1,part,kind,dtype,n,ranks,variant,median_ms,p10_ms,p90_ms
    runs = defaultdict(list)
    by_round = defaultdict(dict)  # (kind, dtype, ranks, round) -> {variant: ms}
    loads = defaultdict(list)
    n = None
    with open(src) as f:
        for row in csv.reader(f):
            if len(row) < 11 or row[2] != "fft":
                continue
            rnd, load, _, kind, dtype, n, ranks, variant, med = row[:9]
            runs[(kind, dtype, variant, int(ranks))].append(float(med))
            by_round[(kind, dtype, int(ranks), rnd)][variant] = float(med)
            loads[int(ranks)].append(float(load))
    cases = sorted({(k, d) for (k, d, _, _) in runs}, key=lambda c: (c[0], c[1] != "f64"))
    print_table(runs, by_round, loads, cases)
    variants = [("ours slab", "C0", "o-"), ("FFTW-MPI", "C1", "s--"),
                ("FFTW-MPI TRANSPOSED_OUT", "C2", "^--"), ("ours pencil 2x2", "C3", "D")]
    cols = 2 if len(cases) > 1 else 1
    rows = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 4.0 * rows), squeeze=False)
    for ax, (kind, dtype) in zip(axes.flat, cases):
        for name, color, style in variants:
            pts = sorted((r, v) for (k, d, vn, r), v in runs.items() if (k, d, vn) == (kind, dtype, name))
            if not pts:
                continue
            xs = [r for r, _ in pts]
            med = [statistics.median(v) for _, v in pts]
            lo = [m - min(v) for m, (_, v) in zip(med, pts)]
            hi = [max(v) - m for m, (_, v) in zip(med, pts)]
            ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, color=color, label=name, capsize=3)
        ax.set_title(f"{kind} {dtype} {n}^3")
        ax.set_xlabel("ranks (4 = 2 per core, oversubscribed)")
        ax.set_xticks([1, 2, 4])
        ax.set_ylabel("ms (median of run medians)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    all_loads = [x for v in loads.values() for x in v]
    fig.suptitle("distributed 3-D forward FFT: shardtensor vs FFTW-MPI, FFTW_ESTIMATE, 1 thread/rank\n"
                 f"(2-core Xeon, shared: load {min(all_loads):.1f}-{max(all_loads):.1f})")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
