#!/bin/sh
# tail-probe.sh [RATE] [NAME=VALUE...]: where a delivery's latency goes.
# Builds PopSub from this commit with tail-probe.patch applied (an
# experiment, never a setting), runs one `compare latency` against it at
# RATE messages a second (10000 unless given) with ten subscribers, and
# prints the client's row, then the server's own timings of the same
# deliveries from 1.5 s to 5.3 s into the run, in ms since the client
# sent each message: when the publisher's reader had read the frame,
# when it had handled it (sequenced, queued for the log, fanned out),
# when a writer began framing each delivery, and when its write to the
# socket returned. NAME=VALUE pairs go into the server's environment:
# POPSUB_EXP_NOCOMMIT=1 makes the log commit nothing, an ablation.
# The patch is against popsub.go as committed with it; once popsub.go
# changes, git apply says so, and the patch is to be made again.
set -eu
cd "$(dirname "$0")"
rate=${1:-10000}
if [ $# -gt 0 ]; then shift; fi
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/popsub"
git -C "$root" archive HEAD | tar -x -C "$work/popsub"
git -C "$work/popsub" apply "$PWD/tail-probe.patch"
(cd "$work/popsub" && go build -o "$work/popsub-probe" ./cmd/popsub)
go build -o "$work/compare" .

export POPSUB_PROBE="$work/probe.txt"
env "$@" "$work/compare" latency --popsub "$work/popsub-probe" \
	--rates "$rate" --only "PopSub, one" > "$work/client.txt" &
client=$!
until server=$(pgrep -f "^$work/popsub-probe serve"); do sleep 0.05; done
sleep 1.5
kill -USR1 "$server" # forget the warm-up
sleep 3.8
kill -USR1 "$server"
wait "$client"
tail -1 "$work/client.txt"
sed -n '/^--$/,$p' "$POPSUB_PROBE" | sed 1d
