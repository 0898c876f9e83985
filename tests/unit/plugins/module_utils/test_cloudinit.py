"""The NoCloud seed: user-data byte for byte, meta-data, vendor-data and the ISO itself.

ISOs are read back with pycdlib through all three directory trees (Rock Ridge,
Joliet, plain ISO 9660) and once with blkid, an independent reader.
"""

from __future__ import annotations

import base64
import email
import gzip
import io
import subprocess
from email.message import Message
from pathlib import Path

import pycdlib
import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils import cloudinit
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.guest_agent_script import (
    GUEST_AGENT_SCRIPT,
)

META_DATA = b'instance-id: "vm-0123456789ab"\nlocal-hostname: "vm"\n'

CLOUD_CONFIG = b"#cloud-config\npackages: [squid]\nruncmd:\n  - [systemctl, restart, squid]\nport: 0755\n"
JINJA = b"## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\nfqdn: {{ v1.local_hostname }}.example\n"
MIME = (
    b'Content-Type: multipart/mixed; boundary="XX"\r\n'
    b"MIME-Version: 1.0\r\n\r\n"
    b"--XX\r\nContent-Type: text/cloud-config\r\n\r\n#cloud-config\r\npackages: [squid]\r\n"
    b"--XX\r\nContent-Type: text/x-shellscript\r\n\r\n#!/bin/sh\r\necho hi\r\n--XX--\r\n"
)
SCRIPT = b"#!/bin/bash\nset -eu\necho '\xc3\xbcber' > /tmp/x\n\tprintf '%s\\n' \"$HOSTNAME\"\n"
# gzip user-data arrives base64-encoded in the Proxy and must reach the seed as the raw gzip.
GZIP = cloudinit.decode_user_data(base64.b64encode(gzip.compress(CLOUD_CONFIG, mtime=0)).decode("ascii"), "base64")

USER_DATA = {
    "cloud-config": CLOUD_CONFIG,
    "jinja": JINJA,
    "mime": MIME,
    "gzip": GZIP,
    "script": SCRIPT,
    "empty": b"",
}


def open_iso(image: bytes) -> pycdlib.PyCdlib:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    return iso


def read(iso: pycdlib.PyCdlib, **path: str) -> bytes:
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, **path)
    return out.getvalue()


def rock_ridge_names(iso: pycdlib.PyCdlib) -> set[str]:
    names = set()
    for record in iso.list_children(rr_path="/"):
        if record.is_dot() or record.is_dotdot():
            continue
        names.add(record.rock_ridge.name().decode("utf-8"))
    return names


def mime_parts(document: bytes) -> list[Message]:
    message = email.message_from_bytes(document)
    assert message.is_multipart()
    return [part for part in message.walk() if not part.is_multipart()]


def payload(part: Message) -> bytes:
    data = part.get_payload(decode=True)
    assert isinstance(data, bytes)
    return data


class TestSeedIso:
    @pytest.mark.parametrize("kind", sorted(USER_DATA))
    def test_user_data_reaches_the_seed_byte_for_byte(self, kind: str) -> None:
        user_data = USER_DATA[kind]
        iso = open_iso(cloudinit.build_seed_iso(user_data, META_DATA, cloudinit.build_vendor_data(None, True)))
        try:
            assert read(iso, rr_path="/user-data") == user_data
            assert read(iso, joliet_path="/user-data") == user_data
            assert read(iso, iso_path="/USER_DATA.;1") == user_data
            assert read(iso, rr_path="/meta-data") == META_DATA
        finally:
            iso.close()

    def test_gzip_input_is_really_binary(self) -> None:
        # Guards the gzip case above against turning into a text case.
        assert GZIP.startswith(b"\x1f\x8b")
        assert gzip.decompress(GZIP) == CLOUD_CONFIG

    def test_volume_is_cidata_with_rock_ridge_and_joliet(self) -> None:
        iso = open_iso(cloudinit.build_seed_iso(CLOUD_CONFIG, META_DATA, None))
        try:
            assert iso.pvd.volume_identifier.rstrip(b" ") == b"cidata"
            assert iso.has_rock_ridge()
            assert iso.rock_ridge == "1.09"
            assert iso.has_joliet()
        finally:
            iso.close()

    def test_blkid_sees_an_iso9660_labelled_cidata(self, tmp_path: Path) -> None:
        # cloud-init's NoCloud finds its seed through blkid by LABEL=cidata.
        image = tmp_path / "seed.iso"
        image.write_bytes(cloudinit.build_seed_iso(CLOUD_CONFIG, META_DATA, None))
        probe = subprocess.run(["blkid", "-p", "-o", "export", str(image)], capture_output=True, text=True, check=True)
        fields = dict(line.split("=", 1) for line in probe.stdout.splitlines() if "=" in line)
        assert fields["TYPE"] == "iso9660"
        assert fields["LABEL"] == "cidata"

    def test_vendor_data_is_the_guest_agent_script_by_default(self) -> None:
        vendor_data = cloudinit.build_vendor_data(None, True)
        iso = open_iso(cloudinit.build_seed_iso(CLOUD_CONFIG, META_DATA, vendor_data))
        try:
            assert rock_ridge_names(iso) == {"user-data", "meta-data", "vendor-data"}
            assert read(iso, rr_path="/vendor-data") == GUEST_AGENT_SCRIPT
            assert read(iso, joliet_path="/vendor-data") == GUEST_AGENT_SCRIPT
        finally:
            iso.close()

    def test_opt_out_without_operator_document_has_no_vendor_data(self) -> None:
        assert cloudinit.build_vendor_data("", False) is None
        vendor_data = cloudinit.build_vendor_data(None, False)
        assert vendor_data is None
        iso = open_iso(cloudinit.build_seed_iso(CLOUD_CONFIG, META_DATA, vendor_data))
        try:
            assert rock_ridge_names(iso) == {"user-data", "meta-data"}
        finally:
            iso.close()


class TestVendorData:
    def test_script_only(self) -> None:
        assert cloudinit.build_vendor_data(None, True) == GUEST_AGENT_SCRIPT
        assert cloudinit.build_vendor_data("", True) == GUEST_AGENT_SCRIPT

    @pytest.mark.parametrize("document", ["#cloud-config\nntp: {enabled: true}\n", b"#!/bin/sh\r\necho \xff\r\n"])
    def test_operator_document_only_is_unchanged(self, document: str | bytes) -> None:
        expected = document.encode("utf-8") if isinstance(document, str) else document
        assert cloudinit.build_vendor_data(document, False) == expected

    def test_both_make_a_multipart_led_by_mime_version(self) -> None:
        operator = "#cloud-config\npackages: [htop]\ntimezone: Europe/Berlin\n"
        document = cloudinit.build_vendor_data(operator, True)
        assert document is not None
        assert document.split(b"\n", 1)[0] == b"MIME-Version: 1.0"
        operator_part, script_part = mime_parts(document)
        assert operator_part.get_content_type() == "text/cloud-config"
        assert payload(operator_part) == operator.encode("utf-8")
        assert script_part.get_content_type() == "text/x-shellscript"
        assert script_part.get_filename() == "install-qemu-guest-agent.sh"
        assert payload(script_part) == GUEST_AGENT_SCRIPT

    @pytest.mark.parametrize(
        ("document", "content_type"),
        [
            (b"#!/usr/bin/env python3\nprint(1)\n", "text/x-shellscript"),
            (b"## template: jinja\n#cloud-config\nfqdn: {{ v1.local_hostname }}\n", "text/jinja2"),
            (b"#include\nhttps://config.invalid/a\n", "text/x-include-url"),
            (b"#include-once\nhttps://config.invalid/a\n", "text/x-include-once-url"),
            (b"#cloud-config-archive\n- type: text/cloud-config\n", "text/cloud-config-archive"),
            (b"#cloud-boothook\n#!/bin/sh\n", "text/cloud-boothook"),
            (b"\n  #Cloud-Config\nntp: {}\n", "text/cloud-config"),
            (gzip.compress(b"#cloud-config\n{}\n"), "application/x-gzip"),
            # Not a format cloud-init knows: text/plain lets cloud-init sniff it as it would alone.
            (b"hello\n", "text/plain"),
        ],
    )
    def test_operator_part_is_typed_by_its_first_line(self, document: bytes, content_type: str) -> None:
        combined = cloudinit.build_vendor_data(document, True)
        assert combined is not None
        operator_part, _ = mime_parts(combined)
        assert operator_part.get_content_type() == content_type
        assert payload(operator_part) == document

    def test_operator_mime_document_is_nested_whole(self) -> None:
        operator = (
            b"MIME-Version: 1.0\n"
            b'Content-Type: multipart/mixed; boundary="op"\n\n'
            b"--op\nContent-Type: text/cloud-config\n\n#cloud-config\nntp: {enabled: true}\n"
            b'--op\nContent-Type: text/x-shellscript\nContent-Disposition: attachment; filename="site.sh"\n\n'
            b"#!/bin/sh\necho site\n--op--\n"
        )
        combined = cloudinit.build_vendor_data(operator, True)
        assert combined is not None
        assert combined.split(b"\n", 1)[0] == b"MIME-Version: 1.0"
        *nested, agent = mime_parts(combined)
        # cloud-init sees the operator's parts exactly as it would in the document alone.
        alone = mime_parts(operator)
        assert [(p.get_content_type(), p.get_filename(), payload(p)) for p in nested] == [
            (p.get_content_type(), p.get_filename(), payload(p)) for p in alone
        ]
        assert [p.get_content_type() for p in nested] == ["text/cloud-config", "text/x-shellscript"]
        assert (agent.get_filename(), payload(agent)) == ("install-qemu-guest-agent.sh", GUEST_AGENT_SCRIPT)


class TestMetaData:
    def test_meta_data_is_yaml_with_instance_id_and_hostname(self) -> None:
        assert yaml.safe_load(cloudinit.build_meta_data("vm-1-0a1b2c", "vm-1")) == {
            "instance-id": "vm-1-0a1b2c",
            "local-hostname": "vm-1",
        }

    def test_values_cannot_change_the_structure_or_type(self) -> None:
        for value in ("a: b\nc: d", "yes", "0755", "# comment", '"quoted"'):
            assert yaml.safe_load(cloudinit.build_meta_data(value, value)) == {
                "instance-id": value,
                "local-hostname": value,
            }

    def test_instance_ids_are_unique_per_creation(self) -> None:
        ids = {cloudinit.new_instance_id("crawlers-eu-1") for _ in range(1000)}
        assert len(ids) == 1000
        assert all(instance_id.startswith("crawlers-eu-1-") for instance_id in ids)


class TestDecodeUserData:
    def test_plain_is_utf8_byte_for_byte(self) -> None:
        text = '#cloud-config\r\nwrite_files: [{path: /x, content: "\u00fc\u2603"}]\n'
        assert cloudinit.decode_user_data(text, "plain") == text.encode("utf-8")

    def test_base64_tolerates_line_wrapping(self) -> None:
        raw = bytes(range(256)) * 3
        wrapped = "\n".join(base64.b64encode(raw).decode("ascii")[i : i + 76] for i in range(0, 1024, 76))
        assert cloudinit.decode_user_data(wrapped + "\n", "base64") == raw

    @pytest.mark.parametrize("value", ["not base64!", "I2Nsb3VkLWNvbmZpZwo", "I2Nsb3Vk_WNvbmZpZwo="])
    def test_invalid_base64_is_permanent_and_names_the_field(self, value: str) -> None:
        with pytest.raises(Permanent, match=r"^user_data: not valid base64") as caught:
            cloudinit.decode_user_data(value, "base64")
        assert caught.value.error_class == "permanent"

    @pytest.mark.parametrize("encoding", ["plain", "base64"])
    def test_over_the_limit_is_permanent_and_names_the_field(self, encoding: str) -> None:
        raw = b"#" * (cloudinit.USER_DATA_LIMIT + 1)
        value = raw.decode("ascii") if encoding == "plain" else base64.b64encode(raw).decode("ascii")
        with pytest.raises(Permanent, match=r"^user_data: 65537 bytes decoded, over the limit of 65536"):
            cloudinit.decode_user_data(value, encoding)

    def test_exactly_the_limit_is_accepted(self) -> None:
        raw = b"#" * cloudinit.USER_DATA_LIMIT
        assert cloudinit.decode_user_data(base64.b64encode(raw).decode("ascii"), "base64") == raw

    def test_unknown_encoding_names_the_encoding_field(self) -> None:
        with pytest.raises(Permanent, match=r"^user_data_encoding: must be one of plain, base64, got 'gzip'"):
            cloudinit.decode_user_data("x", "gzip")

    def test_unencodable_plain_text_is_permanent(self) -> None:
        with pytest.raises(Permanent, match=r"^user_data: not encodable as UTF-8"):
            cloudinit.decode_user_data("\udcff", "plain")
