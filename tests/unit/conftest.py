"""Make the collection importable as ``ansible_collections.crawl.egress_proxies``.

pytest's ``pythonpath`` setting normally does this, but the unit tests are also run from
other working directories and by tools that skip pyproject.toml; the collection tree is
the ``.venv/collections`` symlink that scripts/setup.sh makes in the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

# tests/unit/conftest.py -> the repository root, through any symlink the file was reached by.
REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS_ROOT = REPO_ROOT / ".venv" / "collections"

try:
    import ansible_collections.crawl.egress_proxies  # noqa: F401 - only probing importability
except ImportError:
    sys.path.insert(0, str(COLLECTIONS_ROOT))
