"""URLs: `canonical` (the canonical form the crawl dedups by, fingerprints, registrable
domains), `shape` (a URL's shape: what stays the same between a page's variants) and
`redact` (a URL as logs and errors show it, its credentials left out).
"""

from common.urls.canonical import Rejection, canonical_domain, canonicalize, fingerprint
from common.urls.redact import redact_url
from common.urls.shape import (
    common_directory,
    directory,
    is_token,
    is_variant,
    masked,
    shape,
    shape_tag,
    url_words,
)

__all__ = ["Rejection", "canonical_domain", "canonicalize", "common_directory", "directory",
           "fingerprint", "is_token", "is_variant", "masked", "redact_url", "shape",
           "shape_tag", "url_words"]
