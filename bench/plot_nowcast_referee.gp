# The referee's table as a plot (issue 34): per configuration (ranks, mesh) the time per step,
# the per-rank peak of live tensors against the ideal peak_1 / P, and the validation skill.
#   gnuplot -e "outdir='docs/perf'" bench/plot_nowcast_referee.gp   (run by bench/run_nowcast_referee.sh)
if (!exists("outdir")) outdir = "docs/perf"
f = outdir."/nowcast_referee.dat"
set terminal pngcairo size 1200,420 noenhanced font ",10"
set output outdir."/nowcast_referee.png"
stats f using 10 every ::0::0 nooutput
peak1 = STATS_max
stats f using 4 nooutput
msemax = STATS_max
set multiplot layout 1,3 title "Nowcasting U-Net, same model / seed / data: unsharded (1 rank) vs sharded (2, 4 ranks; 1-D and 2-D meshes)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.8
set grid ytics
set xtics rotate by -30
set key top right
set yrange [0:*]
set title "time per step (median; 4 ranks share 2 cores)"
set ylabel "s / step"
plot f using 8:xtic(sprintf("%d ranks %s", $1, strcol(2))) lc rgb "#1f77b4" notitle
set title "per-rank peak of live tensors"
set ylabel "MiB (max over ranks)"
plot f using 10:xtic(sprintf("%d ranks %s", $1, strcol(2))) lc rgb "#2ca02c" title "measured", \
     f using (peak1 / $1) lc rgb "#bbbbbb" title "ideal peak_1 / P"
set key top left
set title "validation skill (equal within fp32 noise)"
set ylabel "CSI at 35 dBZ"
set y2label "MSE (dBZ^2)"
set y2tics
set yrange [0:1.3]
set ytics 0, 0.2, 1
set y2range [0:msemax * 1.3]
plot f using 5:xtic(sprintf("%d ranks %s", $1, strcol(2))) lc rgb "#ff7f0e" title "CSI", \
     f using 4 axes x1y2 lc rgb "#9467bd" title "MSE (right axis)"
unset multiplot
