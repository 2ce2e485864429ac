# awk -f tools/bench_rate.awk: for each benchmark line of a kernel bench's
# console output, its name and its rate in units of 1e9 per second, higher
# faster: FLOP/s, else kernel_GBps (BM_DecodeStream, in GB/s), else groups/s,
# else iters/s, with google-benchmark's k/M/G/T suffix applied (so "999G/s"
# and "1.01T/s" compare as 999 and 1010). Shared by tools/kernel_ab.sh and
# tools/kernel_pairs.sh; a line with none of the four is skipped.
BEGIN { n = split("FLOP/s kernel_GBps groups iters", names, " ") }
/^BM/ {
  for (w = 1; w <= n; ++w)
    for (i = 1; i <= NF; i++) {
      split($i, kv, "=")
      if (kv[1] != names[w]) continue
      v = kv[2]
      sub("/s$", "", v)
      m = names[w] == "kernel_GBps" ? 1e9 : 1
      if (v ~ /k$/) m = 1e3; else if (v ~ /M$/) m = 1e6; else if (v ~ /G$/) m = 1e9; else if (v ~ /T$/) m = 1e12
      sub("[kMGT]$", "", v)
      printf "%s %.6g\n", $1, v * m / 1e9
      next
    }
}
