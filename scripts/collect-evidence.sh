#!/usr/bin/env bash
# Gather the evidence a scheduled `stemcell-gallery cleanup` needs, then (with --exec) run it:
#
#   collect-evidence.sh --out DIR [--director ALIAS]... [--state FILE]... [--exec -- COMMAND...]
#
# For each director (a bosh-cli environment alias, `bosh alias-env`), `bosh -e ALIAS --json
# stemcells` is written to DIR/director-ALIAS.json; each create-env state file (bosh-state.json)
# is copied to DIR/create-env-<its path, / as _>.json. DIRECTORS and CREATE_ENV_STATES in the
# environment (whitespace-separated; the systemd unit's EnvironmentFile sets them) add to the
# flags. With --exec, COMMAND runs with `--director-stemcells` and `--create-env-state` followed
# by those files (each flag only when it has files), so a unit passes any number of them.
#
# bosh-cli is $BOSH, else `bosh` on PATH; it reads its aliases from BOSH_CONFIG (default
# ~/.bosh/config) and logs in as BOSH_CLIENT with a secret read from, in order:
# $CREDENTIALS_DIRECTORY/bosh_ALIAS (systemd `LoadCredential=bosh:DIR` of a directory holding one
# file per alias), $CREDENTIALS_DIRECTORY/bosh-client-secret, else BOSH_CLIENT_SECRET as set.
# No secret is ever printed.
#
# Exit status: 0 collected (or COMMAND's own status with --exec); 2 bad usage; 5 an evidence
# source could not be read: nothing is run and DIR keeps no file from this or an earlier run,
# like `cleanup` itself (exit 5: "cleanup refused, nothing was deleted").
set -euo pipefail

usage() {
  echo "usage: $0 --out DIR [--director ALIAS]... [--state FILE]... [--exec -- COMMAND...]" >&2
  exit 2
}
refuse() {
  echo "evidence not collected, nothing was run: $*" >&2
  exit 5
}

out=""
directors=()
states=()
command=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --director) [ $# -ge 2 ] || usage; directors+=("$2"); shift 2 ;;
    --state) [ $# -ge 2 ] || usage; states+=("$2"); shift 2 ;;
    --exec) shift; [ "${1:-}" = "--" ] && shift; [ $# -ge 1 ] || usage; command=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$out" ] || usage
# Whitespace-separated lists from the environment (word splitting intended, globbing not).
set -f
# shellcheck disable=SC2206
directors+=(${DIRECTORS:-})
# shellcheck disable=SC2206
states+=(${CREATE_ENV_STATES:-})
set +f
if [ ${#directors[@]} -eq 0 ] && [ ${#states[@]} -eq 0 ]; then
  echo "no evidence source: give --director ALIAS or --state FILE (or DIRECTORS / CREATE_ENV_STATES)" >&2
  exit 2
fi
for alias in "${directors[@]}"; do
  [[ "$alias" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || { echo "director alias ${alias@Q} is not a bosh-cli alias name (letters, digits, . _ -)" >&2; exit 2; }
done

bosh=""
if [ ${#directors[@]} -gt 0 ]; then
  bosh="${BOSH:-$(command -v bosh || true)}"
  [ -n "$bosh" ] && [ -x "$bosh" ] || { echo "bosh-cli not found: set BOSH=/path/to/bosh or put bosh on PATH" >&2; exit 2; }
fi

mkdir -p "$out"
# Nothing from an earlier run may pass for today's evidence.
rm -f "$out"/director-*.json "$out"/create-env-*.json
work="$(mktemp -d "$out/.collect.XXXXXX")"
trap 'rm -rf "$work"' EXIT

director_files=()
for alias in "${directors[@]}"; do
  secret_env=()
  if [ -n "${CREDENTIALS_DIRECTORY:-}" ] && [ -r "$CREDENTIALS_DIRECTORY/bosh_$alias" ]; then
    secret_env=(BOSH_CLIENT_SECRET="$(cat "$CREDENTIALS_DIRECTORY/bosh_$alias")")
  elif [ -n "${CREDENTIALS_DIRECTORY:-}" ] && [ -r "$CREDENTIALS_DIRECTORY/bosh-client-secret" ]; then
    secret_env=(BOSH_CLIENT_SECRET="$(cat "$CREDENTIALS_DIRECTORY/bosh-client-secret")")
  fi
  file="$work/director-$alias.json"
  if ! env "${secret_env[@]}" "$bosh" -e "$alias" --json --non-interactive stemcells >"$file" 2>"$work/stderr"; then
    # bosh-cli's own message names the problem (unknown alias, login, TLS); it holds no secret.
    refuse "bosh -e $alias stemcells failed: $(cat "$work/stderr" "$file" | tr '\n' ' ' | cut -c1-400)"
  fi
  grep -q '"Tables"' "$file" || refuse "bosh -e $alias stemcells --json printed no stemcell table"
  director_files+=("director-$alias.json")
done

state_files=()
for state in "${states[@]}"; do
  [ -r "$state" ] && [ -s "$state" ] || refuse "create-env state $state cannot be read (or is empty)"
  name="create-env-$(printf '%s' "${state#/}" | tr -c 'A-Za-z0-9._-' '_')"
  name="${name%.json}.json"
  for seen in "${state_files[@]}"; do
    [ "$seen" != "$name" ] || refuse "two create-env states map to $name: give each its own path"
  done
  cp "$state" "$work/$name"
  state_files+=("$name")
done

args=()
if [ ${#director_files[@]} -gt 0 ]; then
  args+=(--director-stemcells)
  for f in "${director_files[@]}"; do mv "$work/$f" "$out/$f"; args+=("$out/$f"); done
fi
if [ ${#state_files[@]} -gt 0 ]; then
  args+=(--create-env-state)
  for f in "${state_files[@]}"; do mv "$work/$f" "$out/$f"; args+=("$out/$f"); done
fi
echo "collected ${#director_files[@]} director list(s) and ${#state_files[@]} create-env state(s) into $out" >&2

if [ ${#command[@]} -gt 0 ]; then
  rm -rf "$work"
  trap - EXIT
  exec "${command[@]}" "${args[@]}"
fi
