#!/usr/bin/env bash
# Mutation testing of the code whose mistakes cost trust: cargo-mutants (pinned below, installed
# into target/tools on first use) plants one plausible bug at a time in the formats (dmexp,
# minirun-format), the store, the atomic writes, the regular-file guard, pack's check and the
# kernels' reductions, and runs the tests of the crate that owns the code. A mutant the tests
# do not notice ("missed") is a bug that would ship; a mutant that makes them run past the
# timeout is a finding too (a corrupted length looped on instead of refused).
#
# .cargo/mutants.toml lists, one line each with its reason, the mutants no test can catch
# (equivalent code). Any other survivor fails this script.
#
#   bench/mutants.sh                  every scope below (hours on a 2-core machine)
#   bench/mutants.sh --scope dmexp    one scope, by its name in the table (repeatable)
#   bench/mutants.sh --in-diff REV    only mutants on the lines changed since REV (what CI runs)
#   bench/mutants.sh --shard K/N      the K-th of N slices of each scope
#   bench/mutants.sh --jobs N         test N mutants at once (each in its own build folder)
#
# Prints caught / missed / unviable / timeouts per scope and the missed and timed-out mutants;
# exits 1 if any scope has a missed or timed-out mutant. Outcomes stay in
# target/mutants/SCOPE/mutants.out (outcomes.json, missed.txt, caught.txt, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=27.1.0
tools=target/tools

# scope = [label|]package[:file,file,...] (no files: the whole package; no label: the package).
all_scopes=(
  "dmexp"
  "minirun-format"
  "minirun-store"
  "atomic-file"
  "regular-file"
  "minirun-pack-check|minirun-pack:crates/minirun-pack/src/check.rs"
  "minirun-kernels-reductions|minirun-kernels:crates/minirun-kernels/src/row.rs,crates/minirun-kernels/src/int8_fold.rs"
)

scopes=()
in_diff=""
shard=""
jobs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --scope) scopes+=("$2"); shift 2 ;;
    --in-diff) in_diff="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
if [ ${#scopes[@]} -eq 0 ]; then
  scopes=("${all_scopes[@]}")
else
  for i in "${!scopes[@]}"; do
    for full in "${all_scopes[@]}"; do
      case "$full" in
        "${scopes[$i]}|"*|"${scopes[$i]}:"*|"${scopes[$i]}") scopes[$i]="$full" ;;
      esac
    done
  done
fi

# The paths a scope mutates.
scope_paths() {
  local spec="${1#*|}"
  local package="${spec%%:*}" files=""
  [[ "$spec" == *:* ]] && files="${spec#*:}"
  if [ -n "$files" ]; then
    tr ',' '\n' <<<"$files"
  else
    echo "crates/$package/src"
  fi
}

# With --in-diff and no scope touched there is nothing to mutate: the tool is not even installed.
touched=1
if [ -n "$in_diff" ]; then
  touched=0
  for scope in "${scopes[@]}"; do
    mapfile -t paths < <(scope_paths "$scope")
    git diff --quiet "$in_diff" -- "${paths[@]}" || touched=1
  done
fi
if [ "$touched" = 1 ] \
    && ! "$tools/bin/cargo-mutants" mutants --version 2>/dev/null | grep -qx "cargo-mutants $VERSION"; then
  echo "installing cargo-mutants $VERSION into $tools (a few minutes, once)" >&2
  cargo install --quiet cargo-mutants --version "$VERSION" --locked --root "$tools"
fi
export PATH="$PWD/$tools/bin:$PATH"

count() {
  if [ -f "$1" ]; then grep -c . "$1" || true; else echo 0; fi
}

failed=0
rows=()
for scope in "${scopes[@]}"; do
  spec="${scope#*|}"
  package="${spec%%:*}"
  name="${scope%%|*}"
  name="${name%%:*}"
  out="target/mutants/$name"
  rm -rf "$out" && mkdir -p "$out"
  args=(--package "$package" --output "$out" --jobs "$jobs" --no-shuffle --colors never)
  while read -r path; do
    [[ "$path" == *.rs ]] && args+=(--file "$path")
  done < <(scope_paths "$scope")
  [ -n "$shard" ] && args+=(--shard "$shard")
  if [ -n "$in_diff" ]; then
    mapfile -t paths < <(scope_paths "$scope")
    git diff -U0 "$in_diff" -- "${paths[@]}" >"$out/changes.diff"
    if [ ! -s "$out/changes.diff" ]; then
      rows+=("$(printf '%-34s %s' "$name" "no changed lines")")
      continue
    fi
    args+=(--in-diff "$out/changes.diff")
    listed=$(cargo mutants "${args[@]}" --list 2>/dev/null | grep -c . || true)
    if [ "$listed" = 0 ]; then
      rows+=("$(printf '%-34s %s' "$name" "changed lines, no mutants on them")")
      continue
    fi
  fi
  echo "== $name: cargo mutants ${args[*]}" >&2
  status=0
  cargo mutants "${args[@]}" >"$out/run.log" 2>&1 || status=$?
  results="$out/mutants.out"
  # 0: all caught; 2: some missed; 3: some timed out. Anything else is a run that did not finish.
  if [ "$status" != 0 ] && [ "$status" != 2 ] && [ "$status" != 3 ]; then
    echo "cargo mutants did not finish on $name (exit $status); its log: $out/run.log" >&2
    tail -20 "$out/run.log" >&2
    failed=1
    continue
  fi
  caught=$(count "$results/caught.txt")
  missed=$(count "$results/missed.txt")
  unviable=$(count "$results/unviable.txt")
  timeouts=$(count "$results/timeout.txt")
  rows+=("$(printf '%-34s %7s %7s %9s %9s' "$name" "$caught" "$missed" "$unviable" "$timeouts")")
  if [ "$missed" != 0 ] || [ "$timeouts" != 0 ]; then
    failed=1
    cat "$results/missed.txt" "$results/timeout.txt" 2>/dev/null | sed "s/^/  survivor: /" >&2
  fi
done

echo
echo "cargo-mutants $VERSION on $(lscpu | sed -n 's/^Model name: *//p' | head -1)${in_diff:+, lines changed since $in_diff}"
printf '%-34s %7s %7s %9s %9s\n' scope caught missed unviable timeouts
printf '%s\n' "${rows[@]}"
exit "$failed"
