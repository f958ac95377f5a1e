"""Rendering tests need Debian's chromium and the playwright package: `needs_chromium`
skips them, saying which is missing, where they are not installed (.ci/run installs
both). `js_site_host` is where the tests' sites listen: 127.0.0.2, a loopback address the
consumers' SSRF guard lets through by `ALLOW` alone, so 127.0.0.1 stays refused (the
canaries listen there)."""

from __future__ import annotations

import importlib.util
import ipaddress
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HAS_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
#: The tests' sites' address, and the network a consumer's --allow-network lets through.
SITE_HOST = "127.0.0.2"
ALLOW = ipaddress.ip_network("127.0.0.2/32")
#: Another origin the guard lets through (cross-origin requests of a page).
OTHER_HOST = "127.0.0.3"
ALLOW_OTHER = ipaddress.ip_network("127.0.0.3/32")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or not HAS_PLAYWRIGHT,
    reason="rendering needs Debian's chromium (apt-get install chromium) and the playwright "
           "package (pip install -e '.[browser]'); .ci/run installs both"
           + (": chromium is missing" if CHROMIUM is None else "")
           + (": playwright is missing" if not HAS_PLAYWRIGHT else ""))
