#!/usr/bin/env bash
# Runs every fuzz target for $1 seconds each (default 600), one after another, and prints
# libFuzzer's final statistics line of each. Needs nightly and cargo-fuzz.
set -u
cd "$(dirname "$0")"
secs="${1:-600}"
for t in shard_index chunk_key metadata; do
    cargo +nightly fuzz run "$t" corpus/"$t" -- -max_total_time="$secs" -print_final_stats=1 \
        > "/tmp/fuzz-$t.log" 2>&1
    echo "$t: exit $? $(grep -E 'stat::number_of_executed_units' /tmp/fuzz-$t.log)"
done
