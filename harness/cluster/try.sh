#!/bin/sh
# try.sh [kpsim-cluster flags]: the first proof of issue 32, item 1, as
# run by hand (root, after make upstream cluster-tools): a snapshot of the
# host (host-snapshot.sh), bin/kpsim-cluster (up, one pod of the local
# pause image per node, down), a second snapshot, their diff, and the files
# changed meanwhile outside the run's own places (the run folder in /tmp,
# Go's caches, the work tree, the namespaces' folder and run markers). Exit 0 only when the cluster ran its pods and
# the host is as it was. Other runs of the project (another session's tests)
# add and remove their own kpsim-* namespaces meanwhile: those lines of the
# diff are listed, not counted.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${KPSIM_TRY_DIR:-/tmp/kpsim-cluster-try}
rm -rf "$out" && mkdir -p "$out"
sh "$here/host-snapshot.sh" "$out/before.txt"
touch "$out/marker"
sleep 1
"$root/bin/kpsim-cluster" --bin "$root/bin" --keep-logs "$out/logs" "$@" 2>&1 | tee "$out/run.log"
rc=$?
[ -e "$out/run.log" ] && grep -q '^teardown in' "$out/run.log" || rc=1
sh "$here/host-snapshot.sh" "$out/after.txt"
diff "$out/before.txt" "$out/after.txt" > "$out/diff.txt"
grep -E '^[<>]' "$out/diff.txt" | grep -v -E 'kpsim-[0-9a-f]{6}-' > "$out/diff-ours.txt"
find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /work -o -path /root/.cache -o -path /root/go \
	-o -path /run/netns -o -path /run/kpsim -o -path /var/cache/apt -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/log \) -prune -o -newer "$out/marker" -print \
	2>/dev/null > "$out/changed-files.txt"
echo "try: kpsim-cluster exit $rc; host diff (other runs' namespaces left out): $(wc -l < "$out/diff-ours.txt") line(s); files changed outside the run: $(wc -l < "$out/changed-files.txt") (in $out)"
cat "$out/diff-ours.txt" "$out/changed-files.txt"
[ "$rc" = 0 ] && [ ! -s "$out/diff-ours.txt" ] && [ ! -s "$out/changed-files.txt" ]
