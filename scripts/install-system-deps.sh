#!/usr/bin/env bash
# Debian packages the test suite runs for real: a PostgreSQL server (the production store),
# Chromium (the plan view's browser test) and curl (the docs' commands). Installs only what
# is missing; a no-op on a machine that has them all.
set -euo pipefail
need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || need+=(postgresql)
command -v chromium > /dev/null || need+=(chromium)
command -v curl > /dev/null || need+=(curl)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo > /dev/null || {
        echo "install the Debian packages ${need[*]} (as root: apt-get install ${need[*]})" >&2
        exit 1
    }
    sudo=(sudo)
fi
echo "installing Debian packages: ${need[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${need[@]}" > /dev/null
