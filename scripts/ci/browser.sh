#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver (Debian's `chromium` and
# `chromium-driver`: /usr/bin/chromium, /usr/bin/chromedriver) for the chat
# page's browser test (engine/tests/chat_page.rs), once; does nothing when
# they are there. Called by scripts/test.sh.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "minisgl setup: chromium and chromedriver not found and apt-get unavailable: the chat page test will skip (outside CI) or fail (in CI)" >&2
  exit 0
fi
echo "minisgl setup: installing chromium and chromium-driver with apt-get (the chat page test)" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
