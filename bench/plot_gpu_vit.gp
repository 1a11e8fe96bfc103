# Issue 32 item 4: the ViT training step on one GPU against resolution, ours vs the torch twin, and
# the per-rank GPU peak at P ranks sharing the GPU, from bench/run_gpu_vit.sh's OUT_TSV:
#   gnuplot -e "tsv='vit_gpu.tsv'; outdir='docs/perf'" bench/plot_gpu_vit.gp
# Writes outdir/vit_gpu_step.png (s/step against grid, per precision, log-log),
# outdir/vit_gpu_infer.png (inference ms against grid) and outdir/vit_gpu_memory.png (per-rank
# peak against P with the ideal single / P).
if (!exists("tsv")) tsv = "vit_gpu.tsv"
if (!exists("outdir")) outdir = "docs/perf"
set datafile separator "\t"
set datafile missing "nan"
set terminal pngcairo size 1000,440 noenhanced font ",10"
set output outdir."/vit_gpu_step.png"
set multiplot layout 1,2 title "ViT training step on one GPU (patch 8, batch 1, ring attention at 1 rank): shardtensor vs PyTorch eager"
set logscale xy 2
set grid xtics ytics
set xlabel "field resolution R (R x R; (R/8)^2 tokens)"
set ylabel "s / step (steady state)"
set key top left
do for [p in "bf16 fp32"] {
  set title p
  plot tsv using (strcol(1) eq "step" && strcol(2) eq p ? $3 : NaN):6 with linespoints lw 2 pt 7 title "shardtensor", \
       tsv using (strcol(1) eq "step" && strcol(2) eq p ? $3 : NaN):7 with linespoints lw 2 pt 5 title "torch"
}
unset multiplot
set output outdir."/vit_gpu_infer.png"
set multiplot layout 1,2 title "ViT inference (one forward, eval, no grad) on one GPU: shardtensor vs PyTorch eager"
set ylabel "ms / forward (median)"
do for [p in "bf16 fp32"] {
  set title p
  plot tsv using (strcol(1) eq "step" && strcol(2) eq p ? $3 : NaN):13 with linespoints lw 2 pt 7 title "shardtensor", \
       tsv using (strcol(1) eq "step" && strcol(2) eq p ? $3 : NaN):12 with linespoints lw 2 pt 5 title "torch"
}
unset multiplot
set output outdir."/vit_gpu_memory.png"
unset logscale
set logscale y 2
set xlabel "ranks sharing the GPU (P)"
set ylabel "per-rank GPU peak MiB (steady state, max over ranks)"
set title "ViT training step, per-rank GPU peak at P ranks (one GPU)"
stats tsv using (strcol(1) eq "mem" && $5 == 1 ? $10 : NaN) name "S" nooutput
plot tsv using (strcol(1) eq "mem" ? $5 : NaN):10 with linespoints lw 2 pt 7 title "shardtensor", \
     tsv using (strcol(1) eq "mem" ? $5 : NaN):(S_max / $5) with lines dt 2 lw 1.5 title "ideal single / P"
