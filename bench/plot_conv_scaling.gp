# Plots the strong-scaling table of bench/run_conv_dist.sh (values copied into
# bench/conv_scaling_np2.dat) to docs/perf/conv_scaling_np2.png:
#   gnuplot bench/plot_conv_scaling.gp
set terminal pngcairo size 900,420 noenhanced font ",10"
set output "docs/perf/conv_scaling_np2.png"
set multiplot layout 1,2 title "Domain-parallel conv, fp32 forward+backward, 2-core machine (2026-11-22)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics
set ylabel "ms per iteration (median)"
set key below
set yrange [0:*]
set title "time"
plot "bench/conv_scaling_np2.dat" using 2:xtic(1) title "1 rank x 1 thread", \
     "" using 3 title "1 rank x 2 threads", \
     "" using 4 title "2 ranks x 1 thread"
set ylabel "MiB per rank (peak RSS)"
set title "memory per rank"
plot "bench/conv_scaling_np2.dat" using 6:xtic(1) title "1 rank", \
     "" using 7 title "2 ranks", \
     "" using 8 title "target 1.1 x peak1/2 + halo"
unset multiplot
