# Benchmark 7.3: ViT training-step per-rank peak memory against field resolution at 1, 2 and 4
# ranks, with the ideal peak_1 / P lines, from the data files of bench/run_vit.sh:
#   gnuplot -e "outdir='docs/perf'; forms='ring neighborhood'" bench/plot_vit_memory.gp   (run by bench/run_vit.sh)
if (!exists("outdir")) outdir = "docs/perf"
if (!exists("forms")) forms = "ring neighborhood"
set terminal pngcairo size 1000,440 noenhanced font ",10"
set output outdir."/vit_memory.png"
set multiplot layout 1,words(forms) title "ViT training step (fp32, patch 8, dim 32, 2 heads, 2 layers, AdamW): per-rank peak of shardtensor's live bytes"
set logscale xy 2
set grid xtics ytics mxtics mytics
set xlabel "field resolution R (R x R field; R^2/64 tokens)"
set ylabel "peak MiB per rank (max over ranks)"
set key top left
set format y "%g"
do for [fi = 1:words(forms)] {
  form = word(forms, fi)
  f = outdir."/vit_memory_".form.".dat"
  set title form." attention"
  plot f using 1:3 with linespoints lw 2 pt 7 lc rgb "#1f77b4" title "1 rank", \
       f using 1:4 with linespoints lw 2 pt 5 lc rgb "#ff7f0e" title "2 ranks (mesh 2x1)", \
       f using 1:5 with linespoints lw 2 pt 9 lc rgb "#2ca02c" title "4 ranks (mesh 2x2)", \
       f using 1:6 with lines dt 2 lw 1.5 lc rgb "#ff7f0e" title "ideal peak_1 / 2", \
       f using 1:7 with lines dt 2 lw 1.5 lc rgb "#2ca02c" title "ideal peak_1 / 4"
}
unset multiplot
