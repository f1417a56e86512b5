#!/bin/bash
# one.sh TOOL FLAGS FILE -> prints "user sys wall rc" of one load into a fresh netns
set -u
tool=$1; flags=$2; file=$3
ns=kpsim-i15h-$$-$RANDOM
ip netns add $ns || exit 9
trap 'ip netns del $ns 2>/dev/null' EXIT INT TERM
ip netns exec $ns ip link set lo up
/usr/bin/time -o ${WORK:-/tmp/i15h}/last-time.$$ -f "%U %S %e %x" ip netns exec $ns env ${LDP:-} $tool $flags < $file >/dev/null 2>${WORK:-/tmp/i15h}/last-err
cat ${WORK:-/tmp/i15h}/last-time.$$; rm -f ${WORK:-/tmp/i15h}/last-time.$$
