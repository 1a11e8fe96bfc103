# Benchmark 7.4: ViT inference latency (forward under NoGradGuard) against rank count at a fixed
# resolution, from outdir/vit_latency.dat of bench/run_vit.sh:
#   gnuplot -e "outdir='docs/perf'" bench/plot_vit_latency.gp     (run by bench/run_vit.sh)
# The machine has 2 cores: the 4-rank bar is oversubscribed (2 ranks per core).
if (!exists("outdir")) outdir = "docs/perf"
f = outdir."/vit_latency.dat"
set terminal pngcairo size 800,440 noenhanced font ",10"
set output outdir."/vit_latency.png"
if (!exists("res")) res = "1024"
set title "ViT inference latency (forward under NoGradGuard), ".res."^2 field, ring attention, fp32, 2-core machine\n(4 ranks oversubscribe the 2 cores; medians of the launches' medians)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics
set yrange [0:*]
set ylabel "ms per forward"
set xlabel "ranks x threads per rank"
set key top right
plot f using 4:xtic(1) title "wall time", \
     "" using 5 title "CPU time, busiest rank", \
     "" using 6 title "CPU time, summed over ranks"
