#!/usr/bin/env bash
# CI's short run of the emulated rig: the tiny model on a four-node rig
# (main, shadow, two workers), a handful of tokens, every mode checked
# bit for bit against local mode. Where this machine cannot create
# network namespaces it says SKIP clearly and runs the same benchmark on
# loopback processes instead, so the driver is still exercised.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root"
go build -o bin/odmoe .
tmp=$(mktemp -d)
cleanup() {
	"$here/rig" down >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
bin/odmoe gen-tiny -out "$tmp/tiny" -preset tiny -log-level warn

check() { # OUT: the report files exist and every run is bit-identical
	local out=$1
	for f in report.json report.md timeline.svg; do
		[[ -s $out/$f ]] || { echo "testbed ci: $out/$f missing" >&2; exit 1; }
	done
	if grep -q '"identical": false' "$out/report.json"; then
		echo "testbed ci: a mode's output differs from local mode" >&2
		exit 1
	fi
	grep -c '"identical": true' "$out/report.json" | sed 's/^/testbed ci: bit-identical runs: /'
}

rc=0
"$here/rig" up 4 -rate 1gbit -delay 0.1ms || rc=$?
case $rc in
0)
	bin/odmoe bench rig -rig testbed/rigs/ci.rig -model "$tmp/tiny" -out "$tmp/out" -cases 8x6,16x4 -log-level warn
	check "$tmp/out"
	sed -n '/^## /,$p' "$tmp/out/report.md" | head -20
	echo "testbed ci: emulated 4-node rig: PASS"
	;;
2)
	echo "testbed ci: SKIP the emulated rig: this machine does not allow network namespaces (testbed/rig exit 2)."
	echo "testbed ci: running the same benchmark on loopback processes instead (no shaping)."
	cat >"$tmp/loop.rig" <<-'RIG'
		main   main   127.0.0.1
		shadow shadow 127.0.0.1:7612 -quant fp16
		w1     worker 127.0.0.1:7621 -device-mem 256MiB
		w2     worker 127.0.0.1:7622 -device-mem 256MiB
	RIG
	bin/odmoe bench rig -via local -rig "$tmp/loop.rig" -model "$tmp/tiny" -out "$tmp/out" -cases 8x6,16x4 -log-level warn
	check "$tmp/out"
	echo "testbed ci: loopback rig: PASS (emulated rig SKIPPED)"
	;;
*)
	echo "testbed ci: testbed/rig up failed (exit $rc)" >&2
	exit "$rc"
	;;
esac
