#!/bin/bash
# sweep: label tool flags size runs
cd /tmp/i15h
NEWLDP="LD_LIBRARY_PATH=/tmp/i15h/debs/root/usr/lib/x86_64-linux-gnu XTABLES_LIBDIR=/tmp/i15h/debs/root/usr/lib/x86_64-linux-gnu/xtables"
m() { label=$1; tool=$2; flags=$3; n=$4; runs=$5; ldp=${6:-}
  for r in $(seq $runs); do t=$(LDP="$ldp" flock /tmp/kpsim-heavy.lock bin/one.sh $tool "$flags" in-$n.txt); echo "$label $n $r $t $(date +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a results.txt; done; }
for n in 250 500 1000; do
  m nft189-noflush iptables-nft-restore "--noflush --counters" $n 3
  m nft189-flush iptables-nft-restore "--counters" $n 3
  m legacy189-noflush iptables-legacy-restore "--noflush --counters" $n 3
  m nft1811-noflush /tmp/i15h/debs/root/usr/sbin/iptables-nft-restore "--noflush --counters" $n 3 "$NEWLDP"
  m nft1811-flush /tmp/i15h/debs/root/usr/sbin/iptables-nft-restore "--counters" $n 3 "$NEWLDP"
done
n=2000
m nft1811-noflush /tmp/i15h/debs/root/usr/sbin/iptables-nft-restore "--noflush --counters" $n 3 "$NEWLDP"
m nft189-flush iptables-nft-restore "--counters" $n 3
m legacy189-noflush iptables-legacy-restore "--noflush --counters" $n 3
m nft189-noflush iptables-nft-restore "--noflush --counters" $n 1
