# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a KVM instance's NoCloud seed carries: user-data, meta-data, vendor-data.

The user's document is never edited: merging anything into it (the guest agent's package,
say) means parsing it as cloud-config, which breaks every other format (Jinja, MIME, gzip,
a script), and re-serialising YAML changes the type of unquoted scalars. It reaches the
seed byte for byte, whatever its format. The guest agent bootstrap travels separately, as
vendor-data, which cloud-init runs through its own handler chain.

Importable without Ansible: only the standard library, the collection's errors
module and (guarded) pycdlib for the ISO.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import uuid
from email import encoders, message_from_bytes
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart

try:
    import pycdlib
except ImportError:  # pragma: no cover - modules report it through missing_required_lib
    HAS_PYCDLIB = False
else:
    HAS_PYCDLIB = True

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.guest_agent_script import (
    GUEST_AGENT_SCRIPT,
)

# Largest user-data accepted, decoded; why 64 KiB: see decode_user_data.
USER_DATA_LIMIT = 65536

USER_DATA_ENCODINGS = ("plain", "base64")

SEED_VOLUME_ID = "cidata"
GUEST_AGENT_SCRIPT_NAME = "install-qemu-guest-agent.sh"
ACCESS_BOOTHOOK_NAME = "egress-proxies-access.sh"

# cloud-init recognises a MIME document by this header in its first 4096 bytes.
_MIME_MARKER = b"mime-version:"
_MIME_SNIFF_BYTES = 4096
_GZIP_MAGIC = b"\x1f\x8b"

# The first-line prefixes cloud-init itself maps to handlers (its
# handlers.INCLUSION_TYPES_MAP), matched the way it matches them: after leading
# whitespace, case-insensitively, longest prefix first.
_PREFIX_TYPES = sorted(
    (
        ("#include", "text/x-include-url"),
        ("#include-once", "text/x-include-once-url"),
        ("#!", "text/x-shellscript"),
        ("#cloud-config", "text/cloud-config"),
        ("#part-handler", "text/part-handler"),
        ("#cloud-boothook", "text/cloud-boothook"),
        ("#cloud-config-archive", "text/cloud-config-archive"),
        ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
        ("## template: jinja", "text/jinja2"),
    ),
    key=lambda entry: -len(entry[0]),
)
# A part of this type makes cloud-init sniff the payload's first line itself,
# so a document we do not recognise is treated exactly as it would be on its
# own (cloud-init logs "Unhandled ..." and skips it).
_SNIFFED_TYPE = "text/plain"
_GZIP_TYPE = "application/x-gzip"

# (ISO 9660 name, Rock Ridge and Joliet name). cloud-init mounts the seed, and
# Linux reads the Rock Ridge names; Joliet serves readers without Rock Ridge;
# the ISO 9660 names only need to be valid (level 3: uppercase, "_" for "-").
_SEED_FILES = (
    ("/USER_DATA.;1", "user-data"),
    ("/META_DATA.;1", "meta-data"),
    ("/VENDOR_DATA.;1", "vendor-data"),
)


def decode_user_data(value: str, encoding: str, limit: int = USER_DATA_LIMIT) -> bytes:
    """The raw user-data bytes for the module options ``user_data`` and ``user_data_encoding``.

    ``plain`` is the string encoded as UTF-8, byte for byte. ``base64`` is for
    binary user-data such as gzip; its decoding is strict about the alphabet
    and the padding, but ignores ASCII whitespace, because YAML block scalars
    and ``base64`` (which wraps at 76 columns) put line breaks in the value.

    The decoded size is capped at ``limit`` (``USER_DATA_LIMIT``, 64 KiB). GCP
    metadata values cap at 256 KiB, cloud-init's NoCloud has no cap, and a
    Kubernetes object caps at about 1 MiB all told: the Proxy's
    ``spec.cloudInit`` (a third larger as base64) shares that with the rest of
    the spec, the status and kubectl's last-applied-configuration annotation,
    which repeats the spec. 64 KiB keeps the CRD, the annotations and every
    backend comfortably inside their limits, whichever provider the Proxy uses.

    Every failure is ``Permanent`` and names the option at fault.
    """
    if encoding == "plain":
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise Permanent("user_data: not encodable as UTF-8: %s" % error) from error
    elif encoding == "base64":
        compact = "".join(value.split())
        try:
            data = base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError) as error:
            raise Permanent("user_data: not valid base64 (user_data_encoding=base64): %s" % error) from error
    else:
        raise Permanent("user_data_encoding: must be one of %s, got %r" % (", ".join(USER_DATA_ENCODINGS), encoding))
    if len(data) > limit:
        raise Permanent("user_data: %d bytes decoded, over the limit of %d bytes" % (len(data), limit))
    return data


def new_instance_id(name: str) -> str:
    """A fresh NoCloud ``instance-id`` for one creation of instance ``name``.

    cloud-init runs its per-instance work (user-data, vendor-data, SSH host
    keys) only when the instance-id differs from the one cached on the disk, so
    an id that repeats would make a disk that has booted before (an image built
    from a booted instance, a reused volume) silently skip the user's document.
    A random suffix makes every creation new, and still names the instance in
    the guest's logs.
    """
    return "%s-%s" % (name, uuid.uuid4().hex[:12])


def build_meta_data(instance_id: str, hostname: str) -> bytes:
    """The NoCloud ``meta-data`` document.

    Values are written as JSON strings, which are valid YAML double-quoted
    scalars, so no value can change the document's structure or type.
    """
    return ("instance-id: %s\nlocal-hostname: %s\n" % (json.dumps(instance_id), json.dumps(hostname))).encode("utf-8")


def build_vendor_data(operator_vendor_data: str | bytes | None, install_guest_agent: bool,
                      access_boothook: bytes | None = None) -> bytes | None:
    """The NoCloud ``vendor-data`` document, or None when there is nothing to send.

    - only the guest agent: the bootstrap script itself;
    - only the operator's document (``installGuestAgent: false``): that
      document, byte for byte;
    - only the access policy (``squid_access.boothook``): that boothook;
    - more than one: a MIME multipart whose first line is ``MIME-Version: 1.0``, with the
      operator's document as the first part, then the script as a
      ``text/x-shellscript`` part named ``install-qemu-guest-agent.sh``, then the
      access policy as a ``text/cloud-boothook`` part named ``egress-proxies-access.sh``
      (a boothook runs in the init stage, before the final stage installs packages and
      runs vendor scripts, whatever its place in the archive).

    An empty operator document counts as none.
    """
    operator = _as_bytes(operator_vendor_data) or None
    parts = [(document, content_type, filename) for document, content_type, filename in (
        (operator, None, None),
        (GUEST_AGENT_SCRIPT if install_guest_agent else None, "text/x-shellscript", GUEST_AGENT_SCRIPT_NAME),
        (access_boothook, "text/cloud-boothook", ACCESS_BOOTHOOK_NAME),
    ) if document]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0][0]
    archive = MIMEMultipart()
    # MIMEMultipart writes Content-Type first; cloud-init only looks for
    # "mime-version:" in the first 4096 bytes, so the header is made to lead
    # where no long boundary or parameters can ever push it out.
    content_type = archive["Content-Type"]
    del archive["Content-Type"]
    archive["Content-Type"] = content_type
    for document, content_type, filename in parts:
        archive.attach(_operator_part(document) if content_type is None
                       else _binary_part(document, content_type, filename))
    return archive.as_bytes()


def build_seed_iso(user_data: bytes, meta_data: bytes, vendor_data: bytes | None) -> bytes:
    """A NoCloud seed: ISO 9660 labelled ``cidata`` with Rock Ridge 1.09 and Joliet.

    The files hold exactly the given bytes (pycdlib copies them unchanged: no
    newline conversion, no re-encoding); ``vendor-data`` only when given.
    """
    if not HAS_PYCDLIB:
        raise Permanent("the pycdlib Python library is required on the host running the module to build the seed ISO")
    contents = (user_data, meta_data, vendor_data)
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=SEED_VOLUME_ID, rock_ridge="1.09", joliet=3)
    try:
        for (iso_path, name), data in zip(_SEED_FILES, contents):
            if data is None:
                continue
            iso.add_fp(io.BytesIO(data), len(data), iso_path=iso_path, rr_name=name, joliet_path="/" + name)
        image = io.BytesIO()
        iso.write_fp(image)
    finally:
        iso.close()
    return image.getvalue()


def _as_bytes(document: str | bytes | None) -> bytes | None:
    if document is None or isinstance(document, bytes):
        return document
    return document.encode("utf-8")


def _operator_part(document: bytes) -> Message:
    """The operator's document as one part, typed as cloud-init would type it alone.

    A MIME document (cloud-init's own test: ``mime-version:`` in the first 4096
    bytes) is kept as it is, nested as a sub-message: cloud-init walks nested
    multiparts, so its parts are handled as if it had come alone. Anything else
    becomes a part whose type follows its first line.
    """
    if _MIME_MARKER in document[:_MIME_SNIFF_BYTES].lower():
        return message_from_bytes(document)
    return _binary_part(document, _content_type_of(document), None)


def _content_type_of(document: bytes) -> str:
    if document.startswith(_GZIP_MAGIC):
        # cloud-init decompresses a gzip part and then types what it finds.
        return _GZIP_TYPE
    start = document.lstrip()[:32].lower()
    for prefix, content_type in _PREFIX_TYPES:
        if start.startswith(prefix.encode("ascii")):
            return content_type
    return _SNIFFED_TYPE


def _binary_part(data: bytes, content_type: str, filename: str | None) -> Message:
    """A part carrying ``data`` exactly: base64 transfer encoding keeps every byte.

    cloud-init undoes the transfer encoding before handing a part to its
    handler, so line endings and non-UTF-8 bytes arrive unchanged.
    """
    maintype, subtype = content_type.split("/", 1)
    part = MIMENonMultipart(maintype, subtype)
    part.set_payload(data)
    encoders.encode_base64(part)
    if filename is not None:
        part.add_header("Content-Disposition", "attachment", filename=filename)
    return part
