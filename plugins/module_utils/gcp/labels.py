# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How an instance's tags live on a GCE instance: labels for filtering, metadata for the truth.

GCE label keys and values allow only lowercase letters, digits, ``_`` and ``-``, at
most 63 characters (keys must start with a letter), while our tag keys contain ``.``
and ``/`` (``crawl.example.com/owner``) and the ``crawl.example.com/proxy`` value is
``namespace/name``. So the encoding is split in two:

- the metadata item ``egress-proxies-tags`` holds the whole tag dict as JSON (sorted
  keys, compact). It is what every read decodes, so any tag round-trips exactly;
- labels carry only what the API must filter on, under fixed keys:
  ``egress_proxies: v1`` marks the instance as ours (nothing without it is ever
  listed), and ``egress_proxies_owner`` / ``egress_proxies_uid`` /
  ``egress_proxies_spec_hash`` mirror those tags when their values are label-safe.
  The owner must be label-safe (the sweep filters on it server-side); a uid or spec
  hash that is not is simply left out of the labels (the metadata still has it).

Decoding is the reverse: the metadata JSON when present and well-formed, else the
mirrored labels mapped back through the same fixed table (so an instance whose
metadata someone removed by hand still lists under its owner). Label keys use ``_``
rather than ``-`` so that they are plain identifiers in the API's filter syntax.
"""

from __future__ import annotations

import json
import re
from typing import Dict, Mapping, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    SPEC_HASH_TAG,
    UID_TAG,
)

MARKER_LABEL = "egress_proxies"
MARKER_VALUE = "v1"
# Tag -> label key, for the tags worth filtering on. Fixed, so decoding is a table lookup.
MIRRORED_LABELS: Dict[str, str] = {
    OWNER_TAG: "egress_proxies_owner",
    UID_TAG: "egress_proxies_uid",
    SPEC_HASH_TAG: "egress_proxies_spec_hash",
}
TAGS_METADATA_KEY = "egress-proxies-tags"
PORT_METADATA_KEY = "egress-proxies-port"
# The IPv4 sources the instance's firewall opening admits (firewall.py), comma-separated.
SOURCES_METADATA_KEY = "egress-proxies-sources"

# GCE label values: lowercase letters, digits, '_' and '-', at most 63 characters (empty allowed).
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def is_label_value(value: str) -> bool:
    return LABEL_VALUE_RE.fullmatch(value) is not None


def encode_tags(tags: Mapping[str, str]) -> Tuple[Dict[str, str], str]:
    """The labels and the ``egress-proxies-tags`` metadata value for ``tags``."""
    owner = tags.get(OWNER_TAG)
    if owner is not None and not is_label_value(owner):
        raise Permanent(
            "tags.%s: %r cannot be a GCE label value (at most 63 lowercase letters, digits, '_' or '-'); "
            "the sweep filters on it server-side, so use the provider config's owner id" % (OWNER_TAG, owner))
    labels = {MARKER_LABEL: MARKER_VALUE}
    for tag, label in MIRRORED_LABELS.items():
        value = tags.get(tag)
        if value is not None and is_label_value(value):
            labels[label] = value
    return labels, json.dumps(dict(tags), sort_keys=True, separators=(",", ":"))


def decode_tags(labels: Mapping[str, str], metadata: Mapping[str, str]) -> Dict[str, str]:
    """The tags of an instance: its metadata JSON, else what its labels mirror."""
    raw = metadata.get(TAGS_METADATA_KEY)
    if raw is not None:
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in decoded.items()):
            return decoded
    return {tag: labels[label] for tag, label in MIRRORED_LABELS.items() if label in labels}


def is_ours(labels: Mapping[str, str]) -> bool:
    return labels.get(MARKER_LABEL) == MARKER_VALUE


# Every instance this collection made, whatever its owner.
OURS_FILTER = '(labels.%s = "%s")' % (MARKER_LABEL, MARKER_VALUE)


def list_filter(wanted: Mapping[str, str]) -> Optional[str]:
    """The aggregatedList filter for instances that may carry ``wanted``; None if none can.

    Only the marker and the owner are filtered server-side; every other wanted tag is
    checked on the decoded tags. An owner that is not label-safe was refused at create
    time, so no instance can carry it: None tells the caller to skip the call.
    """
    clauses = [OURS_FILTER]
    owner = wanted.get(OWNER_TAG)
    if owner is not None:
        if not is_label_value(owner):
            return None
        clauses.append('(labels.%s = "%s")' % (MIRRORED_LABELS[OWNER_TAG], owner))
    return " ".join(clauses)
